"""The page in a real headless Chromium (Debian's, driven by Playwright): the cold page's example,
run, watch tokens stream, stop, step through, export the trace and import it back; bad links and
bad trace files answered by name; the phone layout. Screenshots land in test-artifacts/."""

import json
import socket
import time

import pytest

from browser_helpers import go_to_step, layout_problems, settle
from conftest import ARTIFACTS

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def tokens_in(page) -> int:
    return page.locator("#tokens .dl-tok").count()


def open_trace_files(page):
    page.locator("#prompt textarea").wait_for()  # the app has hydrated
    if not page.locator("#import input[type=file]").count():
        page.get_by_text("Trace file: export / import").click()
    page.locator("#import input[type=file]").wait_for(state="attached", timeout=30_000)


def test_run_stream_step_export_import(server, page, tmp_path):
    page.goto(server + "?model=SmolLM2-135M-Instruct")  # the real model: realistic streaming
    page.wait_for_function(
        "document.querySelector('#model input')?.value.startsWith('SmolLM2')", timeout=30_000
    )
    page.locator("#prompt textarea").fill("Write a haiku about the sea.")
    clicked = time.perf_counter()
    page.locator("#run-btn").click()
    # Wait for this run's first token: the status says decoding only while this run streams.
    streamed_while_running = page.wait_for_function(
        """() => {
            const n = document.querySelectorAll('#tokens .dl-tok').length;
            return n > 0 && document.querySelector('#status').innerText.includes('decoding') ? n : 0;
        }""",
        timeout=120_000,
    ).json_value()
    first_token_s = time.perf_counter() - clicked
    # The first run of the model in this app: its load is part of the wait (the timing is printed
    # only; speed is measured by `python -m decoders.bench`).
    print(f"\nfirst streamed token visible {first_token_s:.2f} s after clicking Run (model cold)")
    page.get_by_text("✅ Done").wait_for(timeout=120_000)
    streaming_s = time.perf_counter() - clicked - first_token_s
    total = tokens_in(page)
    print(f"tokens streamed into the page: {(total - 1) / streaming_s:.1f} tok/s after the first")
    assert 0 < streamed_while_running < total <= 64  # tokens arrived before the end
    page.screenshot(path=str(ARTIFACTS / "run.png"), full_page=True)

    # Step back: the future turns grey, the step's token is underlined.
    step_js = "+document.querySelector('#step input[type=number]').value"
    # The finished run opens at its showcase step: the last one with drafts accepted (its
    # method panel has something to show), said in the status.
    showcase = "(e => e.max !== '' && +e.value > 3 && +e.value <= +e.max)(document.querySelector('#step input[type=range]'))"
    page.wait_for_function(showcase, timeout=30_000)
    assert "the last with drafts accepted" in page.locator("#status").inner_text() or page.evaluate(
        "(e => +e.value === +e.max)(document.querySelector('#step input[type=range]'))"
    )
    last = page.evaluate(step_js)
    for k in range(1, 4):  # one click at a time: each reads the step the previous one set
        page.locator("#prev").click()
        page.wait_for_function(f"{step_js} === {last - k}", timeout=30_000)
    page.wait_for_function(
        "document.querySelectorAll('#tokens .dl-pending').length >= 3", timeout=30_000
    )
    # The step's tokens (one or several: the default method drafts) are underlined, no others.
    page.wait_for_function(
        """s => {
            const now = [...document.querySelectorAll('#tokens .dl-now')];
            const at = document.querySelectorAll(`#tokens .dl-tok[data-step='${s}']`);
            return now.length >= 1 && now.length === at.length
                && now.every(e => e.dataset.step === String(s));
        }""",
        arg=last - 3,
        timeout=30_000,
    )
    page.screenshot(path=str(ARTIFACTS / "step.png"), full_page=True)

    # Export the trace, then import it back: the replay shows the same tokens.
    open_trace_files(page)
    with page.expect_download() as download:
        page.locator("#export").click()
    path = tmp_path / "trace.json"
    download.value.save_as(path)
    data = json.loads(path.read_text())
    assert data["format"] == "decoding-lab-trace" and len(data["token_ids"]) == total

    # Import it back into a fresh page: no run has happened there, so the views come from the file.
    page.goto(server)
    open_trace_files(page)
    page.locator("#import input[type=file]").set_input_files(str(path))
    page.get_by_text("Replaying an imported trace").wait_for(timeout=30_000)
    assert tokens_in(page) == total
    page.screenshot(path=str(ARTIFACTS / "imported.png"), full_page=True)

    # A corrupt file gets a message, not a crash.
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something-else"}')
    page.locator("#import input[type=file]").set_input_files(str(bad))
    page.get_by_text("Could not import the trace").wait_for(timeout=30_000)


