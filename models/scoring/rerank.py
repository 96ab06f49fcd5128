"""Exact re-rank of a shortlist with a models.gaussian distance (torch, any device), and the
distances of a query's MC draws to its shortlist."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from models.gaussian import elementwise_distance

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
    """Extra models.gaussian parameters of a metric: match_prob's fixed noise seed."""
    return {"seed": MATCH_PROB_SEED} if metric == "match_prob" else {}


@dataclass
class Ranked:
    """A query's shortlist after the exact re-rank, best first (M <= the size asked for)."""

    rows: np.ndarray  # (M,) int64 gallery rows
    distances: torch.Tensor  # (M,) float32 exact distances, ascending
    mu: torch.Tensor  # (M, D) gallery means in the same order
    logvar: torch.Tensor  # (M, D)


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
    """Rank the candidate rows by the exact `metric` distance to the query; keep the best `keep`.

    Args:
        mu_q, logvar_q: the query, (D,).
        gallery_mu, gallery_logvar: the whole gallery (N, D), possibly memory-mapped float16.
        candidate_rows: rows proposed by an index, (C,); -1 (padding) and repeats are dropped.
    Ties are broken by the smaller row, so the order is that of a stable sort of the whole
    gallery by distance. Distances are elementwise (not the pairwise matrix form), the same
    numbers draw_distances gives, so the scores computed from them match everywhere.
    """
    rows = np.unique(candidate_rows[candidate_rows >= 0]).astype(np.int64)  # (C',) ascending
    mu_g = gather_rows(gallery_mu, rows, device)  # (C', D)
    logvar_g = gather_rows(gallery_logvar, rows, device)
    mu_query = torch.from_numpy(np.asarray(mu_q, dtype=np.float32)).to(device)[None]  # (1, D)
    logvar_query = torch.from_numpy(np.asarray(logvar_q, dtype=np.float32)).to(device)[None]
    distances = elementwise_distance(
        metric,
        mu_query.expand_as(mu_g),
        logvar_query.expand_as(mu_g),
        mu_g,
        logvar_g,
        **distance_params(metric),
    )  # (C',)
    order = torch.sort(distances, stable=True).indices[:keep]  # (M,)
    return Ranked(
        rows=rows[order.cpu().numpy()],
        distances=distances[order],
        mu=mu_g[order],
        logvar=logvar_g[order],
    )


def draw_distances(
    metric: str,
    mc_mu: torch.Tensor,
    mc_logvar: torch.Tensor,
    candidate_mu: torch.Tensor,
    candidate_logvar: torch.Tensor,
) -> torch.Tensor:
    """Distance of every MC draw of every query to each of its own candidates.

    mc_mu, mc_logvar: (L, Q, D) draws; candidate_mu, candidate_logvar: (Q, M, D), each query's
    shortlist -> (L, Q, M). Computed elementwise, so memory is L * Q * M * D.
    """
    num_draws, num_queries, dim = mc_mu.shape
    m = candidate_mu.shape[1]
    device = candidate_mu.device

    def queries(x: torch.Tensor) -> torch.Tensor:  # (L, Q, D) -> (L * Q * M, D)
        return x.to(device, torch.float32)[:, :, None, :].expand(-1, -1, m, -1).reshape(-1, dim)

    def candidates(x: torch.Tensor) -> torch.Tensor:  # (Q, M, D) -> (L * Q * M, D)
        return x[None].expand(num_draws, -1, -1, -1).reshape(-1, dim)

    distances = elementwise_distance(
        metric,
        queries(mc_mu),
        queries(mc_logvar),
        candidates(candidate_mu),
        candidates(candidate_logvar),
        **distance_params(metric),
    )  # (L * Q * M,)
    return distances.reshape(num_draws, num_queries, m)
