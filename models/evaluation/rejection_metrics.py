"""Rejection quality (Hama et al.): precision against the fraction of queries kept when the most
uncertain queries are refused, its area (AUPRC), the random-rejection chance level, and accuracy
per uncertainty decile.

Queries are kept from the most certain (smallest uncertainty) on. Queries with equal uncertainty
cannot be told apart, so within a tie the expected precision of a random order is used: a
constant uncertainty therefore scores exactly the chance level of random rejection.
"""

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata


@dataclass(frozen=True)
class PrecisionCoverage:
    """Precision of the kept queries as a function of the fraction kept (coverage)."""

    coverage: np.ndarray  # (Q,) k / Q for k = 1..Q
    precision: np.ndarray  # (Q,) fraction of correct answers among the k most certain queries

    @property
    def auprc(self) -> float:
        """Trapezoid area under precision over coverage in [1/Q, 1], divided by that span, so that
        it is the mean precision over coverage (random rejection scores the overall accuracy)."""
        span = float(self.coverage[-1] - self.coverage[0])
        if span == 0.0:
            return float(self.precision[0])
        widths = np.diff(self.coverage)
        area = float(np.sum(widths * (self.precision[1:] + self.precision[:-1]) / 2.0))
        return area / span

    def resampled(self, points: int = 101) -> "PrecisionCoverage":
        """At most `points` points of the curve, evenly spaced in rank, both ends included."""
        if self.coverage.size <= points:
            return self
        index = np.unique(np.linspace(0, self.coverage.size - 1, points).round().astype(np.int64))
        return PrecisionCoverage(coverage=self.coverage[index], precision=self.precision[index])


def _check(uncertainty: np.ndarray, correct: np.ndarray) -> None:
    if uncertainty.ndim != 1 or uncertainty.shape != correct.shape:
        raise ValueError(
            f"uncertainty {uncertainty.shape} and correct {correct.shape} must be equal 1-D shapes"
        )
    if uncertainty.size == 0:
        raise ValueError("rejection metrics need at least one query")
    if not np.isfinite(uncertainty).all():
        raise ValueError("uncertainty contains NaN or infinity")


CONSTANT_TOLERANCE = 1e-9  # relative spread below which a score counts as constant


def is_constant(values: np.ndarray) -> bool:
    """True when the values differ by no more than float64 round-off of their magnitude (MI
    and feature uncertainty of a model without dropout): such differences carry no
    information about the query, only about the order of float operations."""
    values = np.asarray(values, dtype=np.float64)
    scale = 1.0 + float(np.abs(values).max(initial=0.0))
    return float(np.ptp(values)) <= CONSTANT_TOLERANCE * scale if values.size else True


