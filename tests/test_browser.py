"""The page in a real headless Chromium (Debian's, driven by Playwright): run and watch tokens stream."""

import os
import shutil
import time

import pytest
from conftest import ARTIFACTS

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def page():
    if not shutil.which(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: scripts/ensure-chromium.sh installs it")
        pytest.skip(f"{CHROMIUM} not installed (run scripts/ensure-chromium.sh)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        yield page
        browser.close()


def test_run_streams_tokens_in_the_page(server, page):
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(server)
    page.get_by_label("Prompt").fill("def fibonacci(n):")
    output = page.get_by_label("Output")
    clicked = time.perf_counter()
    page.get_by_role("button", name="Run").click()
    page.wait_for_function("el => el.value.length > 0", arg=output.element_handle(), timeout=30_000)
    first_token_s = time.perf_counter() - clicked
    print(f"first streamed token visible after {first_token_s:.2f} s")
    page.get_by_text('"finish_reason"').wait_for(timeout=60_000)
    assert output.input_value()
    page.screenshot(path=str(ARTIFACTS / "app-run.png"), full_page=True)
