"""Exact re-rank of a shortlist with a models.distance.gaussian distance (torch, any device),
and the distances of a query's MC draws to its shortlist."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from models.distance.gaussian import (
    broadcast_distance,
    elementwise_distance,
    matmul_pairwise_distance,
)

# Elements of one block of draw_distances' intermediates (float32: 512 KiB, inside L2): larger
# blocks spill to memory and cost more per query than they save.
DRAW_BLOCK_ELEMENTS = 1 << 17
# On a GPU each block costs kernel launches, so blocks are as large as memory allows (float32:
# 256 MiB an intermediate); 64 queries x 16 draws x 100 candidates x D = 256 make one.
GPU_DRAW_BLOCK_ELEMENTS = 1 << 26
# Fixed noise for match_prob (a sampled distance), so that the same query ranks the same way.
MATCH_PROB_SEED = 0


def compute_device(setting: str = "auto") -> torch.device:
    """torch device of the scoring: CUDA when torch sees a GPU and `setting` is auto or cuda,
    else CPU."""
    if setting not in ("auto", "cpu", "cuda"):
        raise ValueError(f"unknown device {setting!r}; choose auto, cpu or cuda")
    if setting == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


def distance_params(metric: str) -> dict[str, int]:
    """Extra models.distance.gaussian parameters of a metric: match_prob's fixed noise seed."""
    return {"seed": MATCH_PROB_SEED} if metric == "match_prob" else {}


@dataclass
class Ranked:
    """A query's shortlist after the exact re-rank, best first (M <= the size asked for)."""

    rows: np.ndarray  # (M,) int64 gallery rows
    distances: torch.Tensor  # (M,) float32 exact distances, ascending
    mu: torch.Tensor  # (M, D) gallery means in the same order
    logvar: torch.Tensor  # (M, D)


@dataclass
class RankedBatch:
    """Q queries' shortlists after the exact re-rank, best first, padded to the longest (M).

    Query q holds counts[q] entries; past them rows are -1, distances NaN and mu/logvar rows
    of the gallery that mean nothing.
    """

    rows: np.ndarray  # (Q, M) int64 gallery rows
    distances: torch.Tensor  # (Q, M) float32 exact distances, ascending
    mu: torch.Tensor  # (Q, M, D) gallery means in the same order
    logvar: torch.Tensor  # (Q, M, D)
    counts: np.ndarray  # (Q,) int64

    @classmethod
    def of(cls, ranked: Ranked) -> RankedBatch:
        """A batch holding one query's shortlist."""
        return cls(
            ranked.rows[None], ranked.distances[None], ranked.mu[None], ranked.logvar[None],
            np.array([len(ranked.rows)], dtype=np.int64),
        )  # fmt: skip

    def query(self, q: int) -> Ranked:
        """Query q's shortlist alone (views, no copy)."""
        m = int(self.counts[q])
        return Ranked(self.rows[q, :m], self.distances[q, :m], self.mu[q, :m], self.logvar[q, :m])


def gather_rows(array: np.ndarray, rows: np.ndarray, device: torch.device) -> torch.Tensor:
    """float32 rows of a (possibly memory-mapped, float16) array as a tensor on `device`."""
    return torch.from_numpy(np.asarray(array[rows], dtype=np.float32)).to(device)


def exact_rerank(
    metric: str,
    mu_q: np.ndarray,
    logvar_q: np.ndarray,
    gallery_mu: np.ndarray,
    gallery_logvar: np.ndarray,
    candidate_rows: np.ndarray,
    keep: int,
    device: torch.device,
) -> Ranked:
    """rerank_batch of one query: mu_q, logvar_q (D,), candidate_rows (C,)."""
    query = np.asarray(mu_q)[None], np.asarray(logvar_q)[None]  # (1, D) each
    rows = np.asarray(candidate_rows).reshape(1, -1)  # (1, C)
    return rerank_batch(metric, *query, gallery_mu, gallery_logvar, rows, keep, device).query(0)