def test_url_parameters_prefill_and_bad_input_message(server, page):
    page.goto(server + "?prompt=Hello%20from%20a%20link&max_new_tokens=7&seed=3")
    page.wait_for_function(
        "document.querySelector('#prompt textarea')?.value === 'Hello from a link'", timeout=30_000
    )
    # The views still show the recorded example until Run: the status says so.
    page.locator("#status").get_by_text("This link filled in the form").wait_for(timeout=30_000)
    page.locator("#prompt textarea").fill("   ")
    page.locator("#run-btn").click()
    page.get_by_text("the prompt is empty").wait_for(timeout=30_000)
    assert "Traceback" not in page.content()
    page.screenshot(path=str(ARTIFACTS / "bad-input.png"), full_page=True)


def test_a_link_too_long_for_the_server_gets_a_page_that_says_so(server, page):
    """Past ~64 k characters Gradio's page route fails in httpx ("URL too long", a bare 500);
    the app answers such a link itself, and the page still serves ordinary links."""
    import urllib.error
    import urllib.request

    from ui.guard import MAX_LINK_CHARS

    long_link = server + "?method=kangaroo&prompt=" + "x" * (MAX_LINK_CHARS + 10_000)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(long_link, timeout=30)
    assert refused.value.code == 414
    assert "paste the prompt" in refused.value.read().decode()
    # A busy machine hands the server such a head in pieces: uvicorn's parser, at its defaults,
    # answered a bare 400 then (a full run here saw the page below fail so); the app waits for it.
    host, port = server.split("//")[1].strip("/").split(":")
    head = f"GET /{long_link.split('/', 3)[3]} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(head[:20_000])
        time.sleep(0.3)
        conn.sendall(head[20_000:])
        assert conn.recv(64).startswith(b"HTTP/1.1 414 ")
    page.goto(long_link)
    page.get_by_text("This link is").wait_for(timeout=30_000)
    assert "Internal Server Error" not in page.content()
    page.goto(server + "?prompt=" + "y" * 20_000)  # a long prompt that fits still opens
    page.wait_for_function(
        "document.querySelector('#prompt textarea')?.value.length === 20000", timeout=30_000
    )


def start_a_long_run(page, server: str, query: str, more_than: int, timeout: int) -> None:
    """A 400-token story on the embedded model, streaming: long enough to stop in the middle."""
    page.goto(server + "?model=SmolLM2-135M-Instruct&max_new_tokens=400" + query)
    page.wait_for_function(
        "document.querySelector('#max-new-tokens input[type=number]')?.value === '400'",
        timeout=30_000,
    )
    page.locator("#prompt textarea").fill("Tell me a long story about a lighthouse keeper.")
    page.locator("#run-btn").click()
    page.wait_for_function(
        f"document.querySelectorAll('#tokens .dl-tok').length > {more_than}"
        " && document.querySelector('#status').innerText.includes('decoding')",
        timeout=timeout,
    )


def test_stop_cancels_cleanly_and_the_next_run_works(server, page):
    start_a_long_run(page, server, "", more_than=3, timeout=60_000)
    page.locator("#stop-btn").click(timeout=90_000)  # a loaded 2-core machine can stall the page
    page.locator("#status").get_by_text("Stopped").wait_for(timeout=30_000)
    stopped_at = tokens_in(page)
    page.wait_for_timeout(2500)
    assert tokens_in(page) == stopped_at < 400  # nothing streams in after Stop
    # The worker is free: a new run starts and finishes.
    page.locator("#max-new-tokens input[type=number]").fill("6")
    page.locator("#max-new-tokens input[type=number]").press("Enter")
    page.locator("#run-btn").click()
    page.get_by_text("✅ Done: 6 tokens").wait_for(timeout=60_000)


def test_the_results_stay_the_runs_own_and_a_double_click_runs_once(server, page):
    """A method picked while a run streams: the finished run's status names its own method and
    its views stay marked as the last run's. Then a double-click on Run starts one run, and Run
    pressed while it goes says it started nothing."""
    page.goto(server + "?model=SmolLM2-135M-Instruct&method=autoregressive&max_new_tokens=48")
    page.wait_for_function(
        "document.querySelector('#max-new-tokens input[type=number]')?.value === '48'",
        timeout=30_000,
    )
    page.locator("#run-btn").click()
    page.wait_for_function(
        "document.querySelectorAll('#tokens .dl-tok').length > 3"
        " && document.querySelector('#status').innerText.includes('decoding')",
        timeout=120_000,
    )
    page.locator("#method input").click()
    page.get_by_role("option", name="Jacobi").first.click()
    page.get_by_text("✅ Done").wait_for(timeout=120_000)
    assert "decoded by Autoregressive" in page.locator("#status").inner_text()
    page.locator("#stale").get_by_text("These views are the last run's").wait_for(timeout=30_000)
    assert page.locator("#method input").input_value().startswith("Jacobi")
    page.locator("#run-btn").dblclick()
    page.locator("#status").get_by_text("⏳").wait_for(timeout=30_000)
    page.locator("#run-btn").click()  # while it runs: nothing new, and the page says so
    page.locator("#dl-busy").get_by_text("started nothing").wait_for(timeout=10_000)
    page.get_by_text("✅ Done").wait_for(timeout=120_000)
    assert "decoded by Jacobi" in page.locator("#status").inner_text()
    page.wait_for_timeout(3000)  # a second run would have cleared the views and said ⏳ by now
    assert "✅ Done" in page.locator("#status").inner_text()
    assert page.locator("#stale").inner_text() == ""
    assert_no_error_badge(page)


