"""Searcher.params and check_text: the one place a request's options meet the limits and the
metrics the pinned version serves, and get their defaults."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from indexer.manifest import Calibration
from models.settings import Settings
from service.errors import InvalidQueryError
from service.index_holder import LoadedIndex
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


class StubIndex:
    """What the metric rule reads of a version: its manifest's metrics and calibration, the
    families it can shortlist and whether it has a pvse K-vector index."""

    def __init__(self, metrics, calibrated=(), families=None, multivector=False) -> None:
        self.manifest = SimpleNamespace(
            metrics=tuple(metrics),
            calibration={
                m: Calibration(threshold=1.0 if m in calibrated else None) for m in metrics
            },
        )
        self.families = set(families if families is not None else metrics)
        self.multivector = object() if multivector else None

    def supports(self, metric: str) -> bool:
        return metric in self.families


def version(*args, **kwargs) -> LoadedIndex:
    return LoadedIndex("image", "v7", StubIndex(*args, **kwargs))  # type: ignore[arg-type]


def refusal(loaded: LoadedIndex, **options) -> str:
    with pytest.raises(InvalidQueryError) as refused:
        searcher().params("image", loaded, **options)
    return str(refused.value)


def test_a_version_without_calibration_serves_every_metric_it_was_indexed_for() -> None:
    loaded = version(["w2", "kl", "min_kl"])
    assert searcher().available_metrics(loaded) == ["w2", "kl", "min_kl"]
    assert searcher().params("image", loaded, metric="min_kl").metric == "min_kl"
    assert searcher().params("image", loaded).metric == "kl"  # the gallery's default


def test_once_calibrated_a_version_serves_only_its_calibrated_metrics() -> None:
    loaded = version(["w2", "kl", "min_kl"], calibrated=["w2", "min_kl"])
    assert searcher().available_metrics(loaded) == ["w2", "min_kl"]
    message = refusal(loaded, metric="kl")
    assert "'kl' is not calibrated in the active image version v7" in message
    assert "probsearch calibrate --gallery image --metrics kl" in message
    assert message.endswith("; served: w2, min_kl")
    assert "the default metric 'kl' (none was named) is not calibrated" in refusal(loaded)


def test_metrics_not_indexed_unknown_or_reranked_only_are_refused_with_the_list() -> None:
    loaded = version(["w2"])  # elk could be re-ranked from the w2 shortlist, but was not asked
    assert searcher().available_metrics(loaded) == ["w2"]
    for metric in ("elk", "mahalanobis", "kl"):
        message = refusal(loaded, metric=metric)
        assert f"metric {metric!r} is not indexed by the active image version v7" in message
        assert message.endswith("; served: w2")
    assert refusal(loaded, metric="cosine") == "unknown metric 'cosine'; served: w2"
    assert "only a version built from a pvse model" in refusal(loaded, metric="max_pair")
    assert "x" * 40 + "...'" in refusal(loaded, metric="x" * 10_000)  # not echoed whole


def test_a_reranked_metric_the_version_lists_is_served_from_its_candidate_index() -> None:
    assert searcher().available_metrics(version(["w2", "elk"], families=["w2"])) == ["w2", "elk"]
    assert searcher().available_metrics(version(["csd", "elk"], families=["csd"])) == ["csd"]


def test_max_pair_of_a_pvse_version_is_served_whatever_the_calibration() -> None:
    loaded = version(["w2"], calibrated=["w2"], multivector=True)
    assert searcher().available_metrics(loaded) == ["w2", "max_pair"]
    assert searcher().params("image", loaded, metric="max_pair").metric == "max_pair"
