"""Captions the model cannot read (issue 42): their unknown words come back with the answer,
and a caption of mostly unknown words is refused by the unknown_words score, with the caption
its typos corrected to search instead, through a real server and on the page in Chromium."""

import httpx
import pytest
from selenium.webdriver.common.by import By

from tests.service.conftest import Artifacts, ServerThread
from tests.service.test_search_page_browser import browser, search_caption, wait  # noqa: F401

NONSENSE = {
    "asdf qwerty": ["asdf", "qwerty"],
    "a pink hexagon": ["pink", "hexagon"],
    "ein roter Kreis": ["ein", "roter", "kreis"],
    "redd circel": ["redd", "circel"],
}


def test_training_writes_the_known_words(artifacts: Artifacts) -> None:
    assert (artifacts.model / "known_words.json").is_file()


@pytest.mark.parametrize("text", sorted(NONSENSE))
def test_a_caption_of_unknown_words_is_refused_and_says_which(
    client: httpx.Client, text: str
) -> None:
    query = client.post("/search/text", json={"text": text, "k": 3}).json()["query"]
    assert query["unknown_words"] == NONSENSE[text]
    assert query["rejected"] is True
    assert query["reject_score"] == {"name": "unknown_words", "value": 1.0, "threshold": 0.5}


def test_a_caption_of_typos_comes_back_corrected(client: httpx.Client) -> None:
    query = client.post("/search/text", json={"text": "Redd circel!", "k": 3}).json()["query"]
    assert query["did_you_mean"] == "red circle"
    corrected = client.post("/search/text", json={"text": "red circle", "k": 3}).json()["query"]
    assert corrected["unknown_words"] == [] and corrected["did_you_mean"] is None
    nonsense = client.post("/search/text", json={"text": "asdf qwerty", "k": 3}).json()["query"]
    assert nonsense["did_you_mean"] is None


def test_one_unknown_word_is_flagged_without_refusing(client: httpx.Client) -> None:
    query = client.post("/search/text", json={"text": "a red circle and a zebra", "k": 3}).json()
    assert query["query"]["unknown_words"] == ["zebra"]
    assert query["query"]["reject_score"]["name"] != "unknown_words"
    known = client.post("/search/text", json={"text": "a red circle", "k": 3}).json()
    assert known["query"]["unknown_words"] == []


def test_the_page_names_the_unknown_words(server: ServerThread, browser) -> None:  # noqa: F811
    browser.get(f"{server.url}/")
    wait(browser, lambda b: "Model " in b.find_element(By.ID, "footer-info").text)
    search_caption(browser, "redd circel", expected_cards=10)
    assert browser.find_element(By.ID, "unknown-words-list").text == "redd, circel"
    assert not browser.find_element(By.ID, "banner").get_attribute("hidden")
    assert "never met in training" in browser.find_element(By.ID, "banner-detail").text
    link = browser.find_element(By.ID, "did-you-mean-link")
    assert link.text == "red circle"
    link.click()  # searches the corrected caption
    wait(browser, lambda b: not b.find_element(By.ID, "unknown-words").is_displayed())
    assert browser.find_element(By.ID, "text").get_attribute("value") == "red circle"
    assert not browser.find_element(By.ID, "did-you-mean").is_displayed()
    search_caption(browser, "a red circle", expected_cards=10)
    assert not browser.find_element(By.ID, "unknown-words").is_displayed()
