"""Retrieval metrics on full rankings, one chunk of queries at a time: R@K, rsum, median rank,
R-Precision and Plausible-Match R-Precision (PMRP, Chun et al.).

Distances come in chunks `(first_row, distances (c, G))` so that the whole Q x G matrix is never
held in memory; only per-query results (O(Q)) and the deterministic shortlist (Q, m) are kept.
Smaller distance is closer. Ties are always broken against the model: a relevant item that ties
with an irrelevant one is ranked after it, so a model that outputs constant distances scores at
chance, never at 100%.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

DistanceChunk = tuple[int, torch.Tensor]
"""(index of the chunk's first query, distances (c, G) of those c queries to the whole gallery)."""

RECALL_KS: tuple[int, ...] = (1, 5, 10)
PMRP_ZETAS: tuple[int, ...] = (0, 1, 2)


class Relevance(Protocol):
    """Which gallery items count as relevant for given queries."""

    def mask(self, rows: np.ndarray) -> np.ndarray:
        """Boolean (len(rows), G): True where gallery item g is relevant to query rows[i]."""
        ...


@dataclass(frozen=True)
class GroupRelevance:
    """Relevant when query and gallery item share a group id (the ground-truth pairs)."""

    query_group: np.ndarray  # (Q,) int
    gallery_group: np.ndarray  # (G,) int

    def mask(self, rows: np.ndarray) -> np.ndarray:
        return self.query_group[rows, None] == self.gallery_group[None, :]  # (c, G)


@dataclass(frozen=True)
class LabelRelevance:
    """Plausible match of Chun et al.: L1 distance of the multi-hot label vectors <= zeta."""

    query_labels: np.ndarray  # (Q, K) 0/1
    gallery_labels: np.ndarray  # (G, K) 0/1
    zeta: int

    def mask(self, rows: np.ndarray) -> np.ndarray:
        query = self.query_labels[rows].astype(np.float32)  # (c, K)
        gallery = self.gallery_labels.astype(np.float32)  # (G, K)
        # For 0/1 vectors |a - b|_1 = |a| + |b| - 2 a.b, exact in float32 for K < 2**24.
        l1 = query.sum(1)[:, None] + gallery.sum(1)[None, :] - 2.0 * (query @ gallery.T)  # (c, G)
        return l1 <= self.zeta + 0.5


def first_positive_rank(distances: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """0-based rank of each query's best positive: the irrelevant items at the same or a smaller
    distance. distances (c, G) float, positive (c, G) bool -> (c,) int64."""
    if not bool(positive.any(dim=1).all()):
        raise ValueError("every query needs at least one ground-truth match in the gallery")
    best = torch.where(positive, distances, torch.inf).min(dim=1).values  # (c,)
    return ((distances <= best[:, None]) & ~positive).sum(dim=1)


def smallest_sorted(distances: torch.Tensor, k: int) -> torch.Tensor:
    """The k smallest distances of each row, ascending: (c, G) -> (c, k); topk when k is small
    compared with G, a full sort otherwise (faster there)."""
    k = max(1, min(k, distances.shape[1]))
    if 4 * k < distances.shape[1]:
        return torch.topk(distances, k, dim=1, largest=False, sorted=True).values
    return torch.sort(distances, dim=1).values[:, :k]


def count_top_hits(
    distances: torch.Tensor,
    relevant: torch.Tensor,
    depth: torch.Tensor,
    smallest: torch.Tensor | None = None,
) -> torch.Tensor:
    """Relevant items among the first `depth[i]` of each ranking (ties broken against the model).

    distances (c, G) float, relevant (c, G) bool, depth (c,) int64 in [0, G] -> (c,) int64.
    `smallest` (c, >= max depth): smallest_sorted(distances, ...), to share it across calls.
    """
    num_gallery = distances.shape[1]
    depth_at_least_one = depth.clamp(1, num_gallery)  # (c,)
    if smallest is None:
        smallest = smallest_sorted(distances, int(depth_at_least_one.max()))
    cutoff = smallest.gather(1, (depth_at_least_one - 1)[:, None])  # (c, 1) depth-th distance
    closer = distances < cutoff  # (c, G)
    tied = distances == cutoff  # (c, G)
    free_slots = depth_at_least_one - closer.sum(dim=1)  # (c,) places left for tied items
    tied_irrelevant = (tied & ~relevant).sum(dim=1)  # (c,) these take the free slots first
    tied_relevant_in = (free_slots - tied_irrelevant).clamp(min=0)  # (c,)
    hits = (closer & relevant).sum(dim=1) + tied_relevant_in
    return torch.where(depth > 0, hits, torch.zeros_like(hits))


@dataclass(frozen=True)
class SetOutcome:
    """Per-query figures of one chunk for one relevance set, each (c,)."""

    r_precision: np.ndarray  # float64, NaN where nothing is relevant
    top1_hit: np.ndarray  # bool: the first result is relevant (ties broken against the model)
    relevant_count: np.ndarray  # int64


def _set_outcomes(
    distances: torch.Tensor, rows: np.ndarray, r_precision_sets: Mapping[str, Relevance]
) -> dict[str, SetOutcome]:
    """R-Precision, top-1 hit and relevant count of one chunk for every relevance set."""
    relevant = {
        name: torch.from_numpy(relevance.mask(rows)).to(distances.device)  # (c, G)
        for name, relevance in r_precision_sets.items()
    }
    num_relevant = {name: mask.sum(dim=1) for name, mask in relevant.items()}  # (c,) each
    deepest = max((int(n.max()) for n in num_relevant.values()), default=1)
    smallest = smallest_sorted(distances, deepest)  # (c, k), sorted once for every set
    out = {}
    for name, mask in relevant.items():
        count = num_relevant[name]
        hits = count_top_hits(distances, mask, count, smallest)  # (c,)
        precision = hits.double() / count.clamp(min=1).double()
        precision[count == 0] = torch.nan
        top1 = count_top_hits(distances, mask, torch.ones_like(count), smallest) > 0
        out[name] = SetOutcome(
            precision.cpu().numpy(), top1.cpu().numpy(), count.cpu().numpy().astype(np.int64)
        )
    return out


@dataclass(frozen=True)
class RankingResult:
    """Per-query outcome of ranking the whole gallery for every query."""

    first_positive_rank: np.ndarray  # (Q,) int64, 0-based rank of the best ground-truth match
    positive_count: np.ndarray  # (Q,) int64 ground-truth matches in the gallery
    r_precision: dict[str, np.ndarray]  # name -> (Q,) float64 in [0, 1], NaN if nothing relevant
    top1_hit: dict[str, np.ndarray]  # name -> (Q,) bool, the first result is relevant
    relevant_count: dict[str, np.ndarray]  # name -> (Q,) int64 relevant items in the gallery
    shortlist: np.ndarray  # (Q, m) int64 gallery rows of the m closest items, closest first
    shortlist_distances: np.ndarray  # (Q, m) float32 their distances


def rank_queries(
    chunks: Iterable[DistanceChunk],
    num_queries: int,
    positives: Relevance,
    r_precision_sets: Mapping[str, Relevance],
    shortlist_size: int = 100,
) -> RankingResult:
    """Consume distance chunks and keep, per query, what every retrieval metric needs.

    Args:
        chunks: `(first_row, distances (c, G))`, covering queries 0..num_queries-1 in order.
        positives: the ground-truth matches (R@K and median rank).
        r_precision_sets: name -> relevance; for each, R-Precision = (relevant items among the
            top R) / R where R is the number of relevant items of that query in the gallery.
        shortlist_size: m, the number of closest gallery rows kept per query (for MI).
    """
    ranks = np.full(num_queries, -1, dtype=np.int64)
    positive_count = np.zeros(num_queries, dtype=np.int64)
    precisions = {name: np.full(num_queries, np.nan) for name in r_precision_sets}
    top1 = {name: np.zeros(num_queries, dtype=bool) for name in r_precision_sets}
    counts = {name: np.zeros(num_queries, dtype=np.int64) for name in r_precision_sets}
    shortlist = shortlist_distances = None
    for first_row, distances in chunks:
        if not bool(torch.isfinite(distances).all()):
            raise ValueError("distances contain NaN or infinity; check the embeddings")
        rows = np.arange(first_row, first_row + distances.shape[0])
        positive = torch.from_numpy(positives.mask(rows)).to(distances.device)  # (c, G)
        ranks[rows] = first_positive_rank(distances, positive).cpu().numpy()
        positive_count[rows] = positive.sum(dim=1).cpu().numpy()
        for name, outcome in _set_outcomes(distances, rows, r_precision_sets).items():
            precisions[name][rows] = outcome.r_precision
            top1[name][rows] = outcome.top1_hit
            counts[name][rows] = outcome.relevant_count
        m = min(shortlist_size, distances.shape[1])
        if shortlist is None:
            shortlist = np.zeros((num_queries, m), dtype=np.int64)
            shortlist_distances = np.zeros((num_queries, m), dtype=np.float32)
        closest = torch.topk(distances, m, dim=1, largest=False, sorted=True)  # (c, m)
        shortlist[rows] = closest.indices.cpu().numpy()
        shortlist_distances[rows] = closest.values.float().cpu().numpy()
    if shortlist is None or shortlist_distances is None or (ranks < 0).any():
        raise ValueError(f"the distance chunks did not cover all {num_queries} queries")
    return RankingResult(
        first_positive_rank=ranks,
        positive_count=positive_count,
        r_precision=precisions,
        top1_hit=top1,
        relevant_count=counts,
        shortlist=shortlist,
        shortlist_distances=shortlist_distances,
    )


def per_distinct_query(hits: np.ndarray, texts: Sequence[str]) -> float:
    """Percentage of distinct query texts answered correctly: the mean over distinct texts of
    the mean of `hits` (Q,) over the queries that share the text.

    Clip art's captions repeat: on its test split 1,069 captions carry 637 texts, and one of them
    ("a drawing of star, shape, geometry") is 121 queries, so the plain P@1 moves by about 11
    points with that one text's first result. Counting each text once measures how many kinds
    of request the model answers, not how often the most frequent one is asked.
    """
    if len(texts) != len(hits):
        raise ValueError(f"{len(hits)} hits but {len(texts)} texts")
    if not len(hits):
        return float("nan")
    _, group = np.unique(np.asarray(texts, dtype=object).astype(str), return_inverse=True)
    per_text = np.bincount(group, weights=hits.astype(np.float64)) / np.bincount(group)
    return 100.0 * float(per_text.mean())


def recall_at_k(ranks: np.ndarray, k: int) -> float:
    """Percentage of queries whose best ground-truth match is among the first k (ranks 0-based)."""
    return 100.0 * float(np.mean(ranks < k))


def median_rank(ranks: np.ndarray) -> float:
    """1-based median rank of the best match, floor(median(rank0)) + 1 as in VSE++ and PCME."""
    return float(np.floor(np.median(ranks)) + 1)


def summarize_ranking(
    result: RankingResult, ks: tuple[int, ...] = RECALL_KS, plausible: str = "r_precision"
) -> dict[str, float | int]:
    """R@K (%), rsum (sum of the R@K), median and mean rank, and each R-Precision (%).

    An R-Precision set named `pmrp_zeta<z>` also feeds `pmrp`, the mean over those zetas. For
    the `plausible` set, also `P@1` (the first result is plausible, %) and `R@1_ceiling`: the
    best exact-pair R@1 of a model that always answers with a plausible match chosen at random,
    mean(#ground-truth / #plausible) (%).
    """
    ranks = result.first_positive_rank
    summary: dict[str, float | int] = {f"R@{k}": recall_at_k(ranks, k) for k in ks}
    summary["rsum"] = sum(summary[f"R@{k}"] for k in ks)
    if plausible in result.top1_hit:
        counts = result.relevant_count[plausible]
        valid = counts > 0
        summary["P@1"] = 100.0 * float(np.mean(result.top1_hit[plausible][valid]))
        ceiling = np.minimum(result.positive_count[valid] / counts[valid], 1.0)
        summary["R@1_ceiling"] = 100.0 * float(np.mean(ceiling))
    summary["median_rank"] = median_rank(ranks)
    summary["mean_rank"] = float(np.mean(ranks) + 1)
    pmrps = []
    for name, precision in result.r_precision.items():
        valid = ~np.isnan(precision)
        summary[name] = 100.0 * float(np.mean(precision[valid])) if valid.any() else float("nan")
        summary[f"{name}_queries"] = int(valid.sum())
        if name.startswith("pmrp_zeta"):
            pmrps.append(summary[name])
    if pmrps:
        summary["pmrp"] = float(np.mean(pmrps))
    return summary


def pmrp_relevances(
    query_labels: np.ndarray, gallery_labels: np.ndarray, zetas: tuple[int, ...] = PMRP_ZETAS
) -> dict[str, Relevance]:
    """The plausible-match sets of PMRP, one per zeta, named `pmrp_zeta<z>`."""
    return {
        f"pmrp_zeta{zeta}": LabelRelevance(query_labels, gallery_labels, zeta) for zeta in zetas
    }
