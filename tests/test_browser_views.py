"""Every method's views in a real headless Chromium, on a desktop (1440 x 1000) and a phone
(390 x 844): after a run and at a middle step, no figure title, subtitle, legend entry, caption
(annotation), axis title or tick label may overflow its figure or overlap another text, and no title,
legend or axis title may cover a plot. The text boxes are measured in the page, as drawn.
Screenshots land in test-artifacts/ (views-<method>-<viewport>-<end|middle>.png)."""

from urllib.parse import quote

import pytest

from browser_helpers import LAYOUT_CHECK, STEP_NUMBER, go_to_step, settle
from conftest import ARTIFACTS
from decoders import METHODS

pytestmark = [pytest.mark.slow, pytest.mark.browser]

PROMPT = "def f(x):\n    return f(x) + f(x)\n"
TOKENS = 24
# Every method at its defaults, and lookahead with the paper's 2D window (N = 5, W = 15, G = 15).
RUNS = [(name, "") for name in METHODS] + [("lookahead", "&preset=paper")]


def open_run(page, server: str, method: str, extra: str) -> None:
    """Open a link that pre-fills the form, run it, and wait for the run's last views."""
    page.goto(
        f"{server}?model=tiny-random&method={method}&max_new_tokens={TOKENS}"
        f"&prompt={quote(PROMPT)}{extra}"
    )
    page.locator("#run-btn").wait_for(timeout=60_000)
    page.wait_for_function(
        f"document.querySelector('#max-new-tokens input[type=number]')?.value === '{TOKENS}'",
        timeout=60_000,
    )
    page.locator("#run-btn").click()
    page.wait_for_function(
        "document.querySelector('#status')?.innerText.includes('Done')", timeout=180_000
    )
    # The finished run opens at its showcase step (the last with drafts accepted, else the last).
    page.wait_for_function(
        "(e => e && e.max !== '' && +e.max > 0 && +e.value > 0 && +e.value <= +e.max)"
        "(document.querySelector('#step input[type=range]'))",
        timeout=60_000,
    )
    settle(page)


def check_views(page, label: str) -> int:
    result = page.evaluate(LAYOUT_CHECK, page.locator("body").element_handle())
    page.screenshot(path=str(ARTIFACTS / f"views-{label}.png"), full_page=True)
    for panel in ("panel", "panel2", "panel3", "panel4", "panel5", "hist"):  # close-ups
        plot = page.locator(f"#{panel} .js-plotly-plot")
        if plot.count() and plot.first.is_visible():
            plot.first.screenshot(path=str(ARTIFACTS / f"views-{label}-{panel}.png"))
    assert not result["problems"], f"{label}:\n" + "\n".join(result["problems"])
    return result["plots"]


@pytest.mark.parametrize(
    ("method", "extra"), RUNS, ids=[m + e.replace("&preset=", "-") for m, e in RUNS]
)
@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_views_fit_after_the_run_and_at_a_middle_step(server, request, viewport, method, extra):
    page = request.getfixturevalue("page" if viewport == "desktop" else "phone_page")
    name = f"{method}{extra.replace('&preset=', '-')}-{viewport}"
    open_run(page, server, method, extra)
    plots = check_views(page, f"{name}-end")
    assert plots >= 4  # timeline, tokens per step, acceptance, the method's panel
    last = page.evaluate(STEP_NUMBER)
    middle = max(1, last // 2)
    go_to_step(page, middle)
    check_views(page, f"{name}-middle")
    if method == "lookahead":  # its extra views are shown too, each full width
        widths = page.evaluate(
            """() => Array.from(document.querySelectorAll('[id^=panel] .js-plotly-plot'))
                .filter(p => p.getBoundingClientRect().width > 0)
                .map(p => Math.round(p.getBoundingClientRect().width))"""
        )
        assert len(widths) >= 4 and max(widths) - min(widths) <= 2, widths


def test_layout_check_catches_clipping_and_overlaps(browser):
    """The check itself: a title wider than its figure and a caption pushed into the title strip
    are caught; a clean figure passes."""
    import plotly
    import plotly.graph_objects as go

    from visualizer.figures import _base_layout

    ok = _base_layout(go.Figure(go.Bar(x=[1, 2], y=[3, 4], name="bars")), "Fits")
    clipped = _base_layout(go.Figure(go.Bar(x=[1], y=[1])), "A title far too long " * 6)
    crowded = _base_layout(go.Figure(go.Bar(x=[1], y=[1])), "A title")
    crowded.add_annotation(  # a caption drawn over the title
        text="a caption", x=0, y=1.2, xref="paper", yref="paper", xanchor="left", yanchor="top"
    )
    page = browser.new_page(viewport={"width": 500, "height": 900})
    try:
        page.set_content(
            "".join(f'<div id="f{i}" style="width:360px"></div>' for i in range(3))
            + f"<script>{plotly.offline.get_plotlyjs()}</script>"
        )
        for i, fig in enumerate((ok, clipped, crowded)):
            page.evaluate(
                "([id, fig]) => Plotly.newPlot(id, fig.data, fig.layout)",
                [f"f{i}", fig.to_plotly_json()],
            )
        problems = page.evaluate(LAYOUT_CHECK, page.locator("body").element_handle())["problems"]
    finally:
        page.close()
    assert not [p for p in problems if p.startswith("#f0")], problems
    assert any(p.startswith("#f1: title") and "overflows the figure (right" in p for p in problems)
    assert any(p.startswith("#f2: annotation 'a caption'") for p in problems), problems
