"""The pvse match, written once: the best cosine over the K x K pairs of two items' unit
embeddings, and the distance `max_pair` = 1 - that cosine (in [0, 2], smaller is closer).

Training (models.pvse.losses), evaluation (models.evaluation.evaluate), the multi-vector index
(indexer.multivector) and the service (service.pvse_search) all call these functions.
"""

from __future__ import annotations

import torch

MAX_PAIR = "max_pair"  # the metric name of model.json, eval and the service


def max_pair_similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Best cosine over the K x K' pairs: (A, K, D) x (B, K', D) unit vectors -> (A, B)."""
    pairs = torch.einsum("apd,bqd->abpq", a, b)  # (A, B, K, K')
    return pairs.flatten(2).max(dim=-1).values


def max_pair_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """1 - best-pair cosine of every item of `a` to every item of `b`: (A, K, D) x (B, K', D)
    -> (A, B)."""
    return 1.0 - max_pair_similarity(a, b)


def shortlist_max_pair_distance(queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """1 - best-pair cosine of each query to its own candidates.

    queries: (..., Q, K, D), e.g. (Q, K, D) or the MC draws (L, Q, K, D); candidates
    (Q, M, K', D), query q's shortlist -> (..., Q, M).
    """
    pairs = torch.einsum("...qpd,qmkd->...qmpk", queries, candidates)  # (..., Q, M, K, K')
    return 1.0 - pairs.flatten(-2).max(dim=-1).values
