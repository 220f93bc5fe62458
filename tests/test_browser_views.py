"""Every method's views in a real headless Chromium, on a desktop (1440 x 1000) and a phone
(390 x 844; the same page, resized): after a run on both, and at a middle step on the phone (the
narrower, harder fit), no figure title, subtitle, legend entry, caption (annotation), axis title or
tick label may overflow its figure or overlap another text, and no title, legend or axis title may
cover a plot. The text boxes are measured in the page, as drawn. Screenshots land in
test-artifacts/ (views-<method>-desktop-end.png, -phone-end, -phone-middle; each figure's close-up
beside the first and the last)."""

from urllib.parse import quote

import pytest
from playwright.sync_api import Error as PlaywrightError

from browser_helpers import LAYOUT_CHECK, STEP_NUMBER, go_to_step, settle
from conftest import ARTIFACTS, DESKTOP, PHONE
from decoders import METHODS

pytestmark = [pytest.mark.slow, pytest.mark.browser]

PROMPT = "def f(x):\n    return f(x) + f(x)\n"
TOKENS = 24
# Every method at its defaults, and lookahead with the paper's 2D window (N = 5, W = 15, G = 15).
RUNS = [(name, "") for name in METHODS] + [("lookahead", "paper")]
CLOSE_UPS = ("panel", "panel2", "panel3", "panel4", "panel5", "hist")


@pytest.fixture(scope="module")
def views_page(browser, server):
    """One page for every method's run, as a visitor switches methods: opened once from a link
    (the model, the prompt and the budget), then each test picks its method and preset in the
    form and runs it (a page opened from a link is 5-6 s of these tests' time each)."""
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    page.goto(f"{server}?model=tiny-random&max_new_tokens={TOKENS}&prompt={quote(PROMPT)}")
    page.locator("#run-btn").wait_for(timeout=60_000)
    page.wait_for_function(
        f"document.querySelector('#max-new-tokens input[type=number]')?.value === '{TOKENS}'",
        timeout=60_000,
    )
    yield page
    context.close()


def pick(page, box: str, label: str) -> None:
    """Choose `label` in the dropdown `box` and wait until the page shows it."""
    page.locator(f"{box} input").click()
    page.get_by_role("option", name=label, exact=True).click()
    page.wait_for_function(
        "([box, label]) => document.querySelector(box + ' input')?.value === label",
        arg=[box, label],
        timeout=30_000,
    )


def open_run(page, method: str, preset: str) -> None:
    """Back to a desktop's width, pick the method (and a preset), run it, and wait for the
    run's last views."""
    if page.viewport_size != DESKTOP:
        fit(page, DESKTOP)
    pick(page, "#method", METHODS[method].title)
    if preset:  # its controls shown, then the preset sets them
        values = METHODS[method].preset(preset)
        page.locator(f"#{method}-{next(iter(values))}").wait_for(timeout=30_000)
        pick(page, "#preset", preset)
        page.wait_for_function(
            """([method, values]) => Object.entries(values)
                .filter(([k, v]) => typeof v === 'number')
                .every(([k, v]) =>
                    +document.querySelector(`#${method}-${k} input[type=number]`)?.value === v)""",
            arg=[method, values],
            timeout=30_000,
        )
    page.locator("#run-btn").click()
    # The run first clears the last run's views (its status says so), then streams this one.
    page.wait_for_function(
        "!document.querySelector('#status')?.innerText.includes('Done')", timeout=60_000
    )
    page.wait_for_function(
        "document.querySelector('#status')?.innerText.includes('Done')", timeout=180_000
    )
    # The finished run opens at its telling step (its method's tour rule: any step, 0 included).
    page.wait_for_function(
        "(e => e && e.max !== '' && +e.max > 0 && +e.value >= 0 && +e.value <= +e.max)"
        "(document.querySelector('#step input[type=range]'))",
        timeout=60_000,
    )
    settle(page)


def check_views(page, label: str, close_ups: bool = True) -> int:
    result = page.evaluate(LAYOUT_CHECK, page.locator("body").element_handle())
    page.screenshot(path=str(ARTIFACTS / f"views-{label}.png"), full_page=True)
    for panel in CLOSE_UPS if close_ups else ():
        plot = page.locator(f"#{panel} .js-plotly-plot")
        path = str(ARTIFACTS / f"views-{label}-{panel}.png")
        try:
            if plot.count() and plot.first.is_visible():
                plot.first.screenshot(path=path)
        except PlaywrightError:  # redrawn under the camera (the step's own redraw came late)
            settle(page)
            if plot.count() and plot.first.is_visible():
                plot.first.screenshot(path=path)
    assert not result["problems"], f"{label}:\n" + "\n".join(result["problems"])
    return result["plots"]


def fit(page, viewport: dict) -> None:
    """Resize the page and wait until it has redrawn the views for the new width (Plotly resizes
    each figure, and the server redraws the method's views: their labels are sized to the
    width)."""
    before = page.evaluate("window.dlRedraws || 0")
    page.set_viewport_size(viewport)
    page.wait_for_function(f"(window.dlRedraws || 0) > {before}", timeout=30_000)
    page.wait_for_function(
        "w => Array.from(document.querySelectorAll('#panel .js-plotly-plot'))"
        ".every(p => p.getBoundingClientRect().width <= w)",
        arg=viewport["width"],
        timeout=30_000,
    )
    settle(page)


def fit_and_check(page, viewport: dict, label: str, close_ups: bool = True) -> int:
    fit(page, viewport)
    return check_views(page, label, close_ups)


@pytest.mark.parametrize(("method", "preset"), RUNS, ids=[f"{m}-{p}" if p else m for m, p in RUNS])
def test_views_fit_on_a_desktop_and_a_phone_after_the_run_and_on_a_phone_at_a_middle_step(
    views_page, method, preset
):
    """One run per method, checked at both widths: the figures are the same, drawn to the width."""
    page = views_page
    name = f"{method}-{preset}" if preset else method
    open_run(page, method, preset)
    if method == "lookahead":  # its extra views are shown too, each full width; on a busy
        # machine they are drawn after the main panel: wait for all four, then check them all
        widths = page.wait_for_function(
            """() => {
                const w = Array.from(document.querySelectorAll('[id^=panel] .js-plotly-plot'))
                    .filter(p => p.getBoundingClientRect().width > 0)
                    .map(p => Math.round(p.getBoundingClientRect().width));
                return w.length >= 4 ? w : null; }""",
            timeout=30_000,
        ).json_value()
        assert max(widths) - min(widths) <= 2, widths
        settle(page)
    plots = check_views(page, f"{name}-desktop-end")
    assert plots >= 4  # timeline, tokens per step, acceptance, the method's panel
    fit_and_check(page, PHONE, f"{name}-phone-end", close_ups=False)
    last = page.evaluate(STEP_NUMBER)
    go_to_step(page, max(1, last // 2))  # drawn for the phone's width (the step's own event)
    check_views(page, f"{name}-phone-middle")
