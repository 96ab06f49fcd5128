"""The search page in a real headless Chromium (Debian's chromium and chromium-driver, which
scripts/bootstrap.sh installs) against a real server: what a person sees, checked against
what the JSON API answers for the same query. Screenshots go to a temporary folder, or to
$SEARCH_PAGE_SCREENSHOTS when set (docs/img/search-page.png in README.md is one)."""

import base64
import json
import math
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from indexer.store import open_version

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from search_page_screenshot import headless_chromium

from tests.service.conftest import (
    ADMIN_KEY,
    Artifacts,
    ServerThread,
    copy_index_root,
    make_settings,
    probsearch,
)

CAPTION = "a big red circle and a small blue square"
WIDE, NARROW = (1280, 1000), (390, 844)


def browser_binaries() -> tuple[str, str]:
    """Chromium and its driver; a failure (never a skip) when they are not installed."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail(
            "the browser test needs Debian's chromium and chromium-driver packages: run "
            "scripts/bootstrap.sh (it installs them) or apt-get install chromium chromium-driver"
        )
    return chromium, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    chrome = headless_chromium(WIDE, *browser_binaries())
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture(scope="module")
def server(
    artifacts: Artifacts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    """A server of its own, on a copy of the session's indexes calibrated by the CLI: the page
    then shows the calibrated threshold, as a deployed service's page would."""
    root = copy_index_root(artifacts, tmp_path_factory.mktemp("page") / "indexes")
    probsearch(
        "calibrate", "--data", artifacts.shapes, "--index-root", root, "--model", artifacts.model,
        "--target-coverage", "0.8", "--mc-samples", "8", "--metrics", "w2",
    )  # fmt: skip
    with ServerThread(make_settings(artifacts, index_root=root)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Iterator[httpx.Client]:
    """The JSON API of the page's server, to compare what the page shows with."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        yield http


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("SEARCH_PAGE_SCREENSHOTS")
    folder = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def page(browser: WebDriver, server: ServerThread) -> WebDriver:
    """The search page freshly loaded, its configuration read (the footer names the model)."""
    browser.set_window_size(*WIDE)
    browser.get(f"{server.url}/")
    wait(browser, lambda b: "Model " in b.find_element(By.ID, "footer-info").text)
    return browser


def picture_path(artifacts: Artifacts, row: int) -> Path:
    """The file of a picture of the session's image gallery."""
    index = open_version(artifacts.index_root / "image" / artifacts.image_v1)
    try:
        return Path(index.manifest.image_root) / index.metadata([row])[0]["uri"]
    finally:
        index.close()


def wait(browser: WebDriver, condition: Callable[[WebDriver], object], seconds: float = 60):
    return WebDriverWait(browser, seconds).until(condition)


def cards(browser: WebDriver, kind: str) -> list[WebElement]:
    return browser.find_elements(By.CSS_SELECTOR, f"#grid li.card-{kind}")


def search_caption(browser: WebDriver, text: str, expected_cards: int = 10) -> list[WebElement]:
    box = browser.find_element(By.ID, "text")
    box.clear()
    box.send_keys(text, Keys.ENTER)
    wait(browser, lambda b: len(cards(b, "text")) == expected_cards and "Searching" not in
         b.find_element(By.ID, "status").text)  # fmt: skip
    return cards(browser, "text")


def press(browser: WebDriver, *keys: str) -> None:
    """Keys pressed on whatever has the focus, as a person would."""
    ActionChains(browser).send_keys(*keys).perform()


def save(browser: WebDriver, folder: Path, name: str) -> Path:
    path = folder / name
    assert browser.save_screenshot(str(path)), path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return path


def three(value: float) -> str:
    """A number as the page writes it: three significant digits (JavaScript's toPrecision(3))."""
    return format(float(f"{value:.3g}"), "g")


def too_precise(text: str) -> list[str]:
    """The numbers in `text` written with more than three significant digits."""
    numbers = re.findall(r"\d+(?:\.\d+)?", text)
    return [n for n in numbers if len(n.replace(".", "").strip("0")) > 3]


def expected_percent(log_det: float, gallery: dict) -> int:
    span = gallery["log_det_high"] - gallery["log_det_low"]
    return round(100 * min(1.0, max(0.0, (log_det - gallery["log_det_low"]) / span)))


def test_a_caption_shows_thumbnails_with_uncertainty_bars(
    page: WebDriver, client: httpx.Client, server: ServerThread, screenshots: Path
) -> None:
    shown = search_caption(page, CAPTION)
    answer = client.post("/search/text", json={"text": CAPTION}).json()
    gallery = client.get("/v1/config").json()["galleries"]["image"]
    assert [card.get_attribute("data-id") for card in shown] == [h["id"] for h in answer["results"]]
    wait(page, lambda b: b.execute_script(
        "return [...document.querySelectorAll('img.thumb')]"
        ".every(img => img.complete && img.naturalWidth > 0)"))  # fmt: skip
    for card, hit in zip(shown, answer["results"], strict=True):
        image = card.find_element(By.CSS_SELECTOR, "img.thumb")
        assert image.get_attribute("alt") and image.is_displayed()
        assert card.find_element(By.CSS_SELECTOR, ".rank").text == f"#{hit['rank']}"
        bar = card.find_element(By.CSS_SELECTOR, ".uncertainty")
        percent = expected_percent(hit["log_det"], gallery)
        assert int(bar.get_attribute("data-percent")) == percent
        fill = card.find_element(By.CSS_SELECTOR, ".uncertainty-fill")
        assert fill.size["width"] == pytest.approx(bar.size["width"] * percent / 100, abs=1.5)
        assert "log det" in bar.get_attribute("title")
    assert page.find_element(By.ID, "banner").is_displayed() == answer["query"]["rejected"]
    served = answer["query"]["reject_score"]["name"]  # the page explains this score, no other
    gauge_text = page.find_element(By.ID, "gauge-text").text
    help_text = page.find_element(By.ID, "gauge-help").text
    assert served.replace("_", " ") in gauge_text + help_text, (served, gauge_text)
    if served not in ("mutual_information", "feature_uncertainty"):
        assert "MC dropout" not in help_text and "mutual information" not in help_text
    vagueness = page.find_element(By.ID, "vagueness")
    assert vagueness.is_displayed()
    assert page.find_element(By.ID, "vagueness-value").text == three(answer["query"]["log_det"])
    for text in (gauge_text, vagueness.text):
        assert not too_precise(text), text
    assert isinstance(answer["query"]["uninformative"], list)
    footer = page.find_element(By.ID, "footer-info").text
    assert answer["model"] in footer and answer["index_version"] in footer
    resources = page.execute_script(
        "return performance.getEntriesByType('resource').map(entry => entry.name)"
    )
    assert resources and all(url.startswith(f"{server.url}/") for url in resources), resources
    save(page, screenshots, "search-page.png")


def test_an_uploaded_image_shows_captions(
    page: WebDriver, client: httpx.Client, artifacts: Artifacts, screenshots: Path
) -> None:
    image_path = picture_path(artifacts, 0)
    page.find_element(By.ID, "image").send_keys(str(image_path))
    wait(page, lambda b: len(cards(b, "image")) == 10)
    with image_path.open("rb") as handle:
        files = {"image": (image_path.name, handle, "image/png")}
        answer = client.post("/search/image", files=files).json()
    captions = [c.find_element(By.CSS_SELECTOR, ".caption").text for c in cards(page, "image")]
    assert captions == [hit["metadata"]["text"] for hit in answer["results"]]
    assert all(captions)
    metric = page.find_element(By.ID, "metric")  # untouched: each gallery's default metric
    assert metric.get_attribute("value") == ""
    default = metric.find_elements(By.TAG_NAME, "option")[0].text
    assert default == f"default ({answer['metric']})"
    preview = page.find_element(By.ID, "query-preview")
    assert preview.is_displayed() and image_path.name in preview.get_attribute("alt")
    assert len(page.find_elements(By.CSS_SELECTOR, "#grid .uncertainty")) == 10
    save(page, screenshots, "search-page-image.png")


def test_the_metric_menu_offers_exactly_the_metrics_the_api_accepts(
    page: WebDriver, client: httpx.Client
) -> None:
    """Issue 42.3: the page's menu is /v1/config's list (after "default"), which is what the
    API accepts. This server's versions are indexed for w2, kl, kl_reverse and min_kl but
    calibrated for w2 only, so w2 is the whole list and kl is refused, saying why."""
    config = client.get("/v1/config").json()
    assert config["metrics"] == ["w2"]
    options = page.find_elements(By.CSS_SELECTOR, "#metric option")
    assert options[0].get_attribute("value") == ""  # each gallery's default
    assert [o.get_attribute("value") for o in options[1:]] == config["metrics"]
    for option in options[1:]:
        Select(page.find_element(By.ID, "metric")).select_by_value(option.get_attribute("value"))
        search_caption(page, CAPTION)
        assert page.find_element(By.ID, "error").get_attribute("hidden") is not None
    refused = client.post("/search/text", json={"text": CAPTION, "metric": "kl"})
    assert refused.status_code == 422
    assert "not calibrated" in refused.json()["detail"]
    assert refused.json()["detail"].endswith("; served: w2")


def test_a_rejected_query_shows_the_banner_above_its_results(
    page: WebDriver, client: httpx.Client, screenshots: Path
) -> None:
    # A threshold below the query's own score, whatever score calibration chose (a log-det
    # is negative).
    plain = client.post("/search/text", json={"text": CAPTION}).json()["query"]["reject_score"]
    threshold = math.floor(plain["value"]) - 1
    summary = page.find_element(By.CSS_SELECTOR, "details.advanced summary")
    summary.send_keys(Keys.ENTER)  # opens the advanced options from the keyboard
    page.find_element(By.ID, "reject-threshold").send_keys(str(threshold))
    search_caption(page, CAPTION)
    own = {"text": CAPTION, "reject_threshold": threshold}
    answer = client.post("/search/text", json=own).json()
    assert answer["query"]["rejected"], f"the API does not reject with threshold {threshold}"
    wait(page, lambda b: b.find_element(By.ID, "banner").is_displayed())
    assert "not confident in these results" in page.find_element(By.ID, "banner").text
    assert "over" in page.find_element(By.ID, "gauge").get_attribute("class")
    assert f"above the threshold {three(threshold)}" in page.find_element(By.ID, "gauge-text").text
    assert len(cards(page, "text")) == 10 and all(c.is_displayed() for c in cards(page, "text"))
    save(page, screenshots, "search-page-rejected.png")


def test_api_errors_are_shown_as_readable_messages(
    page: WebDriver, tmp_path: Path, screenshots: Path
) -> None:
    page.find_element(By.ID, "text").send_keys("a red circle " * 40, Keys.ENTER)  # > 500 chars
    wait(page, lambda b: b.find_element(By.ID, "error").is_displayed())
    message = page.find_element(By.ID, "error").text
    assert "422" in message and "the limit is 500" in message
    not_image = tmp_path / "notes.png"
    not_image.write_text("these are notes, not pixels")
    page.find_element(By.ID, "image").send_keys(str(not_image))
    wait(page, lambda b: "415" in b.find_element(By.ID, "error").text)
    assert "not in an image format" in page.find_element(By.ID, "error").text
    save(page, screenshots, "search-page-error.png")


def test_the_page_works_with_the_keyboard_alone(page: WebDriver) -> None:
    order = []
    for _ in range(8):
        press(page, Keys.TAB)
        element = page.switch_to.active_element
        order.append(element.get_attribute("id") or element.tag_name)
    expected = ["text", "text-submit", "image", "metric", "k", "summary"]
    assert [item for item in order if item in expected] == expected, order
    page.find_element(By.ID, "text").send_keys(CAPTION, Keys.ENTER)
    wait(page, lambda b: len(cards(b, "text")) == 10)
    first_bar = page.find_element(By.CSS_SELECTOR, "#grid .uncertainty")
    tooltip = first_bar.find_element(By.CSS_SELECTOR, ".tooltip")
    assert not tooltip.is_displayed()
    for _ in range(12):  # from the text box, past the other controls, to the first bar
        press(page, Keys.TAB)
        if page.switch_to.active_element == first_bar:
            break
    assert page.switch_to.active_element == first_bar
    assert tooltip.is_displayed() and "gallery's range" in tooltip.text


def test_a_phone_screen_needs_no_sideways_scrolling(page: WebDriver, screenshots: Path) -> None:
    page.set_window_size(*NARROW)
    search_caption(page, CAPTION)
    widths = page.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], widths
    first = cards(page, "text")[0].find_element(By.CSS_SELECTOR, "img.thumb")
    assert first.size["width"] >= 100
    save(page, screenshots, "search-page-narrow.png")


