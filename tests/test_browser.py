"""The page in a real headless Chromium (Debian's, driven by Playwright): the cold page's example,
run, watch tokens stream, stop, step through, export the trace and import it back; the results a
run owns; the phone layout. Views opened from links and bad links and trace files answered by
name: test_browser_links.py; the tour and the labs: test_browser_tour.py. Screenshots land in
test-artifacts/."""

import json
import socket
import time

import pytest

from conftest import ARTIFACTS

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def tokens_in(page) -> int:
    """The committed tokens shown (a rolled-back draft, struck through, is none of them)."""
    return page.locator("#tokens .dl-tok:not(.dl-ghost)").count()


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
    # The finished run opens at its method's telling step, said in the status; "⤴ Telling
    # step" goes back there from anywhere.
    page.locator("#status").get_by_text("telling step").wait_for(timeout=30_000)
    telling = page.evaluate(step_js)
    top = page.evaluate("+document.querySelector('#step input[type=range]').max")
    box = page.locator("#step input[type=number]")
    box.fill(str(top))
    box.press("Enter")
    page.wait_for_function(f"{step_js} === {top}", timeout=30_000)
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
    page.locator("#telling").click()
    page.wait_for_function(f"{step_js} === {telling}", timeout=30_000)

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


# Where each part of the page is, in the viewport (a phone's landing point is its top), and what
# a finger has to hit.
VIEWPORT_BOXES = """sels => Object.fromEntries(sels.map(s => {
    const r = document.querySelector(s)?.getBoundingClientRect();
    return [s, r ? {y: r.top, bottom: r.bottom, width: r.width, height: r.height} : null];
}))"""
TOUCH = ("#run-btn", "#stop-btn", "#prev", "#play", "#next")
TOUR_TOUCH = ("#tour-prev", "#tour-next", "#tour-live", "#tour-prev-low", "#tour-next-low")


def test_on_a_phone_the_form_comes_first_and_the_step_slider_sits_by_the_view(server, phone_page):
    """390 x 844: Run in the first screen, the method's parameters closed under it (a tap opens
    them: the preset, then the first parameter), the explainer closed, buttons a finger can hit,
    nothing to swipe sideways. Run lands on the output: its first line, the step controls and the
    method's view in the one screen where the page lands. The tour's figure opens in the first
    screen."""
    from decoders import METHODS
    from ui.run_views import DEFAULT_METHOD

    page = phone_page
    page.goto(server)
    page.locator("#prompt textarea").wait_for()
    page.locator("#status").get_by_text("An example run").wait_for(timeout=30_000)
    page.wait_for_function(
        "['#explainer', '#run-params'].every(a =>"
        " !document.querySelector(a + ' .label-wrap')?.classList.contains('open'))",
        timeout=30_000,
    )
    run, params, output = box(page, "#run-btn"), box(page, "#run-params"), box(page, "#run-output")
    assert run["y"] + run["height"] <= 844  # Run in the first screen
    assert run["y"] < params["y"] < output["y"] <= params["y"] + 120, (params, output)  # closed
    boxes = page.evaluate(VIEWPORT_BOXES, TOUCH)
    assert all(b["height"] >= 44 and b["width"] >= 44 for b in boxes.values()), boxes
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    first = METHODS[DEFAULT_METHOD].knobs[0].name
    page.locator("#run-params .label-wrap").tap()  # the parameters, one tap away
    page.locator(f"#{DEFAULT_METHOD}-{first}").wait_for(timeout=30_000)
    opened = page.evaluate(VIEWPORT_BOXES, ["#run-params", "#preset", f"#{DEFAULT_METHOD}-{first}"])
    ys = [b["y"] for b in opened.values()] + [box(page, "#run-output")["y"]]
    assert ys == sorted(ys), opened  # the accordion, the preset, the first parameter, the output
    page.screenshot(path=str(ARTIFACTS / "cold-390.png"), full_page=True)
    page.locator("#run-btn").click()
    page.wait_for_function(
        "(r => r.top >= -2 && r.top < 844)(document.querySelector('#tokens').getBoundingClientRect())",
        timeout=30_000,
    )
    page.get_by_text("✅ Done").wait_for(timeout=120_000)
    page.locator("#panel .js-plotly-plot").wait_for(timeout=30_000)
    at = page.evaluate(VIEWPORT_BOXES, ["#tokens", "#prev", "#step", "#panel"])
    # The judged bound: each within the 844 px screen where Run landed, kept with a margin (this
    # server's random model writes a taller output than the embedded one: 718 px here, 559 there).
    assert -2 <= at["#tokens"]["y"] <= 100, at
    assert at["#tokens"]["y"] < at["#prev"]["y"] < at["#step"]["y"] < at["#panel"]["y"] <= 780, at
    assert at["#panel"]["y"] - at["#step"]["bottom"] <= 60, at  # the slider sits by the view
    page.screenshot(path=str(ARTIFACTS / "run-390.png"))
    assert_no_error_badge(page)
    page.evaluate("window.scrollTo(0, 0)")
    page.get_by_role("tab", name="Tour").click()
    page.locator("#tour-panel .js-plotly-plot").wait_for(timeout=30_000)
    tour = page.evaluate(VIEWPORT_BOXES, ["#tour-next", "#tour-panel", "#tour-text", *TOUR_TOUCH])
    # the figure in the first screen, under the picker and Prev / Next, its narration after it
    assert tour["#tour-next"]["y"] < tour["#tour-panel"]["y"] <= 700, tour
    assert tour["#tour-panel"]["y"] < tour["#tour-text"]["y"], tour
    assert all(tour[b]["height"] >= 44 and tour[b]["width"] >= 44 for b in TOUR_TOUCH), tour
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


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