def rerank_batch(
    metric: str,
    mu_q: np.ndarray,
    logvar_q: np.ndarray,
    gallery_mu: np.ndarray,
    gallery_logvar: np.ndarray,
    candidate_rows: np.ndarray,
    keep: int,
    device: torch.device,
) -> RankedBatch:
    """Rank each query's candidate rows by the exact `metric` distance; keep the best `keep`.

    Args:
        mu_q, logvar_q: the queries, (Q, D).
        gallery_mu, gallery_logvar: the whole gallery (N, D), possibly memory-mapped float16.
        candidate_rows: rows proposed by an index, (Q, C); -1 (padding) and repeats are dropped.
    Ties are broken by the smaller row, so each query's order is that of a stable sort of the
    whole gallery by distance. Distances are elementwise (not the pairwise matrix form), the
    same numbers draw_distances gives, so the scores computed from them match everywhere; the
    candidates of all queries go through one elementwise call, so a query's distances do not
    depend on the rest of the batch.
    """
    rows, counts = unique_rows(candidate_rows)  # (T,), (Q,)
    mu_g = gather_rows(gallery_mu, rows, device)  # (T, D)
    logvar_g = gather_rows(gallery_logvar, rows, device)
    distances = elementwise_distance(
        metric,
        _per_candidate(mu_q, counts, device),  # (T, D)
        _per_candidate(logvar_q, counts, device),
        mu_g,
        logvar_g,
        **distance_params(metric),
    )  # (T,)
    order, kept = _segment_order(distances, counts, keep)  # (Q, M) indices into T
    valid = np.arange(order.shape[1])[None] < kept[:, None]  # (Q, M)
    order = np.where(valid, order, 0)  # padding points at any row; M is 0 when T is
    index = torch.from_numpy(order).to(device)
    mask = torch.from_numpy(valid).to(device)
    return RankedBatch(
        rows=np.where(valid, rows[order], -1),
        distances=distances[index].masked_fill(~mask, float("nan")),
        mu=mu_g[index],
        logvar=logvar_g[index],
        counts=kept,
    )