def test_the_named_reject_score_is_shown_when_the_api_sends_one(page: WebDriver) -> None:
    # The response names its calibrated score in query.reject_score (DESIGN section 5); a
    # service without that field is read as MI against reject_threshold.
    score = {"name": "posterior_entropy", "value": 0.9, "threshold": 0.5}
    query = {"modality": "text", "rejected": True, "mutual_information": 0.001,
             "reject_threshold": 0.002, "shortlist_size": 100, "reject_score": score}  # fmt: skip
    page.execute_script("showVerdict(arguments[0])", query)
    assert page.find_element(By.ID, "gauge-text").text == (
        "posterior entropy 0.9 above the threshold 0.5"
    )
    assert page.find_element(By.ID, "banner").is_displayed()
    assert "posterior entropy 0.9" in page.find_element(By.ID, "banner").text
    page.execute_script(
        "showVerdict(arguments[0])", {**query, "reject_score": None, "rejected": False}
    )
    assert page.find_element(By.ID, "gauge-text").text == (
        "mutual information 0.001 within the threshold 0.002"
    )
    assert not page.find_element(By.ID, "banner").is_displayed()


def test_a_negative_reject_score_above_its_threshold_fills_past_the_mark(page: WebDriver):
    # A log-det (the gate for unfamiliar images) is negative: the gauge still puts the
    # threshold in the middle and a rejected score past it, an accepted one before it.
    score = {"name": "log_det", "value": -105.0, "threshold": -120.0}
    query = {"modality": "image", "rejected": True, "mutual_information": None,
             "reject_threshold": -120.0, "shortlist_size": 100, "reject_score": score}  # fmt: skip
    for value, rejected in ((-105.0, True), (-150.0, False)):
        shown = {**query, "rejected": rejected, "reject_score": {**score, "value": value}}
        page.execute_script("showVerdict(arguments[0])", shown)
        fill = page.execute_script("return parseFloat($('gauge-fill').style.width)")
        mark = page.execute_script("return parseFloat($('gauge-mark').style.left)")
        assert mark == 50.0
        assert (fill > mark) is rejected, (fill, mark)


