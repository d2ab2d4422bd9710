"""A real headless browser for the run report: Debian's chromium, driven by Playwright (its
Python package; it downloads no browser of its own here). `make test` installs chromium where
apt can; without it, or without Playwright, the tests that need it are skipped, saying why."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def browser_missing() -> str | None:
    if CHROMIUM is None:
        return "no chromium on PATH (Debian: apt-get install chromium; `make test` does)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[test]')"
    return None


def open_report_or_skip(report: Path, screenshot: Path) -> PageCheck:
    """`open_report`, or skip the rest of the test (last in it: what came before stands),
    saying what is missing."""
    missing = browser_missing()
    if missing:
        pytest.skip(f"the report in a browser: {missing}")
    return open_report(report, screenshot)

# Each plotted series' number of points, from the page itself: a line is one path, "M x y" and
# then "L x y" for each further point.
_SERIES_POINTS = """() => Object.fromEntries([...document.querySelectorAll('g[id^="series-"]')]
    .map(g => [g.id.slice(7), (g.querySelector('path').getAttribute('d').match(/[ML]/g) || [])
    .length]))"""


@dataclass
class PageCheck:
    """What the browser saw of a report."""

    title: str
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # anything it fetched besides the page
    series_points: dict[str, int] = field(default_factory=dict)
    text: str = ""
    load_s: float = 0.0


def open_report(report: Path, screenshot: Path) -> PageCheck:
    """Load ``report`` in headless chromium, note every console error, failed script and
    request, count the points of each plot, and write a full-page screenshot."""
    from playwright.sync_api import sync_playwright

    url = report.resolve().as_uri()
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM,
                                         args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            check = PageCheck(title="")
            page.on("console", lambda message: check.console_errors.append(message.text)
                    if message.type == "error" else None)
            page.on("pageerror", lambda error: check.page_errors.append(str(error)))
            page.on("request", lambda request: check.requests.append(request.url)
                    if request.url != url else None)
            started = time.perf_counter()
            page.goto(url, wait_until="load")
            check.load_s = time.perf_counter() - started
            check.title = page.title()
            check.series_points = page.evaluate(_SERIES_POINTS)
            check.text = page.inner_text("body")
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return check
