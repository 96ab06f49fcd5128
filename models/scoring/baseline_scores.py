"""Training-free uncertainty baselines of a query, from its shortlist distances alone.

A learned uncertainty score (log-det, MI, ...; models.scoring.query_scores) costs a model, a
training objective and its calibration; it is worth shipping only where it rejects wrong answers
better than what the ranking itself already says. "Over the top-1" (uCLIP, UAI 2025) gives the
training-free yardsticks used here, read off the same shortlist the learned scores use:

- top1_distance: the distance to the first result (minus its similarity): a query whose best
  answer is far away is an answer the ranking itself doubts.
- top1_margin: minus the gap between the second and the first result: two near-equal best
  answers make the choice between them a coin toss.
- top1_instability: the fraction of MC draws whose own first result is not the deterministic
  one: an answer that moves under dropout is not a stable answer.
- top1_mean_distance: the squared Euclidean distance between the query's mean and its first
  result's mean. The served distance reads the learned variances when the metric does (w2,
  query_mahalanobis, ...), so its top1_distance is itself a learned score there; this one reads
  the means alone, as a point model would judge the same answer. It is left out for pvse, whose
  max_pair distance reads no variance (its top1_distance is already that).

As every score of the project, larger means less sure. The evaluation reports them beside every
learned score (models.evaluation.evaluate.direction_scores); they are not in SCORE_NAMES, so
the service and calibration never use them.
"""

from __future__ import annotations

import numpy as np

BASELINE_NAMES: tuple[str, ...] = (
    "top1_distance",
    "top1_margin",
    "top1_instability",
    "top1_mean_distance",
)


def top1_distance(distances: np.ndarray) -> np.ndarray:
    """(Q,) the smallest distance of each row of `distances` (Q, M), M >= 1; +inf padding is
    never the smallest unless the whole row is padding (then +inf)."""
    return np.asarray(distances, dtype=np.float64).min(axis=-1)


def top1_margin(distances: np.ndarray) -> np.ndarray:
    """(Q,) minus (second-smallest - smallest) distance of each row of `distances` (Q, M): <= 0,
    and 0 (least sure) for an exact tie.

    A row with fewer than two finite candidates (M = 1, or the rest +inf padding) has no second
    result to measure a margin against: its margin is 0, as for a tie. That ranks it among the
    least sure rather than as infinitely sure, and keeps the score finite, which the rejection
    metrics need.
    """
    distances = np.asarray(distances, dtype=np.float64)
    if distances.shape[-1] < 2:
        return np.zeros(distances.shape[:-1])
    two = np.partition(distances, 1, axis=-1)[..., :2]
    with np.errstate(invalid="ignore"):  # inf - inf = nan: a row of padding only
        gap = two[..., 1] - two[..., 0]  # inf - finite = inf: no second result
    return 0.0 - np.where(np.isfinite(gap), gap, 0.0)


def top1_instability(distances: np.ndarray, mc_distances: np.ndarray) -> np.ndarray:
    """(Q,) 1 - the fraction of the L draws whose own first result (argmin of `mc_distances`
    (L, Q, M), L >= 1) is the deterministic first result (argmin of `distances` (Q, M)), in
    [0, 1]. An exact tie goes to the earlier candidate (the shortlist's order), on both sides,
    so draws equal to the deterministic distances give 0."""
    distances = np.asarray(distances, dtype=np.float64)
    mc_distances = np.asarray(mc_distances, dtype=np.float64)
    if mc_distances.ndim != 3 or mc_distances.shape[0] < 1:
        raise ValueError(f"mc_distances must be (L >= 1, Q, M); got {mc_distances.shape}")
    if mc_distances.shape[1:] != distances.shape:
        raise ValueError(f"mc_distances {mc_distances.shape} do not match {distances.shape}")
    agree = mc_distances.argmin(axis=-1) == distances.argmin(axis=-1)  # (L, Q)
    return 1.0 - agree.mean(axis=0)


def top1_mean_distance(
    query_mu: np.ndarray, candidate_mu: np.ndarray, distances: np.ndarray
) -> np.ndarray:
    """(Q,) sum_d (mu_query - mu_first)^2, where the first result is the argmin of each row of
    `distances` (Q, M) (an exact tie goes to the earlier candidate), mu_query the queries' means
    (Q, D) and mu_first its row of `candidate_mu` (Q, M, D). No variance enters."""
    query_mu = np.asarray(query_mu, dtype=np.float64)
    candidate_mu = np.asarray(candidate_mu, dtype=np.float64)
    first = np.asarray(distances).argmin(axis=-1)  # (Q,)
    first_mu = np.take_along_axis(candidate_mu, first[:, None, None], axis=1)[:, 0]  # (Q, D)
    return ((query_mu - first_mu) ** 2).sum(axis=-1)


def baseline_scores(
    distances: np.ndarray,
    mc_distances: np.ndarray | None = None,
    means: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """name -> (Q,) float64 of every baseline (BASELINE_NAMES) of Q queries.

    distances: (Q, M) deterministic distances to each query's shortlist, smaller = closer, +inf
    marks padding; each row needs one finite distance for a finite top1_distance.
    mc_distances: (L, Q, M) distances of the MC draws to the same candidates, or None;
    top1_instability is left out without them or with L = 0.
    means: the queries' means (Q, D) and their candidates' (Q, M, D), or None, which leaves
    top1_mean_distance out.
    """
    scores = {"top1_distance": top1_distance(distances), "top1_margin": top1_margin(distances)}
    if mc_distances is not None and np.shape(mc_distances)[0] >= 1:
        scores["top1_instability"] = top1_instability(distances, mc_distances)
    if means is not None:
        scores["top1_mean_distance"] = top1_mean_distance(*means, distances)
    return scores
