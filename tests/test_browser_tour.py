"""The tour and the labs in a real headless Chromium, on a desktop and a phone: the tour walks
every stop and runs one live, the translation lab translates a typed sentence and names a bad
one, the speed lab draws the theory and runs synthetic acceptance. Screenshots land in
test-artifacts/."""

import pytest
from test_browser import assert_no_error_badge

from browser_helpers import layout_problems, settle
from conftest import ARTIFACTS

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def walk_the_tour(page, width: int, only: tuple[str, ...] = ()) -> None:
    """Every stop by Next (or, with `only`, those stops by the picker): its narration, a figure
    that fits, no error badge."""
    from ui.tour_show import CHOICES, KEYS

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
        problems = layout_problems(page, "#tour-row")
        assert problems == [], (width, KEYS[k - 1], problems)
        if KEYS[k - 1] == "speculative":  # predict, then reveal
            page.locator("#tour-ask").get_by_text("Predict").wait_for(timeout=10_000)
            page.locator("#tour-reveal").click()
            page.wait_for_function(
                "!document.querySelector('#tour-ask')?.innerText.includes('Predict')",
                timeout=30_000,
            )
        if KEYS[k - 1] in ("token_tree_copy", "relaxed", "side_by_side", "translation"):
            page.screenshot(path=str(ARTIFACTS / f"tour-{KEYS[k - 1]}-{width}.png"), full_page=True)
    assert_no_error_badge(page)


def test_the_tour_walks_every_stop_and_runs_one_live(server, page, phone_page):
    """The guided tour at 1440 and 390 px. A link opens a stop at a step in presenter mode (the
    figure across the window) and the keys walk it; every stop opens with its narration and a
    figure that fits; a stop that asks shows its question until Reveal; "Run it live" fills the
    Run tab with the stop's run, decodes it and lands on the stop's view. On a phone the live
    run lands there too, and the Learn tab opens on the overview, its chooser a dropdown."""
    from ui.tour_show import KEYS
    from ui.tour_tab import LAND

    n = KEYS.index("token_tree") + 1
    page.goto(f"{server}?tour={n}&step=2&present=1")
    page.locator("#tour-text").get_by_text(f"Stop {n} of {len(KEYS)}").wait_for(timeout=60_000)
    page.wait_for_function(
        "document.querySelector('#tour-panel .js-plotly-plot') !== null", timeout=30_000
    )
    assert page.locator("#tour-step input[type=number]").input_value() == "2"
    width = page.evaluate(
        "document.querySelector('#tour-panel .js-plotly-plot').getBoundingClientRect().width"
    )
    assert width >= 0.85 * 1440, width  # the judged bound is 80 %
    page.keyboard.press("ArrowRight")
    page.locator("#tour-text").get_by_text(f"Stop {n + 1} of").wait_for(timeout=30_000)
    page.keyboard.press("Home")
    page.locator("#tour-text").get_by_text(f"Stop 1 of {len(KEYS)}").wait_for(timeout=30_000)
    page.locator("#tour-present").click()  # presenter mode off: the two columns again
    page.wait_for_function(  # and the figure drawn again for its column
        "!document.body.classList.contains('dl-present') && document.querySelector("
        "'#tour-panel .js-plotly-plot').getBoundingClientRect().width < 1000",
        timeout=30_000,
    )
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
    # A bound on a hang, not a speed: under the suite's other worker this run took 2+ minutes
    page.get_by_text("✅ Done").wait_for(timeout=300_000)
    assert "lossy" in page.locator("#metrics").inner_text().lower()  # β = 4: never a tick
    assert "the tour stop's rule" in page.locator("#status").inner_text()  # its step, as the stop
    assert page.locator("#speculative-beta input[type=number]").input_value() == "4"
    page.wait_for_function("window.dlLanded > 0", timeout=30_000)  # once the run is done
    page.wait_for_function(  # it lands on the stop's view
        f"(s => {{ const r = document.querySelector(s).getBoundingClientRect();"
        f" return r.top >= -2 && r.bottom <= window.innerHeight + 2; }})('{LAND['relaxed']}')",
        timeout=10_000,
    )
    assert_no_error_badge(page)
    # Another method picked, not run: the views say they are the last run's, dimmed.
    page.evaluate("window.scrollTo(0, 0)")  # back up to the form from the landed view
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
    phone_page.goto(f"{server}?tour={KEYS.index('jacobi') + 1}")
    phone_page.locator("#tour-live").click()
    phone_page.get_by_text("✅ Done").wait_for(timeout=300_000)
    phone_page.wait_for_function("window.dlLanded > 0", timeout=30_000)
    phone_page.wait_for_function(
        f"(s => {{ const r = document.querySelector(s).getBoundingClientRect();"
        f" return r.top >= -2 && r.top < window.innerHeight / 2; }})('{LAND['jacobi']}')",
        timeout=10_000,
    )
    phone_page.get_by_role("tab", name="Learn").click()
    phone_page.locator("#learn-figure .js-plotly-plot").wait_for(timeout=30_000)
    assert phone_page.locator("#learn-method input").count() == 1  # a dropdown, not 17 radios
    settle(phone_page)
    assert layout_problems(phone_page, "#learn-figure") == []


def test_the_translation_lab_translates_a_typed_sentence_and_names_a_bad_one(
    server, page, phone_page
):
    """The Translation lab at 1440 and 390 px: every model's output beside the references, the
    iteration grid, the latents and the chart fit; a bad word is named and the last translation
    cleared; a typed sentence is translated."""
    for p, width in ((page, 1440), (phone_page, 390)):
        p.goto(server)
        p.get_by_role("tab", name="Translation lab").click()
        p.locator("#tl-outputs table").wait_for(timeout=30_000)
        p.locator("#tl-chart .js-plotly-plot").wait_for(timeout=30_000)
        settle(p)
        for part in ("#tl-outputs", "#tl-grid", "#tl-latents", "#tl-chart"):
            assert layout_problems(p, part) == [], (width, part)
        p.screenshot(path=str(ARTIFACTS / f"translation-{width}.png"), full_page=True)
    page.locator("#tl-source textarea").fill("w3 w1 w44 w2 w5")
    page.locator("#tl-go").click()
    page.locator("#tl-status").get_by_text("'w44' is not a source word").wait_for(timeout=30_000)
    assert page.locator("#tl-outputs tr").count() == 0  # the last sentence's results cleared
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
