"""Rejection metrics against brute force: explicit sorting, all tie orders, the trapezoid rule."""

import itertools

import numpy as np
import pytest
from scipy.stats import spearmanr

from models.evaluation.rejection_metrics import (
    PrecisionCoverage,
    accuracy_by_decile,
    auroc,
    normalized_auprc,
    oracle_rejection,
    precision_coverage,
    random_rejection,
    rejection_summary,
    spearman,
)


def brute_precision_distinct(uncertainty: np.ndarray, correct: np.ndarray) -> list[float]:
    kept_order = sorted(range(uncertainty.size), key=lambda q: uncertainty[q])
    return [
        sum(bool(correct[q]) for q in kept_order[:k]) / k for k in range(1, uncertainty.size + 1)
    ]


def brute_precision_expected_over_ties(uncertainty: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """Average the curve over every order that keeps queries by non-decreasing uncertainty."""
    curves = []
    for order in itertools.permutations(range(uncertainty.size)):
        if all(uncertainty[a] <= uncertainty[b] for a, b in itertools.pairwise(order)):
            hits = np.cumsum([correct[q] for q in order])
            curves.append(hits / np.arange(1, uncertainty.size + 1))
    return np.mean(curves, axis=0)


def test_curve_matches_sorting_when_uncertainties_differ() -> None:
    rng = np.random.default_rng(0)
    uncertainty, correct = rng.random(40), rng.random(40) < 0.5
    curve = precision_coverage(uncertainty, correct)
    assert curve.precision.tolist() == pytest.approx(brute_precision_distinct(uncertainty, correct))
    assert curve.coverage.tolist() == pytest.approx([k / 40 for k in range(1, 41)])


def test_ties_give_the_expected_precision_of_a_random_order() -> None:
    uncertainty = np.array([0.2, 0.1, 0.2, 0.2, 0.5, 0.1, 0.5])
    correct = np.array([True, False, False, True, True, True, False])
    curve = precision_coverage(uncertainty, correct)
    expected = brute_precision_expected_over_ties(uncertainty, correct)
    assert curve.precision == pytest.approx(expected)


def test_constant_uncertainty_is_exactly_random_rejection() -> None:
    correct = np.random.default_rng(1).random(50) < 0.3
    constant = precision_coverage(np.full(50, 4.2), correct)
    random = random_rejection(correct)
    assert constant.precision == pytest.approx(random.precision)
    assert random.precision == pytest.approx(np.full(50, correct.mean()))
    assert random.auprc == pytest.approx(correct.mean())


def test_auprc_is_the_trapezoid_area_over_the_coverage_span() -> None:
    curve = PrecisionCoverage(np.array([1 / 3, 2 / 3, 1.0]), np.array([1.0, 0.5, 2 / 3]))
    area = (1 / 3) * (1.0 + 0.5) / 2 + (1 / 3) * (0.5 + 2 / 3) / 2
    assert curve.auprc == pytest.approx(area / (2 / 3))
    rng = np.random.default_rng(2)
    long_curve = precision_coverage(rng.random(200), rng.random(200) < 0.4)
    span = 1 - 1 / 200
    trapezoid = np.trapezoid(long_curve.precision, long_curve.coverage)
    assert long_curve.auprc == pytest.approx(trapezoid / span)


def test_an_informative_uncertainty_beats_random_and_a_misleading_one_loses() -> None:
    rng = np.random.default_rng(3)
    correct = rng.random(300) < 0.4
    informative = np.where(correct, 0.0, 1.0) + 0.5 * rng.random(300)
    misleading = -informative
    chance = random_rejection(correct).auprc
    assert precision_coverage(informative, correct).auprc > chance + 0.2
    assert precision_coverage(misleading, correct).auprc < chance - 0.1


def test_deciles_split_evenly_and_match_a_loop() -> None:
    rng = np.random.default_rng(4)
    uncertainty, correct = rng.random(95), rng.random(95) < 0.5
    deciles = accuracy_by_decile(uncertainty, correct)
    assert deciles.count.sum() == 95 and deciles.count.max() - deciles.count.min() <= 1
    order = np.argsort(uncertainty)
    start = 0
    for b in range(10):
        members = order[start : start + deciles.count[b]]
        assert deciles.accuracy[b] == pytest.approx(correct[members].mean())
        assert deciles.mean_uncertainty[b] == pytest.approx(uncertainty[members].mean())
        start += deciles.count[b]


def test_summary_has_every_score_plus_random_and_oracle() -> None:
    rng = np.random.default_rng(5)
    correct = rng.random(500) < 0.3
    summary = rejection_summary({"log_det": rng.random(500)}, correct, curve_points=51)
    assert set(summary) == {"log_det", "random", "oracle"}
    assert summary["random"]["auprc"] == pytest.approx(correct.mean())
    assert len(summary["log_det"]["coverage"]) == 51
    assert summary["log_det"]["coverage"][-1] == 1.0
    assert "deciles" not in summary["random"]
    normalized = summary["log_det"]["normalized_auprc"]
    expected = (summary["log_det"]["auprc"] - correct.mean()) / (
        summary["oracle"]["auprc"] - correct.mean()
    )
    assert normalized == pytest.approx(expected)


def test_oracle_curve_matches_a_loop() -> None:
    """Keeping the right answers first: precision 1 until they run out, then #right / kept."""
    rng = np.random.default_rng(8)
    correct = rng.random(200) < 0.4
    curve = oracle_rejection(correct)
    right = int(correct.sum())
    expected = [1.0 if k <= right else right / k for k in range(1, 201)]
    np.testing.assert_allclose(curve.precision, expected)
    assert normalized_auprc(curve.auprc, random_rejection(correct).auprc, curve.auprc) == 1.0
    assert np.isnan(normalized_auprc(0.5, 0.7, 0.7))


def test_auroc_matches_a_pair_loop() -> None:
    rng = np.random.default_rng(3)
    negatives = rng.integers(0, 6, 40).astype(float)  # many ties
    positives = rng.integers(2, 8, 25).astype(float)
    pairs = [(p > n) + 0.5 * (p == n) for p in positives for n in negatives]
    assert auroc(negatives, positives) == pytest.approx(np.mean(pairs))
    assert auroc(np.zeros(3), np.ones(2)) == 1.0


def test_spearman_matches_scipy() -> None:
    rng = np.random.default_rng(4)
    x = rng.integers(0, 5, 60).astype(float)
    y = x + rng.normal(size=60)
    assert spearman(x, y) == pytest.approx(spearmanr(x, y).statistic)
    assert np.isnan(spearman(np.ones(5), np.arange(5.0)))


def test_bad_inputs_are_reported() -> None:
    with pytest.raises(ValueError, match="equal 1-D shapes"):
        precision_coverage(np.zeros(3), np.zeros(4, dtype=bool))
    with pytest.raises(ValueError, match="at least one query"):
        precision_coverage(np.zeros(0), np.zeros(0, dtype=bool))
    with pytest.raises(ValueError, match="NaN"):
        precision_coverage(np.array([np.nan]), np.array([True]))


def test_an_uncertainty_constant_up_to_round_off_is_random_rejection() -> None:
    """Round-off that happens to follow correctness must not count as a ranking."""
    correct = np.random.default_rng(3).random(80) < 0.5
    leaky = 0.25 + 1e-12 * correct  # wrong answers look "more certain" by 1e-12
    assert precision_coverage(leaky, correct).precision == pytest.approx(
        random_rejection(correct).precision
    )
    informative = 0.25 + 1e-6 * correct
    assert precision_coverage(informative, correct).auprc < random_rejection(correct).auprc
