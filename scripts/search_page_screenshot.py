"""Screenshot of the search page of a running service answering one caption, in Debian's
headless Chromium: the README's picture of the demo.

    .venv/bin/probsearch demo &                  # serves http://127.0.0.1:8000
    .venv/bin/python scripts/search_page_screenshot.py --caption "a drawing of a penguin" \\
        --out docs/img/search-page-clipart.png
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
    "--force-device-scale-factor=1", "--lang=en-US", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip


def headless_chromium(window: tuple[int, int], chromium: str, driver: str) -> webdriver.Chrome:
    """Debian's Chromium, headless, driven by its chromedriver (the browser test uses it too)."""
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*FLAGS, f"--window-size={window[0]},{window[1]}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--caption", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", default="1280,1000", help="window width,height")
    args = parser.parse_args()
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        raise SystemExit("needs Debian's chromium and chromium-driver (scripts/bootstrap.sh)")
    width, height = (int(x) for x in args.size.split(","))
    browser = headless_chromium((width, height), chromium, driver)
    try:
        browser.get(f"{args.url}/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: "Model " in b.find_element(By.ID, "footer-info").text)
        browser.find_element(By.ID, "text").send_keys(args.caption, Keys.ENTER)
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#grid li.card-text img"))
        wait.until(lambda b: all(img.get_property("complete") for img in
                                 b.find_elements(By.CSS_SELECTOR, "#grid img")))  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(args.out))
    finally:
        browser.quit()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