def unique_rows(candidate_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each query's distinct rows >= 0, ascending, all queries concatenated: (T,) int64, and
    how many each query has, (Q,) int64."""
    ordered = np.sort(np.asarray(candidate_rows, dtype=np.int64), axis=1)  # (Q, C)
    fresh = np.ones(ordered.shape, dtype=bool)
    fresh[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    wanted = fresh & (ordered >= 0)
    return ordered[wanted], wanted.sum(axis=1)


def _segment_order(
    distances: torch.Tensor, counts: np.ndarray, keep: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per query, indices into the concatenated distances (T,) of its best `keep`, ascending
    by a stable sort: (Q, M) int64 (M = min(keep, counts.max())), and how many are real, (Q,)."""
    width = int(counts.max()) if len(counts) else 0
    offsets = np.cumsum(counts) - counts  # (Q,)
    if (counts == width).all():
        padded = distances.reshape(len(counts), width)  # (Q, C')
    else:
        # NaN padding sorts after every distance, NaN included, as the stable sort keeps ties
        # in place: a query's order is the one it would get alone.
        slots = np.arange(width)[None] < counts[:, None]  # (Q, C')
        padded = torch.full((len(counts), width), float("nan"), device=distances.device)
        padded[torch.from_numpy(slots).to(distances.device)] = distances
    order = torch.sort(padded, dim=1, stable=True).indices[:, :keep].cpu().numpy()
    return offsets[:, None] + order, np.minimum(counts, keep)


def _per_candidate(array: np.ndarray, counts: np.ndarray, device: torch.device) -> torch.Tensor:
    """Query q's row repeated counts[q] times: (Q, D) -> (T, D) float32, laid out the same for
    any Q (an expanded view would round differently from a copy where D is no whole number of
    SIMD blocks)."""
    queries = torch.from_numpy(np.asarray(array, dtype=np.float32)).to(device)  # (Q, D)
    if len(counts) and (counts == counts[0]).all():
        rows = queries[:, None].expand(-1, int(counts[0]), -1).reshape(-1, queries.shape[1])
        return rows.contiguous()  # a copy for one query too
    return queries[torch.from_numpy(np.repeat(np.arange(len(counts)), counts)).to(device)]


def candidate_distances(
    metric: str,
    mu: torch.Tensor,
    logvar: torch.Tensor,
    candidate_mu: torch.Tensor,
    candidate_logvar: torch.Tensor,
) -> torch.Tensor:
    """Distance of every query to each of its own candidates, (Q, D) x (Q, M, D) -> (Q, M):
    bit for bit the re-rank's (the elementwise closed forms)."""
    return _elementwise_draws(metric, mu[None], logvar[None], candidate_mu, candidate_logvar)[0]


def draw_distances(
    metric: str,
    mc_mu: torch.Tensor,
    mc_logvar: torch.Tensor,
    candidate_mu: torch.Tensor,
    candidate_logvar: torch.Tensor,
) -> torch.Tensor:
    """Distance of every MC draw of every query to each of its own candidates.

    mc_mu, mc_logvar: (L, Q, D) draws; candidate_mu, candidate_logvar: (Q, M, D), each query's
    shortlist -> (L, Q, M). On the CPU, per query one (L x M) matmul expansion
    (matmul_pairwise_distance), which equals the elementwise forms to float32 round-off and
    is 10-29x faster than them at 16 draws and a shortlist of 100; the draws feed the MI and
    the instability, where that round-off is immaterial. On a GPU the elementwise forms run
    the whole batch in a few kernels, where a loop over queries would launch kernels per query
    (11x slower on an H100: benchmarks/results/gpu_check.md). match_prob, which samples, is
    elementwise everywhere.
    """
    if metric == "match_prob" or candidate_mu.device.type != "cpu":
        return _elementwise_draws(metric, mc_mu, mc_logvar, candidate_mu, candidate_logvar)
    mc_mu, mc_logvar = (x.to(candidate_mu.device, torch.float32) for x in (mc_mu, mc_logvar))
    # One matmul per query, never one batched over queries: a batched matmul rounds a query's
    # values differently with the number of queries beside it, and a query's draws must get
    # the same bits alone as in a micro-batch.
    per_query = [
        matmul_pairwise_distance(
            metric, mc_mu[:, q].contiguous(), mc_logvar[:, q].contiguous(),
            candidate_mu[q], candidate_logvar[q],
        )  # (L, M)
        for q in range(candidate_mu.shape[0])
    ]  # fmt: skip
    if not per_query:
        return mc_mu.new_zeros((mc_mu.shape[0], 0, candidate_mu.shape[1]))
    return torch.stack(per_query, dim=1)  # (L, Q, M)


def _elementwise_draws(
    metric: str,
    mc_mu: torch.Tensor,
    mc_logvar: torch.Tensor,
    candidate_mu: torch.Tensor,
    candidate_logvar: torch.Tensor,
) -> torch.Tensor:
    """draw_distances by the elementwise closed forms: they broadcast (L, q, 1, D) against
    (1, q, M, D) for blocks of q queries: on the CPU blocks whose intermediates stay
    cache-sized (DRAW_BLOCK_ELEMENTS), on a GPU as large as memory allows
    (GPU_DRAW_BLOCK_ELEMENTS). Elementwise, a query's values do not depend on its block."""
    num_draws, num_queries, dim = mc_mu.shape
    per_query = max(1, num_draws * candidate_mu.shape[1] * dim)
    on_cpu = candidate_mu.device.type == "cpu"
    step = max(1, (DRAW_BLOCK_ELEMENTS if on_cpu else GPU_DRAW_BLOCK_ELEMENTS) // per_query)
    mc_mu, mc_logvar = (x.to(candidate_mu.device, torch.float32) for x in (mc_mu, mc_logvar))
    blocks = [
        broadcast_distance(
            metric,
            mc_mu[:, q : q + step, None],  # (L, q, 1, D)
            mc_logvar[:, q : q + step, None],
            candidate_mu[None, q : q + step],  # (1, q, M, D)
            candidate_logvar[None, q : q + step],
            **distance_params(metric),
        )  # (L, q, M)
        for q in range(0, num_queries, step)
    ]
    return torch.cat(blocks, dim=1) if blocks else mc_mu.new_zeros((num_draws, 0, 0))
