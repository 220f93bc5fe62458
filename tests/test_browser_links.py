"""Shared links and trace files in a real headless Chromium: a method's views opened from a link
(prompt lookup's drafts, the token tree, lookahead) with the lossless badge, whole tokens in a
desktop tree, a preset named by a link; every bad link and bad trace file answered by name, and
an import that restores the form. Screenshots land in test-artifacts/."""

import json

import pytest
from test_browser import assert_no_error_badge, open_trace_files, tokens_in

from browser_helpers import go_to_step
from conftest import ARTIFACTS

pytestmark = [pytest.mark.slow, pytest.mark.browser]


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