def test_numbers_are_rounded_and_the_gate_is_explained_in_words(page: WebDriver) -> None:
    # The demo's photographs were refused with "Its log det -110.9661 is above the threshold
    # -119.8438" and thresholds printed as 278.8619279107541 (issue 42).
    score = {"name": "log_det", "value": -110.9661, "threshold": -119.8438}
    query = {"modality": "image", "rejected": True, "log_det": -110.9661, "shortlist_size": 100,
             "reject_threshold": -119.8438, "reject_score": score, "uninformative": []}  # fmt: skip
    page.execute_script("showVerdict(arguments[0])", query)
    banner = page.find_element(By.ID, "banner").text
    assert "-111 is above the threshold -120" in banner, banner
    assert "unsure what this query shows" in banner
    assert page.find_element(By.ID, "gauge-text").text == (
        "vagueness (log det) -111 above the threshold -120"
    )
    assert page.find_element(By.ID, "vagueness-value").text == "-111"
    top = {"name": "top_mahalanobis", "value": 278.8619279107541, "threshold": 278.8619279107541}
    page.execute_script(
        "showVerdict(arguments[0])", {**query, "rejected": False, "reject_score": top}
    )
    assert page.find_element(By.ID, "gauge-text").text == (
        "top mahalanobis 279 within the threshold 279"
    )
    help_text = page.find_element(By.ID, "gauge-help").text
    assert "does not fit the query" in help_text and "MC dropout" not in help_text
    for element_id in ("gauge-text", "gauge-help", "banner", "vagueness"):
        text = page.find_element(By.ID, element_id).get_attribute("textContent")
        assert not too_precise(text), (element_id, text)