def test_stop_while_a_long_prompt_is_encoded_never_drops_the_next_run(server, page):
    """A long prompt on the embedded model, Stop within a second (its prefill still running):
    the next Run, with a short prompt, finishes, and no bare "Error" shows anywhere."""
    page.goto(server + "?model=SmolLM2-135M-Instruct&max_new_tokens=8&method=autoregressive")
    page.wait_for_function(
        "document.querySelector('#max-new-tokens input[type=number]')?.value === '8'",
        timeout=30_000,
    )
    page.locator("#prompt textarea").fill("Summarise this: " + "the lighthouse keeper " * 900)
    page.locator("#run-btn").click()
    page.locator("#status").get_by_text("encoding the prompt").wait_for(timeout=60_000)
    page.locator("#stop-btn").click()
    page.locator("#status").get_by_text("Stopped").wait_for(timeout=15_000)
    page.locator("#prompt textarea").fill("def add(a, b):")
    page.locator("#run-btn").click()
    page.get_by_text("✅ Done: 8 tokens").wait_for(timeout=120_000)
    assert_no_error_badge(page)
    bare = page.evaluate(
        "() => [...document.querySelectorAll('body *')].filter(e => !e.children.length"
        " && e.textContent.trim() === 'Error').length"
    )
    assert bare == 0  # neither a badge nor a toast that says only "Error"


def open_link(page, url: str, method_label: str, param_ready_js: str) -> None:
    """Open a shared link and wait until the page has applied it: method and one parameter."""
    page.goto(url)
    page.wait_for_function(
        f"document.querySelector('#method input')?.value.startsWith('{method_label}')",
        timeout=30_000,
    )
    page.wait_for_function(param_ready_js, timeout=30_000)


def run_to_lossless_badge(page) -> None:
    page.locator("#run-btn").click()
    page.get_by_text("✅ Done").wait_for(timeout=120_000)
    page.get_by_text("identical to greedy").wait_for(timeout=60_000)  # the lossless badge


def test_prompt_lookup_from_a_link_shows_drafts_and_the_lossless_badge(server, page):
    code = (
        "Add a docstring to this function:\n\ndef moving_average(values, window):\n"
        "    averages = []\n    for i in range(len(values) - window + 1):\n"
        "        averages.append(sum(values[i:i + window]) / window)\n    return averages\n"
    )
    from urllib.parse import quote

    open_link(
        page,
        f"{server}?model=SmolLM2-135M-Instruct&method=prompt_lookup&num_draft=6&max_new_tokens=56"
        f"&prompt={quote(code)}",
        "Prompt lookup",
        "document.querySelector('#prompt_lookup-num_draft input[type=number]')?.value === '6'",
    )
    run_to_lossless_badge(page)
    assert (
        page.locator("#tokens .dl-tok[style*='#c8e6c9']").count() > 0
    )  # accepted drafts shown green
    # Step back to the last step whose draft the target accepted: the panel draws it.
    steps = page.evaluate(
        "Array.from(document.querySelectorAll(\"#tokens .dl-tok[style*='#c8e6c9']\")).map(e => +e.dataset.step)"
    )
    go_to_step(page, max(steps))
    page.get_by_text(f"Step {max(steps)}: prompt lookup").wait_for(timeout=30_000)
    page.locator("#panel .js-plotly-plot").wait_for(timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "prompt-lookup.png"), full_page=True)


def test_token_tree_view_from_a_link(server, page):
    """A token-tree run where the draft is the target itself: every step's tree has an accepted path."""
    open_link(
        page,
        f"{server}?model=tiny-random&method=token_tree&draft=tiny-random&shape=static"
        "&max_new_tokens=24&prompt=def%20f(x):",
        "Token tree",
        "document.querySelector('#token_tree-draft textarea, #token_tree-draft input')?.value"
        " === 'tiny-random'",
    )
    run_to_lossless_badge(page)
    go_to_step(page, 2)
    page.get_by_text("Step 2: token tree from tiny-random").wait_for(timeout=30_000)
    page.locator("#panel .js-plotly-plot").wait_for(timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "token-tree.png"), full_page=True)