def precision_coverage(uncertainty: np.ndarray, correct: np.ndarray) -> PrecisionCoverage:
    """Precision-coverage curve when keeping the least uncertain queries first. An uncertainty
    that is constant up to round-off is one tie (random rejection).

    Args:
        uncertainty: (Q,) larger means less sure (MI, log-det, feature uncertainty).
        correct: (Q,) bool, e.g. the ground truth is in the top 1 (R@1) or top 10 (R@10).
    """
    uncertainty = np.asarray(uncertainty, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    _check(uncertainty, correct)
    if is_constant(uncertainty):
        uncertainty = np.zeros_like(uncertainty)
    order = np.argsort(uncertainty, kind="stable")
    sorted_uncertainty, sorted_correct = uncertainty[order], correct[order]
    # Cumulative correct count at the end of each tie group, linearly interpolated inside it:
    # the expected count when the group's queries are kept in random order.
    _, group_start, group_size = np.unique(
        sorted_uncertainty, return_index=True, return_counts=True
    )
    group_end = group_start + group_size  # exclusive
    cumulative = np.concatenate([[0.0], np.cumsum(sorted_correct)])  # (Q + 1,)
    kept = np.arange(1, uncertainty.size + 1)  # (Q,)
    group_of = np.repeat(np.arange(group_start.size), group_size)  # (Q,)
    start_count = cumulative[group_start[group_of]]
    end_count = cumulative[group_end[group_of]]
    fraction_of_group = (kept - group_start[group_of]) / group_size[group_of]
    expected_correct = start_count + fraction_of_group * (end_count - start_count)
    return PrecisionCoverage(coverage=kept / uncertainty.size, precision=expected_correct / kept)


def oracle_rejection(correct: np.ndarray) -> PrecisionCoverage:
    """The best possible curve: every wrong answer rejected before any right one."""
    correct = np.asarray(correct, dtype=np.float64)
    return precision_coverage(1.0 - correct, correct)


def normalized_auprc(auprc: float, random: float, oracle: float) -> float:
    """(AUPRC - random) / (oracle - random): 0 is chance, 1 the oracle; NaN when every answer
    is right or every one wrong (nothing to tell apart)."""
    span = oracle - random
    return (auprc - random) / span if span > 1e-12 else float("nan")


def auroc(negatives: np.ndarray, positives: np.ndarray) -> float:
    """P(score of a positive > score of a negative), ties counting 1/2 (Mann-Whitney U / n m)."""
    negatives = np.asarray(negatives, dtype=np.float64)
    positives = np.asarray(positives, dtype=np.float64)
    if negatives.size == 0 or positives.size == 0:
        raise ValueError("AUROC needs at least one positive and one negative")
    ranks = rankdata(np.concatenate([negatives, positives]))  # average ranks for ties
    u = ranks[negatives.size :].sum() - positives.size * (positives.size + 1) / 2.0
    return float(u / (negatives.size * positives.size))


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when either side is constant."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(np.corrcoef(rankdata(x), rankdata(y))[0, 1])


def random_rejection(correct: np.ndarray) -> PrecisionCoverage:
    """Expected curve of rejecting at random: the overall accuracy at every coverage."""
    correct = np.asarray(correct, dtype=np.float64)
    _check(np.zeros_like(correct), correct)
    kept = np.arange(1, correct.size + 1)
    return PrecisionCoverage(
        coverage=kept / correct.size, precision=np.full(correct.size, correct.mean())
    )


@dataclass(frozen=True)
class DecileAccuracy:
    """Accuracy of the queries in each uncertainty decile (0 = most certain)."""

    mean_uncertainty: np.ndarray  # (B,)
    accuracy: np.ndarray  # (B,) fraction correct in the bin
    count: np.ndarray  # (B,) queries in the bin


def accuracy_by_decile(
    uncertainty: np.ndarray, correct: np.ndarray, bins: int = 10, seed: int = 0
) -> DecileAccuracy:
    """Split queries into `bins` equal-size groups by uncertainty (ties in a seeded random order)
    and report the accuracy (e.g. R@1) of each group."""
    uncertainty = np.asarray(uncertainty, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    _check(uncertainty, correct)
    if uncertainty.size < bins:
        raise ValueError(f"{uncertainty.size} queries cannot fill {bins} uncertainty bins")
    tie_breaker = np.random.default_rng(seed).random(uncertainty.size)
    order = np.lexsort((tie_breaker, uncertainty))
    groups = np.array_split(order, bins)
    return DecileAccuracy(
        mean_uncertainty=np.array([uncertainty[g].mean() for g in groups]),
        accuracy=np.array([correct[g].mean() for g in groups]),
        count=np.array([g.size for g in groups]),
    )


def rejection_summary(
    scores: Mapping[str, np.ndarray],
    correct: np.ndarray,
    bins: int = 10,
    seed: int = 0,
    curve_points: int = 101,
) -> dict[str, dict]:
    """Every rejection measure of one retrieval direction, judged on `correct` (Q,) bool.

    Returns score name -> {"auprc", "normalized_auprc", "coverage", "precision", "deciles"},
    plus "random" and "oracle" (AUPRC and curve only). Curves are resampled to at most
    `curve_points` points; the AUPRC is computed on the full curve.
    """
    correct = np.asarray(correct, dtype=bool)
    bins = min(bins, correct.size)
    random, oracle = random_rejection(correct), oracle_rejection(correct)
    summary: dict[str, dict] = {}
    for name, curve in {"random": random, "oracle": oracle}.items():
        shown = curve.resampled(curve_points)
        summary[name] = {
            "auprc": curve.auprc,
            "coverage": shown.coverage.tolist(),
            "precision": shown.precision.tolist(),
        }
    for name, values in scores.items():
        curve = precision_coverage(values, correct)
        shown = curve.resampled(curve_points)
        deciles = accuracy_by_decile(values, correct, bins, seed)
        summary[name] = {
            "auprc": curve.auprc,
            "normalized_auprc": normalized_auprc(curve.auprc, random.auprc, oracle.auprc),
            "coverage": shown.coverage.tolist(),
            "precision": shown.precision.tolist(),
            "deciles": {
                "mean_uncertainty": deciles.mean_uncertainty.tolist(),
                "accuracy": deciles.accuracy.tolist(),
                "count": deciles.count.tolist(),
            },
        }
    return summary
