"""/docs (Swagger UI) renders in a real headless Chromium against a real server with no network
but the server's own: its JavaScript and CSS come from the service (the fastapi-offline
package's files), not from a CDN (issue 42: /docs was a blank page offline)."""

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from search_page_screenshot import FLAGS

from tests.service.conftest import ServerThread
from tests.service.test_search_page_browser import browser_binaries

# Every host name but the server's address fails to resolve: a file asked of a CDN never loads.
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"


@pytest.fixture(scope="module")
def offline_browser() -> Iterator[WebDriver]:
    chromium, driver = browser_binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*FLAGS, "--window-size=1280,1000", OFFLINE):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


def resources(browser: WebDriver) -> list[str]:
    return browser.execute_script(
        "return performance.getEntriesByType('resource').map(entry => entry.name)"
    )


def test_swagger_ui_renders_the_operations_offline(
    offline_browser: WebDriver, server: ServerThread
) -> None:
    offline_browser.get(f"{server.url}/docs")
    paths = WebDriverWait(offline_browser, 60).until(
        lambda b: [e.text for e in b.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")]
    )
    assert "/search/text" in paths and "/search/image" in paths, paths
    assert offline_browser.find_element(By.CSS_SELECTOR, ".info .title").text.startswith(
        "probsearch"
    )
    loaded = resources(offline_browser)
    assert f"{server.url}/docs/assets/swagger-ui-bundle.js" in loaded, loaded
    assert all(url.startswith(f"{server.url}/") for url in loaded), loaded


def test_there_is_no_redoc_page_to_load_from_a_cdn(server: ServerThread) -> None:
    # ReDoc's bundle fetches its logo from cdn.redoc.ly: /docs is the one API page.
    assert httpx.get(f"{server.url}/redoc", timeout=30).status_code == 404
