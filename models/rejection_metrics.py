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


def precision_coverage(uncertainty: np.ndarray, correct: np.ndarray) -> PrecisionCoverage:
    """Precision-coverage curve when keeping the least uncertain queries first.

    Args:
        uncertainty: (Q,) larger means less sure (MI, log-det, feature uncertainty).
        correct: (Q,) bool, e.g. the ground truth is in the top 1 (R@1) or top 10 (R@10).
    """
    uncertainty = np.asarray(uncertainty, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    _check(uncertainty, correct)
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
    uncertainties: Mapping[str, np.ndarray],
    correct_at: Mapping[int, np.ndarray],
    bins: int = 10,
    seed: int = 0,
    curve_points: int = 101,
) -> dict[str, dict]:
    """Every rejection measure for one retrieval direction.

    Args:
        uncertainties: method name -> (Q,) uncertainty; "random" is added as the chance level.
        correct_at: K -> (Q,) bool, whether the ground truth is in the top K of each query.

    Returns:
        method -> {"R@K": {"auprc", "coverage", "precision"}, ..., "deciles": {...}} where the
        deciles hold R@1 (or the smallest K) per uncertainty decile; curves are resampled to
        at most `curve_points` points (the AUPRC is computed on the full curve).
    """
    smallest_k = min(correct_at)
    num_queries = correct_at[smallest_k].size
    bins = min(bins, num_queries)
    summary: dict[str, dict] = {}
    for method, uncertainty in {**uncertainties, "random": None}.items():
        entry: dict = {}
        for k, correct in correct_at.items():
            curve = (
                random_rejection(correct)
                if uncertainty is None
                else precision_coverage(uncertainty, correct)
            )
            shown = curve.resampled(curve_points)
            entry[f"R@{k}"] = {
                "auprc": curve.auprc,
                "coverage": shown.coverage.tolist(),
                "precision": shown.precision.tolist(),
            }
        if uncertainty is not None:
            deciles = accuracy_by_decile(uncertainty, correct_at[smallest_k], bins, seed)
            entry["deciles"] = {
                "K": smallest_k,
                "mean_uncertainty": deciles.mean_uncertainty.tolist(),
                "accuracy": deciles.accuracy.tolist(),
                "count": deciles.count.tolist(),
            }
        summary[method] = entry
    return summary