def test_a_score_without_information_is_not_shown(page: WebDriver) -> None:
    # A posterior uniform over the shortlist has entropy ln(100) = 4.605 for every query.
    score = {"name": "posterior_entropy", "value": math.log(100), "threshold": 4.0}
    query = {"modality": "text", "rejected": True, "log_det": -50.0, "shortlist_size": 100,
             "reject_threshold": 4.0, "reject_score": score,
             "uninformative": ["posterior_entropy"]}  # fmt: skip
    page.execute_script("showVerdict(arguments[0])", query)
    text = page.find_element(By.ID, "gauge-text").text
    assert text == "posterior entropy: carries no information for this query, so it is not shown"
    assert "4.6" not in page.find_element(By.ID, "verdict").text
    assert not page.find_element(By.ID, "gauge-fill").is_displayed()


# ----- issue 43.5: the filter box and "delete from gallery" ---------------------------------


def shown_ids(browser: WebDriver, kind: str = "text") -> list[str]:
    """The ids of the results shown, read at once (cards removed meanwhile never go stale)."""
    return browser.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(card => card.dataset.id)",
        f"#grid li.card-{kind}",
    )


def status_text(browser: WebDriver) -> str:
    return browser.find_element(By.ID, "status").text


def set_filter(browser: WebDriver, text: str) -> None:
    box = browser.find_element(By.ID, "filter")
    box.clear()
    box.send_keys(text)


