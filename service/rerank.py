"""Exact re-rank of a shortlist and the query's uncertainty over it (torch, GPU when present)."""

from dataclasses import dataclass

import numpy as np
import torch

from models.gaussian import pairwise_distance
from models.uncertainty import (
    entropy,
    feature_uncertainty,
    log_det,
    mutual_information,
    retrieval_posterior,
)

# Fixed noise for match_prob (a sampled distance), so the same request ranks the same way.
MATCH_PROB_SEED = 0


def rerank_device(device: str) -> torch.device:
    """torch device of the re-rank: CUDA when present (and not forced off), else CPU."""
    if device == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


@dataclass
class Ranked:
    """The shortlist after the exact re-rank, best first (length M <= requested shortlist)."""

    rows: np.ndarray  # (M,) int64 gallery rows
    distances: torch.Tensor  # (M,) float32 exact distances, ascending
    mu: torch.Tensor  # (M, D) gallery means in the same order
    logvar: torch.Tensor  # (M, D)


def _distance(metric: str, mu_q, logvar_q, mu_g, logvar_g) -> torch.Tensor:
    params = {"seed": MATCH_PROB_SEED} if metric == "match_prob" else {}
    return pairwise_distance(metric, mu_q, logvar_q, mu_g, logvar_g, **params)


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
        candidate_rows: rows proposed by the index, (C,); -1 (padding) and repeats are dropped.
    Ties are broken by the smaller row, so the order is the same as a stable sort of the
    whole gallery by distance.
    """
    rows = np.unique(candidate_rows[candidate_rows >= 0]).astype(np.int64)  # (C',) ascending
    mu_g = torch.from_numpy(np.asarray(gallery_mu[rows], dtype=np.float32)).to(device)  # (C', D)
    logvar_g = torch.from_numpy(np.asarray(gallery_logvar[rows], dtype=np.float32)).to(device)
    mu_query = torch.from_numpy(np.asarray(mu_q, dtype=np.float32)).to(device)[None]  # (1, D)
    logvar_query = torch.from_numpy(np.asarray(logvar_q, dtype=np.float32)).to(device)[None]
    distances = _distance(metric, mu_query, logvar_query, mu_g, logvar_g)[0]  # (C',)
    order = torch.sort(distances, stable=True).indices[:keep]  # (M,)
    return Ranked(
        rows=rows[order.cpu().numpy()],
        distances=distances[order],
        mu=mu_g[order],
        logvar=logvar_g[order],
    )


def draw_distances(
    metric: str, ranked: Ranked, mc_mu: np.ndarray, mc_logvar: np.ndarray
) -> torch.Tensor:
    """Distances (L, M) from each of the query's L MC draws (L, D) to the M ranked candidates."""
    device = ranked.mu.device
    draws_mu = torch.from_numpy(np.asarray(mc_mu, dtype=np.float32)).to(device)  # (L, D)
    draws_logvar = torch.from_numpy(np.asarray(mc_logvar, dtype=np.float32)).to(device)
    return _distance(metric, draws_mu, draws_logvar, ranked.mu, ranked.logvar)


@dataclass
class Uncertainty:
    """Uncertainty of one query over its shortlist."""

    log_det: float
    entropy: float
    mutual_information: float | None  # None without MC draws
    feature_uncertainty: float | None
    scores: np.ndarray  # (M,) retrieval posterior of the shortlist candidates
    result_log_det: np.ndarray  # (M,) log det of each candidate


def query_uncertainty(
    metric: str,
    ranked: Ranked,
    logvar_q: np.ndarray,
    mc_mu: np.ndarray | None,
    mc_logvar: np.ndarray | None,
    temperature: float,
) -> Uncertainty:
    """log det and entropy of the query, MI and feature uncertainty over its MC draws.

    Args:
        logvar_q: the query's deterministic log-variance, (D,).
        mc_mu, mc_logvar: the query's L draws, (L, D), or None.
    MI uses p_l = softmax(-d_l / T) over the M shortlist candidates for each draw l, so it
    lies in [0, ln M].
    """
    logvar_query = torch.from_numpy(np.asarray(logvar_q, dtype=np.float32))
    mi = feature = None
    empty = len(ranked.rows) == 0
    if mc_mu is not None and mc_logvar is not None and len(mc_mu) > 0 and not empty:
        distances = draw_distances(metric, ranked, mc_mu, mc_logvar)  # (L, M)
        mi = float(mutual_information(distances[:, None, :], temperature)[0])  # (L, 1, M)
        draws_mu = torch.from_numpy(np.asarray(mc_mu, dtype=np.float32))[:, None, :]  # (L, 1, D)
        feature = float(feature_uncertainty(draws_mu)[0])
    return Uncertainty(
        log_det=float(log_det(logvar_query)),
        entropy=float(entropy(logvar_query)),
        mutual_information=mi,
        feature_uncertainty=feature,
        scores=(
            np.zeros(0, dtype=np.float32)
            if empty
            else retrieval_posterior(ranked.distances, temperature).cpu().numpy()
        ),
        result_log_det=log_det(ranked.logvar).cpu().numpy(),
    )
