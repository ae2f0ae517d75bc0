"""The built site opens in headless Chromium as a reader's browser would: the home page and a
benchmark page load, every image on them loads, and the console stays free of errors.

Runs in ``.venv-docs`` after ``make docs`` (``make test-docs``), against ``build/site`` served
on 127.0.0.1; Debian's ``chromium`` and ``chromium-driver`` drive it (``make system-deps``).
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

SITE = Path(__file__).resolve().parents[2] / "build" / "site"
PAGES = ["", "benchmarks/thesis_fmnist_e10/", "partitioners/"]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    assert (SITE / "index.html").exists(), f"no site at {SITE}: run `make docs` first"
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(SITE))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "install Debian's chromium and chromium-driver (make system-deps)"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(options=options, service=Service(driver))
    chrome.set_page_load_timeout(60)
    yield chrome
    chrome.quit()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p or "home")
def test_page_loads_with_its_images_and_no_console_errors(
    server: str, browser: webdriver.Chrome, page: str
) -> None:
    browser.get_log("browser")  # drop what an earlier page left
    browser.get(server + page)
    assert browser.execute_script("return document.readyState") == "complete"
    assert "fedbalance" in browser.title
    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.src, i.complete && i.naturalWidth > 0])"
    )
    assert images, f"{page or 'home'} shows no image"
    broken = [src for src, ok in images if not ok]
    assert broken == []
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