def test_the_filter_box_reads_plain_conditions_and_json(page: WebDriver) -> None:
    def parse(text: str) -> object:
        return page.execute_script("return parseFilter(arguments[0])", text)

    assert parse("  ") is None
    assert parse("split: test") == {"split": "test"}
    assert parse("labels: red circle, blue square; split = test\nindex >= 10; index < 20") == {
        "labels": {"in": ["red circle", "blue square"]},
        "split": "test",
        "index": {"gte": 10, "lt": 20},
    }
    assert parse('year: 2020 or "2021"; flag: true; id: 7') == {
        "year": {"in": [2020, "2021"]},
        "flag": True,
        "id": "7",  # ids are strings
    }
    assert parse('{"split": {"in": ["val", "test"]}}') == {"split": {"in": ["val", "test"]}}
    for wrong in ("split test", "split:", "my field: x", "index >= ten", "split: a; split: b"):
        message = page.execute_script(
            "try { parseFilter(arguments[0]); return null } catch (e) { return e.message }", wrong
        )
        assert message, wrong


def test_a_filter_restricts_the_results_and_shows_how_many_items_matched(
    page: WebDriver, client: httpx.Client
) -> None:
    set_filter(page, "split: test")
    shown = search_caption(page, CAPTION)
    wait(page, lambda b: "match the filter" in status_text(b))
    answer = client.post("/search/text", json={"text": CAPTION, "filter": {"split": "test"}})
    answer = answer.json()
    everything = client.get("/v1/config").json()["galleries"]["image"]["count"]
    assert 10 <= answer["matched"] < everything
    assert [card.get_attribute("data-id") for card in shown] == [h["id"] for h in answer["results"]]
    assert all(hit["metadata"]["extra"]["split"] == "test" for hit in answer["results"])
    assert f"{answer['matched']} items match the filter." in status_text(page)
    unfiltered = client.post("/search/text", json={"text": CAPTION}).json()["results"]
    assert [h["id"] for h in unfiltered] != [h["id"] for h in answer["results"]]
    # A power user's JSON filter is sent as it is; a filter that matches fewer than k items
    # returns those items only.
    label = answer["results"][0]["metadata"]["extra"]["labels"][0]
    own = {"split": "test", "labels": label}
    few = client.post("/search/text", json={"text": CAPTION, "filter": own}).json()
    assert few["matched"] < 10
    set_filter(page, json.dumps(own))
    page.find_element(By.ID, "filter").send_keys(Keys.ENTER)  # Enter applies it to the query
    wait(page, lambda b: len(cards(b, "text")) == few["matched"])
    wait(page, lambda b: matched_phrase(few["matched"]) in status_text(b))
    assert set(shown_ids(page)) == {h["id"] for h in few["results"]}
    set_filter(page, "")
    page.find_element(By.ID, "filter-submit").click()
    wait(page, lambda b: len(cards(b, "text")) == 10 and "match" not in status_text(b))