def test_a_desktop_tree_shows_whole_tokens(server, page):
    """1440 x 1000, the default method on a code prompt on the embedded model: no node label of
    the tree is shortened when its token has 10 characters or fewer (each depth's column is as
    wide as its labels, sized to the view's width in the page)."""
    import ast
    import html

    page.goto(f"{server}?model=SmolLM2-135M-Instruct&max_new_tokens=32")
    page.wait_for_function(
        "document.querySelector('#max-new-tokens input[type=number]')?.value === '32'",
        timeout=30_000,
    )
    page.locator("#prompt textarea").fill(
        'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
    )
    run_to_lossless_badge(page)
    notes = page.evaluate(
        """() => (document.querySelector('#panel .js-plotly-plot').layout.annotations || [])
            .filter(a => a.name && a.name.startsWith('node'))
            .map(a => [a.text, a.hovertext])"""
    )
    assert len(notes) >= 3
    for text, hover in notes:
        shown = html.unescape(text)
        token = ast.literal_eval(html.unescape(hover).split(" · id")[0])
        if len(token) <= 10:
            assert not shown.endswith("…"), (shown, token)
    page.screenshot(path=str(ARTIFACTS / "token-tree-1440.png"), full_page=True)


def test_lookahead_views_from_a_link(server, page):
    """Lookahead's views: the step's attention mask, then its 2D window and its pool stacked below."""
    open_link(
        page,
        f"{server}?model=tiny-random&method=lookahead&N=3&W=3&G=3&max_new_tokens=24"
        "&prompt=def%20f(x):%20return%20f(x)",
        "Lookahead",
        "document.querySelector('#lookahead-W input[type=number]')?.value === '3'",
    )
    run_to_lossless_badge(page)
    go_to_step(page, 4)  # past the warm-up: the window holds its N - 1 = 2 levels
    extras = "#panel2, #panel3, #panel4, #panel5"  # stacked under the main panel, in any order
    for panel, title in [
        ("#panel", "Step 4: attention among"),
        (extras, "Step 4: window of 2 levels × 3"),
        (extras, "Step 4: pool holds"),
    ]:
        page.locator(panel).locator(".gtitle").filter(has_text=title).first.wait_for(timeout=30_000)
    cells = (
        page.locator("#panel .heatmaplayer").count() + page.locator("#panel2 .heatmaplayer").count()
    )
    assert cells >= 2  # the mask and the window are drawn, not empty placeholders
    page.screenshot(path=str(ARTIFACTS / "lookahead.png"), full_page=True)


# --- the cold page, the flow, the phone -----------------------------------------------------------

NO_ERROR_BADGE = """() => document.querySelectorAll('.error').length === 0
    && !/(^|\\n)\\s*Error\\s*(\\n|$)/.test(document.body.innerText)"""


def assert_no_error_badge(page) -> None:
    """Gradio marks a component whose update failed with a red "Error" badge (class .error).
    On failure: a screenshot, and which components carry the badge, to tell a flake from a bug."""
    if page.evaluate(NO_ERROR_BADGE):
        return
    page.screenshot(path=str(ARTIFACTS / "error-badge.png"), full_page=True)
    where = page.evaluate(
        """() => [...document.querySelectorAll('.error')].map(e => {
            const owner = e.closest('[id]');
            return (owner ? '#' + owner.id : e.tagName) + ': ' + e.innerText.slice(0, 120);
        })"""
    )
    raise AssertionError(f"a component shows gradio's bare 'Error' badge: {where}")


def box(page, selector: str) -> dict:
    b = page.locator(selector).first.bounding_box()
    assert b is not None, f"{selector} is not shown"
    return b


def test_cold_page_shows_the_example_trace_and_its_explainer(server, page):
    page.goto(server)
    page.locator("#prompt textarea").wait_for()
    page.locator("#status").get_by_text("An example run, recorded").wait_for(timeout=30_000)
    assert page.locator("#method input").input_value().startswith("Token tree")
    assert tokens_in(page) == 64  # the example's tokens, not "(no tokens yet)"
    for plot in ("#timeline", "#per-step", "#hist", "#panel"):
        page.locator(f"{plot} .js-plotly-plot").wait_for(timeout=30_000)
    assert page.locator("#metrics").get_by_text("not re-checked here").count() == 1
    assert page.locator("#explainer").get_by_text("Token trees").count() >= 1
    # The example can be stepped through at once: it is the page's trace, not a picture of one.
    step_js = "+document.querySelector('#step input[type=number]').value"
    before = page.evaluate(step_js)
    page.locator("#prev").click()
    page.wait_for_function(f"{step_js} === {before - 1}", timeout=30_000)
    # What the model sees: the chat template around the prompt.
    page.locator("#show-seen input").check()
    page.locator("#seen").get_by_text("What the model sees").wait_for(timeout=30_000)
    assert page.locator("#seen .special").count() >= 2  # <|im_start|> ... <|im_end|>
    assert_no_error_badge(page)
    page.screenshot(path=str(ARTIFACTS / "cold-1440.png"), full_page=True)


