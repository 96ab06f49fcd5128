"""Exact best-pair search over K vectors per item (PVSE): one FAISS index with an id map.

An item j is K unit vectors y_j1..y_jK; a query is K' unit vectors x_1..x_K'. The item's
score is its best pair, s(j) = max_{p,q} <x_p, y_jq> (cosine), and the search returns the k
items of largest score.

Why fetching the top k*K vectors per query vector is enough (exact with a flat index).
Let s_k be the k-th largest item score. Take any item j with s(j) >= s_k, its best pair
(p, q) and v = y_jq, so <x_p, v> = s(j). Suppose v is not among the k*K vectors fetched for
x_p. Then each of those k*K vectors u has <x_p, u> >= s(j). An item owns at most K vectors,
so they belong to at least k distinct items, and each such item i has
s(i) >= <x_p, u> >= s(j), and is itself a candidate. Two cases:
- s(j) > s_k: at least k items would score above s_k, so s_k would not be the k-th largest
  score. Contradiction: every item scoring above s_k is a candidate.
- s(j) = s_k: either v was fetched (j is a candidate) or at least k candidates score >= s_k.
Either way the candidates hold every item above s_k and at least k items of score >= s_k.
Re-scoring the candidates exactly (all K' x K pairs of their stored vectors) and keeping the
best k therefore gives exactly the top-k scores; only the choice among items tied at s_k may
differ from a full scan. With IVF/HNSW the fetched vectors are approximate and so is the
result (its recall belongs in the index benchmark).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import faiss
import numpy as np
import torch

from models.pvse.max_pair import max_pair_similarity

MULTIVECTOR_FILE = "max_pair.faiss"
EMBEDDINGS_FILE = "embeddings.npy"  # (N, K, D) float32 unit vectors, row n = gallery row n


class MultiVectorError(ValueError):
    """Embeddings or a query that the multi-vector index cannot use (the message says why)."""


def _check(vectors: np.ndarray, name: str) -> np.ndarray:
    if vectors.ndim != 3 or 0 in vectors.shape:
        raise MultiVectorError(f"{name} must be (N, K, D) with N, K, D >= 1; got {vectors.shape}")
    array = np.ascontiguousarray(vectors, dtype=np.float32)
    if not np.isfinite(array).all():
        raise MultiVectorError(f"{name} holds NaN or infinite values")
    return array


def best_pair_scores(queries: np.ndarray, items: np.ndarray) -> np.ndarray:
    """max over pairs of <x_p, y_q>: queries (Q, K', D), items (M, K, D) -> (Q, M) float32."""
    a, b = (torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)) for x in (queries, items))
    return max_pair_similarity(a, b).numpy()  # the one copy of the formula, models.pvse


class MultiVectorIndex:
    """K vectors per gallery row in one inner-product FAISS index; vector ids are rows."""

    def __init__(self, embeddings: np.ndarray, index: faiss.Index | None = None) -> None:
        self.embeddings = embeddings  # (N, K, D), possibly memory-mapped
        self.count, self.per_item, self.dim = embeddings.shape
        self.index = index if index is not None else self._build(_check(embeddings, "embeddings"))

    @staticmethod
    def _build(embeddings: np.ndarray) -> faiss.Index:
        count, per_item, dim = embeddings.shape
        index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        rows = np.repeat(np.arange(count, dtype=np.int64), per_item)  # (N * K,)
        index.add_with_ids(embeddings.reshape(-1, dim), rows)
        return index

    def save(self, version_dir: Path) -> None:
        """Write embeddings.npy and max_pair.faiss into a version dir."""
        np.save(version_dir / EMBEDDINGS_FILE, np.asarray(self.embeddings, dtype=np.float32))
        faiss.write_index(self.index, str(version_dir / MULTIVECTOR_FILE))

    @classmethod
    def load(cls, version_dir: Path) -> MultiVectorIndex:
        """Open a version dir's embeddings (memory-mapped) and index."""
        embeddings = np.load(version_dir / EMBEDDINGS_FILE, mmap_mode="r")
        return cls(embeddings, faiss.read_index(str(version_dir / MULTIVECTOR_FILE)))

    def candidates(self, queries: np.ndarray, k: int) -> list[np.ndarray]:
        """Per query, the gallery rows owning one of the top k*K vectors of any of its
        vectors (ascending, unique); they contain the exact top-k (module docstring)."""
        queries = _check(queries, "queries")
        num_queries, per_query, dim = queries.shape
        if dim != self.dim:
            raise MultiVectorError(f"queries have {dim} dimensions, the index holds {self.dim}")
        fetch = min(k * self.per_item, self.index.ntotal)
        _, ids = self.index.search(queries.reshape(-1, dim), fetch)  # (Q * K', fetch)
        ids = ids.reshape(num_queries, per_query * fetch)
        return [np.unique(row[row >= 0]) for row in ids]

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k items by best-pair cosine: (scores, rows), each (Q, min(k, N)), best
        first; ties go to the smaller row."""
        if k < 1:
            raise MultiVectorError(f"k must be >= 1, got {k}")
        keep = min(k, self.count)
        queries = _check(queries, "queries")
        scores = np.empty((len(queries), keep), dtype=np.float32)
        rows = np.empty((len(queries), keep), dtype=np.int64)
        for i, candidate_rows in enumerate(self.candidates(queries, k)):
            items = np.asarray(self.embeddings[candidate_rows], dtype=np.float32)
            exact = best_pair_scores(queries[i : i + 1], items)[0]  # (C,)
            order = np.argsort(-exact, kind="stable")[:keep]
            scores[i], rows[i] = exact[order], candidate_rows[order]
        return scores, rows


def write_multivector(version_dir: Path, parts: Iterable[np.ndarray | None]) -> bool:
    """Build and save the index from the gallery's (n, K, D) parts in row order; nothing when
    the encoder gave no K embeddings (a Gaussian model). Returns whether it wrote one."""
    chunks = list(parts)
    if not chunks or any(c is None for c in chunks):
        return False
    MultiVectorIndex(np.concatenate(chunks)).save(version_dir)
    return True


def open_multivector(version_dir: Path) -> MultiVectorIndex | None:
    """The version's multi-vector index, or None when it has none."""
    if not (version_dir / MULTIVECTOR_FILE).is_file():
        return None
    return MultiVectorIndex.load(version_dir)