def matched_phrase(count: int) -> str:
    return "1 item matches" if count == 1 else f"{count} items match"


def test_an_image_search_sends_its_filter(
    page: WebDriver, client: httpx.Client, artifacts: Artifacts
) -> None:
    image_path = picture_path(artifacts, 0)
    set_filter(page, "split: val")
    page.find_element(By.ID, "image").send_keys(str(image_path))
    wait(page, lambda b: "match the filter" in status_text(b))
    body = {
        "image_base64": base64.b64encode(image_path.read_bytes()).decode(),
        "filter": {"split": "val"},
    }
    answer = client.post("/search/image", json=body).json()
    assert f"{answer['matched']} items match the filter." in status_text(page)
    assert shown_ids(page, "image") == [hit["id"] for hit in answer["results"]]
    assert all(hit["metadata"]["extra"]["split"] == "val" for hit in answer["results"])


def test_a_malformed_filter_shows_a_readable_error(page: WebDriver) -> None:
    box = page.find_element(By.ID, "filter")
    error = page.find_element(By.ID, "error")
    set_filter(page, "split test")  # no ":": the page says so before sending anything
    page.find_element(By.ID, "text").send_keys(CAPTION, Keys.ENTER)
    wait(page, lambda b: error.is_displayed())
    assert "The filter could not be read" in error.text and "split: test" in error.text
    assert box.get_attribute("aria-invalid") == "true"
    assert not cards(page, "text")
    # A filter the page can read but the service refuses: its 422, in words.
    set_filter(page, '{"labels": {"gte": 1, "gt": 2}}')
    assert box.get_attribute("aria-invalid") is None  # typing clears the mark
    box.send_keys(Keys.ENTER)
    wait(page, lambda b: "refused the filter" in error.text)
    assert "not both" in error.text and "labels" in error.text, error.text
    assert "[object" not in error.text and box.get_attribute("aria-invalid") == "true"
    # An empty range is a valid filter that no item matches: no error, no results.
    set_filter(page, "labels >= 20; labels <= 10")
    box.send_keys(Keys.ENTER)
    status = page.find_element(By.ID, "status")
    wait(page, lambda b: "No item matches" in status.text and not error.is_displayed())
    set_filter(page, '{"labels": {"in": []}}')
    box.send_keys(Keys.ENTER)
    wait(page, lambda b: "non-empty list" in error.text)
    assert "refused the filter" in error.text
    set_filter(page, "split: test")
    box.send_keys(Keys.ENTER)
    wait(page, lambda b: len(cards(b, "text")) == 10 and not error.is_displayed())


def delete_buttons(browser: WebDriver) -> list[WebElement]:
    return browser.find_elements(By.CSS_SELECTOR, "#grid li.card button.delete")


def set_admin_key(browser: WebDriver, key: str) -> None:
    details = browser.find_element(By.CSS_SELECTOR, "details.advanced")
    if details.get_attribute("open") is None:
        details.find_element(By.TAG_NAME, "summary").click()
    box = browser.find_element(By.ID, "admin-key")
    box.clear()
    box.send_keys(key)
    if not key:  # clear() fires no input event
        box.send_keys("x", Keys.BACKSPACE)


def confirm_delete(browser: WebDriver, card: WebElement) -> None:
    card.find_element(By.CSS_SELECTOR, "button.delete").click()
    card.find_element(By.CSS_SELECTOR, "button.confirm-delete").click()


