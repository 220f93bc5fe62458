"""The page in a real headless Chromium (Debian's, driven by Playwright): run, watch tokens stream,
step through, export the trace and import it back. Screenshots land in test-artifacts/."""

import json
import time

import pytest

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
    page.locator("#prompt textarea").fill("def fibonacci(n):")
    # Warm run (model load, first compile of the page's plots) so the timing below is the warm case.
    page.locator("#run-btn").click()
    page.get_by_text("✅ Done").wait_for(timeout=120_000)

    page.locator("#prompt textarea").fill("Write a haiku about the sea.")
    clicked = time.perf_counter()
    page.locator("#run-btn").click()
    # Wait for this run's first token: the status says Running only while this run streams.
    streamed_while_running = page.wait_for_function(
        """() => {
            const n = document.querySelectorAll('#tokens .dl-tok').length;
            return n > 0 && document.querySelector('#status').innerText.includes('Running') ? n : 0;
        }""",
        timeout=30_000,
    ).json_value()
    first_token_s = time.perf_counter() - clicked
    print(f"\nfirst streamed token visible {first_token_s:.2f} s after clicking Run (model warm)")
    page.get_by_text("✅ Done").wait_for(timeout=120_000)
    streaming_s = time.perf_counter() - clicked - first_token_s
    total = tokens_in(page)
    print(f"tokens streamed into the page: {(total - 1) / streaming_s:.1f} tok/s after the first")
    assert 0 < streamed_while_running < total <= 64  # tokens arrived before the end
    page.screenshot(path=str(ARTIFACTS / "run.png"), full_page=True)

    # Step back: the future turns grey, the step's token is underlined.
    step_js = "+document.querySelector('#step input[type=number]').value"
    at_end = "(e => e.max !== '' && +e.value === +e.max)(document.querySelector('#step input[type=range]'))"
    page.wait_for_function(at_end, timeout=30_000)  # the finished run shows its last step
    last = page.evaluate(step_js)
    for k in range(1, 4):  # one click at a time: each reads the step the previous one set
        page.locator("#prev").click()
        page.wait_for_function(f"{step_js} === {last - k}", timeout=30_000)
    page.wait_for_function(
        "document.querySelectorAll('#tokens .dl-pending').length >= 3", timeout=30_000
    )
    assert page.locator("#tokens .dl-now").count() == 1
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
    page.locator("#prompt textarea").fill("   ")
    page.locator("#run-btn").click()
    page.get_by_text("the prompt is empty").wait_for(timeout=30_000)
    assert "Traceback" not in page.content()
    page.screenshot(path=str(ARTIFACTS / "bad-input.png"), full_page=True)


def test_stop_cancels_cleanly_and_the_next_run_works(server, page):
    page.goto(server + "?model=SmolLM2-135M-Instruct&max_new_tokens=400")
    page.wait_for_function(
        "document.querySelector('#max-new-tokens input[type=number]')?.value === '400'",
        timeout=30_000,
    )
    page.locator("#prompt textarea").fill("Tell me a long story about a lighthouse keeper.")
    page.locator("#run-btn").click()
    page.wait_for_function(
        "document.querySelectorAll('#tokens .dl-tok').length > 3"
        " && document.querySelector('#status').innerText.includes('Running')",
        timeout=60_000,
    )
    page.locator("#stop-btn").click()
    page.get_by_text("Stopped").wait_for(timeout=30_000)
    stopped_at = tokens_in(page)
    page.wait_for_timeout(2500)
    assert tokens_in(page) == stopped_at < 400  # nothing streams in after Stop
    # The worker is free: a new run starts and finishes.
    page.locator("#max-new-tokens input[type=number]").fill("6")
    page.locator("#max-new-tokens input[type=number]").press("Enter")
    page.locator("#run-btn").click()
    page.get_by_text("✅ Done: 6 tokens").wait_for(timeout=60_000)


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


def go_to_step(page, step: int) -> None:
    slider = page.locator("#step input[type=number]")
    slider.fill(str(step))
    slider.press("Enter")


def test_compare_tab(server, page):
    page.goto(server)
    page.get_by_role("tab", name="Compare").click()
    page.locator("#cmp-prompt textarea").fill("def add(a, b):")
    page.locator("#cmp-btn").click()
    page.get_by_text("✅ Done.").wait_for(timeout=120_000)
    assert page.locator("#cmp-table").get_by_text("reference").count() >= 1
    page.locator("#cmp-plot .js-plotly-plot").wait_for(timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)


def test_prompt_lookup_from_a_link_shows_drafts_and_the_lossless_badge(server, page):
    code = (
        "Add a docstring to this function:\n\ndef moving_average(values, window):\n"
        "    averages = []\n    for i in range(len(values) - window + 1):\n"
        "        averages.append(sum(values[i:i + window]) / window)\n    return averages\n"
    )
    from urllib.parse import quote

    open_link(
        page,
        f"{server}?model=SmolLM2-135M-Instruct&method=prompt_lookup&num_draft=6&max_new_tokens=96"
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


def test_lookahead_views_from_a_link(server, page):
    """Lookahead's three views side by side: the step's attention mask, its 2D window, its pool."""
    open_link(
        page,
        f"{server}?model=tiny-random&method=lookahead&N=3&W=3&G=3&max_new_tokens=24"
        "&prompt=def%20f(x):%20return%20f(x)",
        "Lookahead",
        "document.querySelector('#lookahead-W input[type=number]')?.value === '3'",
    )
    run_to_lossless_badge(page)
    go_to_step(page, 4)  # past the warm-up: the window holds its N - 1 = 2 levels
    for panel, title in [
        ("#panel", "Step 4: attention among the forward's"),
        ("#panel2", "Step 4: window of 2 levels × 3"),
        ("#panel3", "Step 4: pool holds"),
    ]:
        page.locator(f"{panel} .gtitle").filter(has_text=title).wait_for(timeout=30_000)
    cells = (
        page.locator("#panel .heatmaplayer").count() + page.locator("#panel2 .heatmaplayer").count()
    )
    assert cells >= 2  # the mask and the window are drawn, not empty placeholders
    page.screenshot(path=str(ARTIFACTS / "lookahead.png"), full_page=True)
