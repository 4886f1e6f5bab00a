"""Regenerate the planner page's screenshots in ``docs/assets/screenshots/``.

    python3 docs/_scripts/screenshots.py

Starts ``pdplan serve`` on a free loopback port and headless Chromium (the browser test's own
``serve`` and ``chrome``: Debian's chromium and chromium-driver, and selenium), fills the plan the
docs describe and saves 1280-pixel-wide PNGs of the page. Writes:

- ``planner.png``: the form and the recommended deployment with its explanation;
- ``planner-plots.png``: the four figures;
- ``planner-candidates.png``: the candidates table;
- ``planner-error.png``: a 422 shown next to the field it names.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "docs" / "assets" / "screenshots"
sys.path.insert(0, str(REPO / "tests"))

from test_browser import (  # after the path insert: the tests folder is not a package
    Browser,
    chrome,
    fill,
    missing_browser,
    plan_form,
    serve,
    submit,
    wait_figures,
    wait_result,
)

WIDTH, HEIGHT = 1280, 900
MAX_BYTES = 300_000


def shot(driver, name: str, scroll_to: str | None = None) -> Path:
    """Save the viewport as ``name``.png, scrolled so that ``scroll_to`` (a CSS selector) is at the top."""
    if scroll_to:
        driver.execute_script("document.querySelector(arguments[0]).scrollIntoView({block: 'start'}); "
                              "window.scrollBy(0, -12)", scroll_to)
    else:
        driver.execute_script("window.scrollTo(0, 0)")
    path = OUT / f"{name}.png"
    driver.save_screenshot(str(path))
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise SystemExit(f"{path}: {size:,} bytes, over the {MAX_BYTES:,} the docs allow")
    print(f"{path.relative_to(REPO)}  {size / 1000:.0f} kB")
    return path


def main() -> None:
    reason = missing_browser()
    if reason:
        raise SystemExit(f"cannot take screenshots: {reason}")
    OUT.mkdir(parents=True, exist_ok=True)
    with serve() as base, chrome(WIDTH, HEIGHT) as driver:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",  # the viewport itself, not the window
                               {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})
        plan_form(Browser(driver, base))
        wait_figures(driver)
        shot(driver, "planner")
        shot(driver, "planner-plots", ".figures")
        shot(driver, "planner-candidates", "#candidates-panel")
        fill(driver, {"rate": "-1"})
        submit(driver)
        wait_result(driver, "error")
        shot(driver, "planner-error")


if __name__ == "__main__":
    main()