def test_long_model_names_end_before_the_dropdown_arrow_on_both_tabs(server, page):
    page.goto(server)
    page.locator("#prompt textarea").wait_for()  # the app has hydrated
    style = "e => [getComputedStyle(e).textOverflow, parseFloat(getComputedStyle(e).paddingRight)]"
    for name in ("#model input", "#method input"):
        assert page.locator(name).evaluate(style)[0] == "ellipsis"
        assert page.locator(name).evaluate(style)[1] >= 16, name
    page.get_by_role("tab", name="Compare").click()
    page.locator("#cmp-model input").wait_for()
    assert page.locator("#cmp-model input").evaluate(style)[0] == "ellipsis"
    assert page.locator("#cmp-model input").evaluate(style)[1] >= 16


def test_run_sits_with_the_prompt_above_the_parameters(server, page):
    page.goto(server)
    page.locator("#prompt textarea").wait_for()
    run, preset = box(page, "#run-btn"), box(page, "#preset")
    first_param = box(page, "#token_tree-draft")
    assert run["y"] + run["height"] <= 1000  # in the first screen
    assert run["y"] < preset["y"] < first_param["y"]
    page.locator("#preset input").click()  # the paper's settings, one click away
    page.locator("[role=option][aria-label=paper]").click()
    page.wait_for_function(
        "document.querySelector('#token_tree-nodes input[type=number]')?.value === '60'",
        timeout=30_000,
    )


def test_on_a_phone_the_form_comes_first_and_the_step_slider_sits_by_the_view(server, phone_page):
    """390 x 844: Run, the preset and the method's first parameter within the first two screens;
    the explainer closed; the step slider and the method's view in one screen; Run brings the
    output into view."""
    from decoders import METHODS
    from ui.run_views import DEFAULT_METHOD

    page = phone_page
    page.goto(server)
    page.locator("#prompt textarea").wait_for()
    page.locator("#status").get_by_text("An example run").wait_for(timeout=30_000)
    page.wait_for_function(
        "!document.querySelector('#explainer .label-wrap')?.classList.contains('open')",
        timeout=30_000,
    )
    first = METHODS[DEFAULT_METHOD].knobs[0].name
    run, preset = box(page, "#run-btn"), box(page, "#preset")
    param, output = box(page, f"#{DEFAULT_METHOD}-{first}"), box(page, "#run-output")
    assert run["y"] + run["height"] <= 844  # Run in the first screen
    assert run["y"] < preset["y"] < param["y"] < output["y"]
    assert param["y"] + param["height"] <= 1400, param  # the judged bound is 1,700
    slider, view = box(page, "#step"), box(page, "#panel")
    assert view["y"] >= slider["y"] and view["y"] - slider["y"] <= 300, (slider, view)
    page.screenshot(path=str(ARTIFACTS / "cold-390.png"), full_page=True)
    page.locator("#run-btn").click()
    page.wait_for_function(
        "(r => r.top >= -2 && r.top < 844)(document.querySelector('#tokens').getBoundingClientRect())",
        timeout=30_000,
    )
    page.get_by_text("✅ Done").wait_for(timeout=120_000)
    assert_no_error_badge(page)


def test_a_stopped_run_can_be_stepped_through_and_exported(server, page, tmp_path):
    start_a_long_run(page, server, "&method=autoregressive", more_than=8, timeout=120_000)
    # The figures keep up with the text: redrawn while the run streams, not only at the end.
    page.wait_for_function(
        """() => {
            const title = document.querySelector('#panel .gtitle')?.textContent || '';
            const m = title.match(/step (\\d+)/i);  // the panel's step
            return document.querySelector('#status').innerText.includes('decoding')
                && m && +m[1] >= 8;
        }""",
        timeout=60_000,
    )
    page.locator("#stop-btn").click(timeout=90_000)
    page.locator("#status").get_by_text("Stopped at").wait_for(timeout=30_000)
    kept = tokens_in(page)
    step_js = "+document.querySelector('#step input[type=number]').value"
    page.wait_for_function(f"{step_js} === {kept - 1}", timeout=30_000)  # one token per step
    page.locator("#prev").click()
    page.wait_for_function(f"{step_js} === {kept - 2}", timeout=30_000)
    page.wait_for_function(
        "document.querySelectorAll('#tokens .dl-pending').length === 1", timeout=30_000
    )
    open_trace_files(page)
    with page.expect_download() as download:
        page.locator("#export").click()
    path = tmp_path / "stopped.json"
    download.value.save_as(path)
    data = json.loads(path.read_text())
    assert data["finish_reason"] == "cancelled" and len(data["token_ids"]) == kept
    assert_no_error_badge(page)
    page.screenshot(path=str(ARTIFACTS / "stopped.png"), full_page=True)


