"""Serving a pvse version: best-pair ranking of the K-vector index and the query's scores.

A result's distance is 1 - best-pair cosine (in [0, 2], smaller is closer); the MC draws'
distances to the same results give MI as for the Gaussian metrics (models.scoring), and each
result's log_det is the spread of its K vectors (docs/pvse.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from models.pvse.max_pair import shortlist_max_pair_distance
from models.scoring.query_scores import QueryScores, query_scores
from models.scoring.rerank import Ranked, gather_rows
from service.errors import InvalidQueryError


def check_max_pair(index: Any, gallery: str, embeddings: np.ndarray | None) -> None:
    """InvalidQueryError unless the version has K vectors per item and the query has K too."""
    if index.multivector is None:
        raise InvalidQueryError(
            f"metric 'max_pair' needs a {gallery} index built from a pvse model; this one "
            f"serves {', '.join(index.manifest.metrics)}"
        )
    if embeddings is None:
        raise InvalidQueryError(
            "metric 'max_pair' needs the K embeddings of a pvse encoder; an embedding query "
            "(mu, logvar) has none"
        )


def rank_max_pair(index: Any, embeddings: np.ndarray, keep: int, device: torch.device) -> Ranked:
    """The exact top-`keep` rows by best-pair cosine to the query's K vectors (K, D)."""
    scores, rows = index.multivector.search(embeddings[None], keep)  # (1, M) each
    return Ranked(
        rows=rows[0],
        distances=torch.from_numpy(1.0 - scores[0]).to(device),
        mu=gather_rows(index.mu, rows[0], device),
        logvar=gather_rows(index.logvar, rows[0], device),
    )


def max_pair_scores(
    index: Any,
    logvar: np.ndarray,
    mc_embeddings: np.ndarray | None,
    mc_mu: np.ndarray | None,
    ranked: Ranked,
    temperature: float,
) -> QueryScores:
    """models.scoring's scores of one query over its ranked results (distance 1 - cosine)."""
    distances = ranked.distances.double().cpu()[None]  # (1, M)
    mc_distances = mc_mean = None
    if mc_embeddings is not None and len(mc_embeddings) > 0 and mc_mu is not None:
        items = gather_rows(index.multivector.embeddings, ranked.rows, torch.device("cpu"))
        draws = torch.from_numpy(np.asarray(mc_embeddings, np.float32))[:, None]  # (L, 1, K, D)
        mc_distances = shortlist_max_pair_distance(draws, items[None])  # (L, 1, M)
        mc_mean = torch.from_numpy(np.asarray(mc_mu, np.float32))[:, None]  # (L, 1, D)
    query_logvar = torch.from_numpy(np.asarray(logvar, np.float32))[None]  # (1, D)
    return query_scores(query_logvar, distances, temperature, mc_mean, mc_distances)
