"""Searcher.params and check_text: the one place a request's options meet the limits and get
their defaults."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from models.settings import Settings
from service.errors import InvalidQueryError
from service.searcher import Searcher

LIMITS = Settings(max_k=50, max_shortlist=300, max_mc_samples=20, mc_samples=8, max_text_chars=12)


def searcher(settings: Settings = LIMITS) -> Searcher:
    return Searcher(
        None,  # type: ignore[arg-type]  # params never reaches the versions
        {},
        default_metrics={"image": "kl", "text": "w2"},
        settings=settings,
        model_name="test",
        device=torch.device("cpu"),
    )


def test_defaults_are_filled_in_from_the_gallery_and_the_settings() -> None:
    params = searcher().params("image")
    assert (params.k, params.metric, params.shortlist, params.mc_samples) == (10, "kl", 100, 8)
    assert params.temperature is None and params.reject_threshold is None
    assert searcher().params("text").metric == "w2"
    chosen = searcher().params("image", k=3, metric="js", shortlist=7, mc_samples=0)
    assert (chosen.k, chosen.metric, chosen.shortlist, chosen.mc_samples) == (3, "js", 7, 0)


@given(st.integers(1, 50))
def test_the_default_shortlist_is_ten_k_within_the_limit_and_never_below_k(k: int) -> None:
    assert searcher().params("image", k=k).shortlist == max(k, min(max(10 * k, 100), 300))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"k": 51}, "k=51 is above the limit 50"),
        ({"shortlist": 301}, "shortlist=301 is above the limit 300"),
        ({"k": 20, "shortlist": 19}, "shortlist=19 is smaller than k=20"),
        ({"mc_samples": 21}, "mc_samples=21 is above the limit 20"),
    ],
)
def test_options_beyond_the_limits_are_refused_with_the_limit(options, message) -> None:
    with pytest.raises(InvalidQueryError, match=message):
        searcher().params("image", **options)


@pytest.mark.parametrize(
    ("text", "message"), [(" \n\t", "text is empty"), ("x" * 13, "13 characters; the limit is 12")]
)
def test_captions_must_have_a_word_and_fit_the_limit(text: str, message: str) -> None:
    with pytest.raises(InvalidQueryError, match=message):
        searcher().check_text(text)
    searcher().check_text("x" * 12)