def test_an_error_after_a_good_run_clears_its_views(server, page):
    page.goto(server + "?model=tiny-random&method=autoregressive&max_new_tokens=6")
    page.wait_for_function(
        "document.querySelector('#max-new-tokens input[type=number]')?.value === '6'",
        timeout=30_000,
    )
    page.locator("#run-btn").click()
    page.get_by_text("✅ Done: 6 tokens").wait_for(timeout=60_000)
    page.locator("#prompt textarea").fill("   ")
    page.locator("#run-btn").click()
    page.locator("#status").get_by_text("the prompt is empty").wait_for(timeout=30_000)
    assert tokens_in(page) == 0 and page.locator("#panel .js-plotly-plot .gtitle").count() == 0
    assert_no_error_badge(page)


def test_a_value_past_a_sliders_range_snaps_to_what_the_run_used(server, page):
    """A typed 9999 stays in a slider's box while the browser sends its maximum: after the run,
    the box shows what was used (the trace's own value), not what was typed."""
    page.goto(server + "?model=tiny-random&method=speculative&max_new_tokens=8")
    budget = page.locator("#max-new-tokens input[type=number]")
    page.wait_for_function(
        "document.querySelector('#max-new-tokens input[type=number]')?.value === '8'",
        timeout=30_000,
    )
    gamma = page.locator("#speculative-gamma input[type=number]")
    gamma.fill("99")
    gamma.press("Enter")
    page.locator("#run-btn").click()
    page.get_by_text("✅ Done").wait_for(timeout=60_000)
    page.wait_for_function(
        "document.querySelector('#speculative-gamma input[type=number]')?.value === '16'",
        timeout=30_000,
    )
    assert budget.input_value() == "8"
    assert_no_error_badge(page)


# --- every bad link and trace answered, by name -----------------------------------------------------

# Each rule of a link is tested where it lives (tests/test_app.py, `parse_link`); here the page
# shows every problem of a link at once, by name, keeps the good fields, and still runs.
BAD_LINKS = [
    (
        "seed=1e30&max_new_tokens=999&method=jacobi&block=abc&model=evil/model",
        [
            "seed must be between 0 and",
            "max_new_tokens must be a whole number between 1 and 512",
            "block must be a number",
            "not offered here",
        ],
    ),
    (
        "seed=nan&max_new_tokens=nan&method=lookahead&N=999",
        [
            "seed must be a finite number",
            "max_new_tokens must be a whole number between 1 and 512",
            "N must be between 2 and",
        ],
    ),
    (
        "method=nosuch&params=notjson",
        ["method='nosuch' is not a method here", "params is not valid"],
    ),
]


def test_a_bad_link_names_each_parameter_and_the_page_still_runs(server, page):
    for i, (query, messages) in enumerate(BAD_LINKS):
        page.goto(f"{server}?prompt=Kept%20prompt&{query}")
        page.locator("#status").get_by_text(messages[0]).wait_for(timeout=30_000)
        status = page.locator("#status").inner_text()
        assert all(m in status for m in messages), (query, status)
        assert page.locator("#prompt textarea").input_value() == "Kept prompt"  # good ones pre-fill
        assert_no_error_badge(page)
        page.screenshot(path=str(ARTIFACTS / f"bad-link-{i}.png"))
    # The last link's budget was not a number: the form keeps a number, so Run still runs.
    page.goto(f"{server}?prompt=Kept%20prompt&max_new_tokens=nan&model=tiny-random")
    page.locator("#status").get_by_text("max_new_tokens must be").wait_for(timeout=30_000)
    page.locator("#run-btn").click()
    page.get_by_text("✅ Done: 64 tokens").wait_for(timeout=120_000)
    assert_no_error_badge(page)


@pytest.fixture(scope="module")
def tiny_trace_file(server, tmp_path_factory):
    from gradio_client import Client

    _text, _stats, trace = Client(server, verbose=False).predict(
        prompt="def add(a, b):",
        method="jacobi",
        model="tiny-random",
        max_new_tokens=12,
        params='{"block": 4}',
        api_name="/run",
    )
    return trace


def _token_out_of_vocab(d):
    next(e for e in d["events"] if e["type"] == "Commit")["tokens"][0] = 10**7


# Each field's rule is tested where it lives (tests/test_app.py, `read_trace`); here one page
# answers a bad file by name and keeps what it showed, then answers the next one.
BAD_TRACES = [
    ("n_layers", lambda d: d.update(n_layers="abc"), "'n_layers' must be a whole number"),
    ("vocab", _token_out_of_vocab, "outside the model's vocabulary"),
]


