"""Search-parameter tuning: the cheapest nprobe / efSearch that reaches a recall target.

Tuned once at build time on sampled queries against exhaustive search; the result is stored in
the manifest and passed with every search, never set on the shared index.
"""

from __future__ import annotations

import math
from typing import Any

import faiss
import numpy as np
from faiss.contrib.exhaustive_search import knn_ground_truth

from indexer.build import COMPRESSED_TYPES, IndexPlan, family_vectors, row_batches
from indexer.read_index import FamilyIndex
from models.distance.augmented import index_form, query_vectors

TARGET_RECALL = 0.98  # recall@10 that tuning aims for on sampled queries
TUNING_QUERIES = 200
CODES_SHORTLIST = 100  # IVF-SQ / IVF-PQ: tuned for the exact top-10 inside their top-100


def tuning_queries(
    mu: np.ndarray, logvar: np.ndarray, num: int = TUNING_QUERIES, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Queries (Q, D) each: half are sampled gallery items themselves (what the publish check
    searches), half are items with mu moved by half a sigma and another item's variances
    (queries come from the other modality, so their variances do not match their neighbours')."""
    rng = np.random.default_rng(seed + 1)
    rows = np.sort(rng.choice(len(mu), size=min(num, len(mu)), replace=False))
    mu_q = np.asarray(mu[rows], np.float32)
    logvar_q = np.asarray(logvar[rows], np.float32)
    moved = np.arange(len(rows)) % 2 == 1
    sigma = np.exp(0.5 * logvar_q[moved])
    mu_q[moved] += 0.5 * sigma * rng.standard_normal(sigma.shape).astype(np.float32)
    logvar_q[moved] = logvar_q[moved][rng.permutation(int(moved.sum()))]
    return mu_q, logvar_q


def exact_rows(
    family: str,
    mu: np.ndarray,
    logvar: np.ndarray,
    mu_q: np.ndarray,
    logvar_q: np.ndarray,
    k: int,
    rows: np.ndarray,
) -> np.ndarray:
    """Exhaustive top-k (Q, k) among `rows` of a family's augmented vectors (tuning truth)."""
    queries, _ = query_vectors(family, mu_q, logvar_q)
    is_ip = index_form(family).faiss_metric == "ip"
    metric = faiss.METRIC_INNER_PRODUCT if is_ip else faiss.METRIC_L2
    batches = (family_vectors(family, mu, logvar, rows[b]) for b in row_batches(len(rows)))
    _, positions = knn_ground_truth(queries, batches, k, metric_type=metric)
    return rows[positions]


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean fraction of each query's true top-k found in its returned top-k."""
    hits = [len(set(f[f >= 0]) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)]
    return float(np.mean(hits))


def tune_search_params(
    family_index: FamilyIndex,
    mu: np.ndarray,
    logvar: np.ndarray,
    plan: IndexPlan,
    *,
    k: int = 10,
    target: float = TARGET_RECALL,
    seed: int = 0,
) -> tuple[dict[str, Any], float]:
    """The cheapest nprobe / efSearch reaching `target` recall@k on sampled queries.

    For the compressed types (IVF-SQ, IVF-PQ), whose codes reorder close neighbours, recall
    counts the exact top-k found in the index's top CODES_SHORTLIST (the service re-ranks a
    shortlist of max(10 k, 100) exactly), and tuning stops when recall no longer improves.
    Returns the parameters and the recall they reached.
    """
    if plan.index_type == "flat":
        return {}, 1.0
    mu_q, logvar_q = tuning_queries(mu, logvar, seed=seed)
    duplicates = family_index.duplicates
    rows = duplicates.unique_rows if duplicates is not None else np.arange(len(mu))
    truth = exact_rows(family_index.family, mu, logvar, mu_q, logvar_q, k, rows)
    if plan.index_type == "hnsw":
        key, candidates = "efSearch", [16, 32, 64, 128, 256, 512, 1024, 2048]
    else:
        key = "nprobe"
        nlist = family_index.params["nlist"]
        candidates = [2**i for i in range(int(math.log2(nlist)) + 1)] + [nlist]
    compressed = plan.index_type in COMPRESSED_TYPES
    found_k = CODES_SHORTLIST if compressed else k
    best_value, best_recall = candidates[0], -1.0
    for value in candidates:
        _, found = family_index.search_index(mu_q, logvar_q, found_k, {key: value})
        recall = recall_at_k(found, truth)
        if recall < best_recall + 0.002 and best_recall >= 0.5 and compressed:
            break  # plateau: more probes buy nothing against the coding error
        if recall > best_recall:
            best_value, best_recall = value, recall
        if recall >= target:
            break
    return {key: int(best_value)}, best_recall
