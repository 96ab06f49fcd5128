"""QueryInfo.uninformative: the scores that say nothing about a query are marked (issue 42:
posterior_entropy was ln(100) for every query, and MI 0 for a model whose draws are one)."""

import math

from service.outcome import UNIFORM_NATS, uninformative


def scores(**values: float | None) -> dict[str, float | None]:
    base = {"posterior_entropy": 1.0, "mutual_information": 0.2, "feature_uncertainty": 0.5}
    return {**base, **values}


def test_informative_scores_are_not_marked() -> None:
    assert uninformative(scores(), mc_samples=8, shortlist_size=100) == []


def test_a_uniform_posterior_marks_its_entropy() -> None:
    uniform = scores(posterior_entropy=math.log(100) - UNIFORM_NATS / 2)
    assert uninformative(uniform, 8, 100) == ["posterior_entropy"]
    assert uninformative(scores(posterior_entropy=0.0), 8, 1) == ["posterior_entropy"]
    peaked = scores(posterior_entropy=math.log(100) - 0.5)
    assert uninformative(peaked, 8, 100) == []


def test_draws_that_are_all_the_same_mark_mi_and_feature_uncertainty() -> None:
    same = scores(mutual_information=0.0, feature_uncertainty=0.0)
    assert uninformative(same, 8, 100) == ["mutual_information", "feature_uncertainty"]
    assert uninformative(scores(), 1, 100) == ["mutual_information", "feature_uncertainty"]
    # Not computed (mc_samples 0): null, which already says so.
    absent = scores(mutual_information=None, feature_uncertainty=None)
    assert uninformative(absent, 0, 100) == []