def test_a_bad_trace_file_names_the_field(server, page, tmp_path, tiny_trace_file):
    page.goto(server)
    open_trace_files(page)
    shown = tokens_in(page)
    assert shown > 0  # the cold page's example, which a bad file must leave on screen
    png = tmp_path / "picture.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    for name, fn, message in [*BAD_TRACES, ("png", None, "not a trace file: it is not text")]:
        path = png
        if fn is not None:
            data = json.loads(json.dumps(tiny_trace_file))
            fn(data)
            path = tmp_path / f"bad-{name}.json"
            path.write_text(json.dumps(data))
        page.locator("#import input[type=file]").set_input_files(str(path))
        page.locator("#status").get_by_text(message).wait_for(timeout=30_000)
        assert "Could not import the trace" in page.locator("#status").inner_text()
        assert tokens_in(page) == shown  # what was on screen stays, to step and export
        assert_no_error_badge(page)


def test_an_import_restores_the_form_and_rechecks_the_badge(
    server, page, tmp_path, tiny_trace_file
):
    data = json.loads(json.dumps(tiny_trace_file))
    data["lossless"] = {"status": "differs", "first_divergence": 0}  # the file's claim: ignored
    path = tmp_path / "jacobi.json"
    path.write_text(json.dumps(data))
    page.goto(server)
    open_trace_files(page)
    page.locator("#import input[type=file]").set_input_files(str(path))
    page.locator("#status").get_by_text("Replaying an imported trace").wait_for(timeout=30_000)
    page.locator("#metrics").get_by_text("identical to greedy").wait_for(timeout=60_000)
    assert page.locator("#method input").input_value().startswith("Jacobi")
    assert page.locator("#prompt textarea").input_value() == "def add(a, b):"
    assert page.locator("#max-new-tokens input[type=number]").input_value() == "12"
    assert page.locator("#jacobi-block input[type=number]").input_value() == "4"
    assert tokens_in(page) == len(data["token_ids"])
    assert_no_error_badge(page)


def test_a_link_with_a_preset_sets_the_parameters_and_names_the_preset(server, page):
    page.goto(server + "?method=lookahead&preset=paper&params=%7B%22G%22%3A%204%7D")
    page.wait_for_function(
        "document.querySelector('#lookahead-W input[type=number]')?.value === '15'",
        timeout=30_000,
    )
    assert page.locator("#lookahead-G input[type=number]").input_value() == "4"  # params win
    page.wait_for_timeout(1000)  # the method's change has landed too
    assert page.locator("#preset input").input_value() == "paper"
    assert_no_error_badge(page)


def walk_the_tour(page, width: int, only: tuple[str, ...] = ()) -> None:
    """Every stop by Next (or, with `only`, those stops by the picker): its narration, a figure
    that fits, no error badge."""
    from ui.tour_tab import CHOICES, KEYS

    page.get_by_role("tab", name="Tour").click()
    for k in range(1, len(KEYS) + 1):
        if only and KEYS[k - 1] not in only:
            continue
        if only and k > 1:
            page.locator("#tour-stop input").click()
            page.get_by_role("option", name=CHOICES[k - 1][0]).click()
        elif k > 1:
            page.locator("#tour-next").click()
        page.locator("#tour-text").get_by_text(f"Stop {k} of {len(KEYS)}").wait_for(timeout=30_000)
        page.wait_for_function(
            "document.querySelector('#tour-panel .js-plotly-plot') !== null", timeout=30_000
        )
        settle(page)
        assert layout_problems(page, "#tour-row") == [], (width, KEYS[k - 1])
        if KEYS[k - 1] in ("token_tree_copy", "relaxed", "side_by_side", "translation"):
            page.screenshot(path=str(ARTIFACTS / f"tour-{KEYS[k - 1]}-{width}.png"), full_page=True)
    assert_no_error_badge(page)