def test_an_admin_deletes_a_result_and_a_repeat_search_no_longer_returns_it(
    page: WebDriver, client: httpx.Client, screenshots: Path
) -> None:
    admin = {"X-API-Key": ADMIN_KEY}
    try:
        box = page.find_element(By.ID, "admin-key")
        assert box.get_attribute("type") == "password"
        set_admin_key(page, ADMIN_KEY)
        stored = "return [sessionStorage.getItem('probsearch-admin-key'), localStorage.length]"
        assert page.execute_script(stored) == [ADMIN_KEY, 0]
        shown = search_caption(page, CAPTION)
        assert len(delete_buttons(page)) == 10
        first, second, third = (card.get_attribute("data-id") for card in shown[:3])
        # Asked first; Cancel (here Escape) deletes nothing.
        shown[0].find_element(By.CSS_SELECTOR, "button.delete").click()
        confirm = shown[0].find_element(By.CSS_SELECTOR, ".confirm")
        assert first in confirm.text and "cannot be undone" in confirm.text
        assert page.switch_to.active_element.text == "Cancel"
        press(page, Keys.ESCAPE)
        assert not shown[0].find_elements(By.CSS_SELECTOR, ".confirm")
        assert len(cards(page, "text")) == 10
        page.set_window_size(*NARROW)  # the question fits a phone's card
        shown[0].find_element(By.CSS_SELECTOR, "button.delete").click()
        widths = page.execute_script(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert widths[0] <= widths[1], widths
        save(page, screenshots, "search-page-delete-narrow.png")
        page.set_window_size(*WIDE)
        shown[0].find_element(By.CSS_SELECTOR, "button.confirm-delete").click()
        wait(page, lambda b: first not in shown_ids(b))
        notice = page.find_element(By.ID, "notice")
        assert f"Deleted {first} from the image index" in notice.text
        assert len(cards(page, "text")) == 9
        again = search_caption(page, CAPTION)
        assert first not in [card.get_attribute("data-id") for card in again]
        answer = client.post("/search/text", json={"text": CAPTION, "k": 50}).json()
        assert first not in [hit["id"] for hit in answer["results"]]
        gone = client.delete(f"/v1/items/{first}", params={"gallery": "image"}, headers=admin)
        assert gone.status_code == 404
        # A wrong key: 401 in words, and the result stays.
        set_admin_key(page, "not-the-admin-key")
        card = next(c for c in cards(page, "text") if c.get_attribute("data-id") == second)
        confirm_delete(page, card)
        error = page.find_element(By.ID, "error")
        wait(page, lambda b: error.is_displayed())
        assert "admin key was refused" in error.text and "401" in error.text, error.text
        assert second in shown_ids(page)
        assert second in [h["id"] for h in client.post("/search/text", json={"text": CAPTION,
                          "k": 50}).json()["results"]]  # fmt: skip
        # Deleted meanwhile by someone else: 404, said so, and taken off the list.
        set_admin_key(page, ADMIN_KEY)
        deleted = client.delete(f"/v1/items/{third}", params={"gallery": "image"}, headers=admin)
        assert deleted.status_code == 200, deleted.text
        card = next(c for c in cards(page, "text") if c.get_attribute("data-id") == third)
        confirm_delete(page, card)
        wait(page, lambda b: "deleted already" in b.find_element(By.ID, "notice").text)
        assert third not in shown_ids(page)
        # Without the key, the buttons go.
        set_admin_key(page, "")
        assert not delete_buttons(page) and len(cards(page, "text")) == 9
        assert page.execute_script(stored) == [None, 0]
    finally:
        page.execute_script("sessionStorage.clear()")


def test_without_an_admin_key_no_delete_buttons_are_shown(
    page: WebDriver, artifacts: Artifacts
) -> None:
    assert page.execute_script("return sessionStorage.length + localStorage.length") == 0
    assert page.find_element(By.ID, "admin-key").get_attribute("value") == ""
    search_caption(page, CAPTION)
    assert not delete_buttons(page)
    assert not page.find_elements(By.CSS_SELECTOR, "#grid .admin")
    image_path = picture_path(artifacts, 1)
    page.find_element(By.ID, "image").send_keys(str(image_path))
    wait(page, lambda b: len(cards(b, "image")) == 10)
    assert not delete_buttons(page)