def test_the_tour_walks_every_stop_and_runs_one_live(server, page, phone_page):
    """The guided tour at 1440 and 390 px: every stop opens with its narration and a figure
    that fits; "Run it live" fills the Run tab with the stop's run and decodes it. On a phone the
    Learn tab opens on the overview, its chooser a dropdown."""
    page.goto(server)
    page.locator("#prompt textarea").wait_for()
    walk_the_tour(page, 1440)
    page.locator("#tour-prev").click()  # back past the comparison and Mask-Predict to relaxed
    page.locator("#tour-text").get_by_text("All of them side by side").first.wait_for(
        timeout=30_000
    )
    page.locator("#tour-prev").click()
    page.locator("#tour-text").get_by_text("Mask-Predict").first.wait_for(timeout=30_000)
    page.locator("#tour-prev").click()
    page.locator("#tour-text").get_by_text("relaxed verification").first.wait_for(timeout=30_000)
    page.locator("#tour-live").click()
    page.wait_for_function(
        "document.querySelector('#method input')?.value.startsWith('Speculative')",
        timeout=30_000,
    )
    page.get_by_text("✅ Done").wait_for(timeout=120_000)
    assert "lossy" in page.locator("#metrics").inner_text().lower()  # β = 4: never a tick
    assert "the tour stop's rule" in page.locator("#status").inner_text()  # its step, as the stop
    assert page.locator("#speculative-beta input[type=number]").input_value() == "4"
    assert_no_error_badge(page)
    # Another method picked, not run: the views say they are the last run's, dimmed.
    page.locator("#method input").click()
    page.get_by_role("option", name="Jacobi").first.click()
    page.locator("#stale").get_by_text("These views are the last run's").wait_for(timeout=30_000)
    page.wait_for_function(  # dimmed (the fade takes 0.2 s)
        "getComputedStyle(document.querySelector('#panel')).opacity === '0.35'", timeout=5_000
    )

    phone_page.goto(server)
    phone_page.locator("#prompt textarea").wait_for()
    # a phone: the stops whose figures a phone squeezes most (the method views themselves are
    # checked at 390 px for every method in test_browser_views)
    walk_the_tour(phone_page, 390, ("autoregressive", "token_tree_copy", "relaxed", "side_by_side"))
    phone_page.get_by_role("tab", name="Learn").click()
    phone_page.locator("#learn-figure .js-plotly-plot").wait_for(timeout=30_000)
    assert phone_page.locator("#learn-method input").count() == 1  # a dropdown, not 17 radios
    settle(phone_page)
    assert layout_problems(phone_page, "#learn-figure") == []


def test_the_translation_lab_translates_a_typed_sentence_and_names_a_bad_one(
    server, page, phone_page
):
    """The Translation lab at 1440 and 390 px: every model's output beside the references, the
    iteration grid, the latents and the chart fit; a bad word is named, the last translation
    stays; a typed sentence is translated."""
    for p, width in ((page, 1440), (phone_page, 390)):
        p.goto(server)
        p.get_by_role("tab", name="Translation lab").click()
        p.locator("#tl-outputs table").wait_for(timeout=30_000)
        p.locator("#tl-chart .js-plotly-plot").wait_for(timeout=30_000)
        settle(p)
        for part in ("#tl-outputs", "#tl-grid", "#tl-latents", "#tl-chart"):
            assert layout_problems(p, part) == [], (width, part)
        p.screenshot(path=str(ARTIFACTS / f"translation-{width}.png"), full_page=True)
    before = page.locator("#tl-outputs").inner_html()
    page.locator("#tl-source textarea").fill("w3 w1 w44 w2 w5")
    page.locator("#tl-go").click()
    page.locator("#tl-status").get_by_text("'w44' is not a source word").wait_for(timeout=30_000)
    assert page.locator("#tl-outputs").inner_html() == before  # nothing lost
    page.locator("#tl-source textarea").fill("w7 w7 w1 w2 w9 w0")
    page.locator("#tl-go").click()
    page.locator("#tl-references").get_by_text("a7 a7 a1 a2 a9 a0").wait_for(timeout=30_000)
    assert page.locator("#tl-outputs tr").count() > 10
    assert_no_error_badge(page)


def test_the_speed_lab_draws_the_theory_and_runs_synthetic_acceptance(server, page, phone_page):
    """Learn's lab at 1440 and 390 px: the price curve and the theory fit; a slider redraws the
    theory; "Run it for real" puts five synthetic runs on it, said to be not exact."""
    for p, width in ((page, 1440), (phone_page, 390)):
        p.goto(server)
        p.get_by_role("tab", name="Learn").click()
        p.locator("#learn-method input").click()
        p.get_by_role("option", name="Lab: why a method is faster or slower").click()
        p.locator("#lab-theory .js-plotly-plot").wait_for(timeout=30_000)
        p.locator("#lab-prices .js-plotly-plot").wait_for(timeout=30_000)
        settle(p)
        for part in ("#lab-prices", "#lab-theory"):
            assert layout_problems(p, part) == [], (width, part)
    gamma = page.locator("#lab-gamma input[type=number]")
    gamma.fill("8")
    gamma.press("Enter")
    page.locator("#lab-theory").get_by_text("γ = 8").first.wait_for(timeout=30_000)
    page.locator("#lab-run").click()
    page.locator("#lab-status").get_by_text("synthetic runs").wait_for(timeout=180_000)
    assert "Not exact" in page.locator("#lab-status").inner_text()
    page.locator("#lab-theory").get_by_text("synthetic acceptance").first.wait_for()
    assert_no_error_badge(page)
    settle(page)
    page.screenshot(path=str(ARTIFACTS / "speed-lab-1440.png"), full_page=True)
    phone_page.screenshot(path=str(ARTIFACTS / "speed-lab-390.png"), full_page=True)
