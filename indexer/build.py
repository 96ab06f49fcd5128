"""FAISS indexes from metric-native augmented vectors: type choice and build (the write side).

One index per family (models.distance.augmented). Exact mu/logvar never live in FAISS: the
indexes only produce shortlists. Searching them is indexer.read_index; tuning their search
parameters is indexer.tuning.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np

from indexer.read_index import DuplicateGroups
from models.distance.augmented import augmented_dim, gallery_vectors, index_form

INDEX_TYPES = ("auto", "flat", "ivf", "ivfsq", "hnsw", "ivfpq")
COMPRESSED_TYPES = ("ivfsq", "ivfpq")  # codes reorder close neighbours: tuned for a shortlist
SQ_CODEC = "SQ8"  # one byte per dimension, per-dimension range: keeps L2 and inner products
FLAT_MAX_ITEMS = 50_000  # below this, exact search is fast enough (< ~10 ms per query on CPU)
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 80
ADD_BATCH_ROWS = 65_536
PQ_GPU_SUBQUANTIZERS = (1, 2, 3, 4, 8, 12, 16, 20, 24, 28, 32, 48, 56, 64, 96)


class IndexBuildError(ValueError):
    """An index cannot be built as asked (unknown type, gallery too small, over budget)."""


@dataclass(frozen=True)
class IndexPlan:
    """The chosen index type and its build parameters per family."""

    index_type: str
    params: dict[str, dict[str, Any]]  # family -> {"nlist", "pq_m", "hnsw_m", "pad_dim", ...}


def ivf_nlist(count: int) -> int:
    """About 4*sqrt(N) lists (a power of two), with at least 39 training points per list."""
    nlist = 2 ** round(math.log2(max(4.0 * math.sqrt(count), 1.0)))
    return int(max(1, min(nlist, count // 39)))


def pq_subquantizers(dim: int) -> tuple[int, int]:
    """PQ sub-quantizer count m (one GPU supports, about 4 dims each) and the padded dim."""
    m = max(q for q in PQ_GPU_SUBQUANTIZERS if q <= max(1, dim // 4))
    return m, m * math.ceil(dim / m)


def bytes_per_item(index_type: str, dim: int) -> float:
    """Approximate resident bytes per gallery item of one family's index."""
    if index_type == "flat":
        return 4.0 * dim
    if index_type == "ivf":
        return 4.0 * dim + 8
    if index_type == "ivfsq":
        return float(dim + 8)
    if index_type == "hnsw":
        return 4.0 * (dim + 1) + 2 * HNSW_M * 4 * 1.05  # level-0 links dominate
    if index_type == "ivfpq":
        return float(pq_subquantizers(dim)[0] + 8)
    raise IndexBuildError(f"unknown index type {index_type!r}; choose one of {INDEX_TYPES}")


def default_memory_budget() -> int:
    """Half of the machine's physical memory, in bytes."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.5)


def plan_index(
    index_type: str, count: int, dim: int, families: tuple[str, ...], memory_budget: int
) -> IndexPlan:
    """Choose the index type ("auto") and its parameters for `count` items of dimension `dim`.

    auto: flat below FLAT_MAX_ITEMS items (exact); IVF-Flat while the full vectors of every
    family fit the memory budget; IVF-SQ8 (a byte per dimension, 4x smaller) while its codes
    fit; beyond, an IndexBuildError. auto never picks IVF-PQ: its codes lose the inner-product
    families (at 1M items only ~40% of the exact KL top-10 survives in its top-100). HNSW and
    IVF-PQ are available on request (HNSW: lowest latency, but ~270 B/item more and a slow
    build; inner-product families go through a MIPS->L2 map).
    """
    if index_type not in INDEX_TYPES:
        raise IndexBuildError(f"unknown index type {index_type!r}; choose one of {INDEX_TYPES}")
    dims = {family: augmented_dim(family, dim) for family in families}
    if index_type == "auto":
        index_type = _auto_type(count, dims, memory_budget)
    minimum = {"ivf": 2 * 39, "ivfsq": 2 * 39, "ivfpq": 1024}.get(index_type, 1)  # k-means
    if count < minimum:
        raise IndexBuildError(
            f"{index_type} needs at least {minimum} items; got {count}: use --index-type flat"
        )
    params: dict[str, dict[str, Any]] = {}
    for family, d in dims.items():
        p: dict[str, Any] = {"dim": d, "faiss_metric": index_form(family).faiss_metric}
        if index_type in ("ivf", "ivfsq", "ivfpq"):
            p["nlist"] = ivf_nlist(count)
        if index_type == "ivfsq":
            p["sq"] = SQ_CODEC
        if index_type == "ivfpq":
            p["pq_m"], p["pad_dim"] = pq_subquantizers(d)
        if index_type == "hnsw":
            p["hnsw_m"] = HNSW_M
            p["ef_construction"] = HNSW_EF_CONSTRUCTION
        params[family] = p
    return IndexPlan(index_type, params)


def _auto_type(count: int, dims: dict[str, int], memory_budget: int) -> str:
    """flat, ivf or ivfsq: the most exact type whose vectors fit `memory_budget` bytes."""
    if count < FLAT_MAX_ITEMS:
        return "flat"
    for index_type in ("ivf", "ivfsq"):
        needed = count * sum(bytes_per_item(index_type, d) for d in dims.values())
        if needed <= memory_budget:
            return index_type
    raise IndexBuildError(
        f"{count} items of families {', '.join(dims)} need {needed / 2**30:.1f} GiB as IVF-SQ8"
        f" codes, over the index memory budget of {memory_budget / 2**30:.1f} GiB: raise the"
        " budget (--memory-budget-gb), serve fewer metrics, or ask for --index-type ivfpq"
        " (compact, but it loses most of the exact top-10 of the inner-product families)"
    )


def _new_index(index_type: str, dim: int, params: dict[str, Any], metric: int) -> faiss.Index:
    """An empty (untrained) FAISS index of the plan's type for `dim`-dimensional vectors."""
    if index_type == "flat":
        return faiss.index_factory(dim, "Flat", metric)
    if index_type == "ivf":
        return faiss.index_factory(dim, f"IVF{params['nlist']},Flat", metric)
    if index_type == "ivfsq":  # residuals to the list centroid: a narrower range per byte
        return faiss.index_factory(dim, f"IVF{params['nlist']},{params['sq']}", metric)
    if index_type == "hnsw":
        index = faiss.index_factory(dim, f"HNSW{params['hnsw_m']},Flat", metric)
        faiss.downcast_index(index).hnsw.efConstruction = params["ef_construction"]
        return index
    # "np": no polysemous training (slow, only useful for Hamming-filtered search). Zero
    # padding to pad_dim (a multiple of m) preserves L2 and IP; a random rotation would too,
    # but costs a BLAS call per query that stalls under OpenMP contention (8 ms measured).
    pad_dim = params["pad_dim"]
    pq = faiss.index_factory(pad_dim, f"IVF{params['nlist']},PQ{params['pq_m']}x8np", metric)
    if pad_dim == dim:
        return pq
    return faiss.IndexPreTransform(faiss.RemapDimensionsTransform(dim, pad_dim, True), pq)


def row_batches(count: int, batch_rows: int = ADD_BATCH_ROWS) -> Iterator[slice]:
    for start in range(0, count, batch_rows):
        yield slice(start, min(start + batch_rows, count))


def family_vectors(family: str, mu: np.ndarray, logvar: np.ndarray, rows) -> np.ndarray:
    """Augmented gallery vectors (n, D') of some rows of (possibly float16, mmapped) arrays."""
    return gallery_vectors(family, np.asarray(mu[rows], np.float32), np.asarray(logvar[rows]))


def _mips_radius2(family: str, mu: np.ndarray, logvar: np.ndarray, rows: np.ndarray) -> float:
    """Largest squared norm of the family's gallery vectors (for the MIPS->L2 map)."""
    radius2 = 0.0
    for batch in row_batches(len(rows)):
        vectors = family_vectors(family, mu, logvar, rows[batch]).astype(np.float64)
        radius2 = max(radius2, float((vectors**2).sum(axis=1).max()))
    return radius2 * (1 + 1e-6)


def to_mips_l2(vectors: np.ndarray, radius2: float) -> np.ndarray:
    """Gallery x -> [x, sqrt(R^2 - |x|^2)]: then argmin L2 to [q, 0] = argmax <q, x>."""
    norms2 = (vectors.astype(np.float64) ** 2).sum(axis=1)  # (n,)
    extra = np.sqrt(np.maximum(radius2 - norms2, 0.0))[:, None]
    return np.ascontiguousarray(np.concatenate([vectors, extra], axis=1), dtype=np.float32)


def duplicate_representatives(mu: np.ndarray, logvar: np.ndarray) -> np.ndarray | None:
    """For each row, the first row with the same mu and logvar (N,) int64; None if all differ.

    Galleries repeat captions ("a man riding a wave"); indexing each embedding once keeps HNSW
    graphs connected (with half the shapes captions duplicated, HNSW recall fell to 0.7).
    Streams the (memory-mapped) arrays: a 64-bit hash per row, then exact byte comparison
    within rows that share a hash.
    """
    count = len(mu)
    multipliers = np.random.default_rng(0).integers(1, 2**63, 4 * mu.shape[1], dtype=np.uint64)
    hashes = np.empty(count, np.uint64)
    for rows in row_batches(count):
        words = _row_bytes(mu, logvar, rows).view(np.uint32).astype(np.uint64)  # (b, W)
        hashes[rows] = (words * multipliers[: words.shape[1]]).sum(axis=1)  # wraps mod 2^64
    order = np.argsort(hashes, kind="stable")  # (N,) equal hashes adjacent, rows ascending
    starts = np.flatnonzero(np.r_[True, hashes[order][1:] != hashes[order][:-1]])
    sizes = np.diff(np.r_[starts, count])
    if np.all(sizes == 1):
        return None
    representatives = np.arange(count, dtype=np.int64)
    for start, size in zip(starts[sizes > 1], sizes[sizes > 1], strict=True):
        rows = order[start : start + size]  # ascending row numbers
        content = _row_bytes(mu, logvar, rows)
        keys = content.view(np.dtype((np.void, content.shape[1] * 4))).ravel()
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        representatives[rows] = rows[first[inverse.ravel()]]
    return representatives if np.any(representatives != np.arange(count)) else None


def _row_bytes(mu: np.ndarray, logvar: np.ndarray, rows) -> np.ndarray:
    """The stored bytes of mu and logvar rows as uint32 words (n, W)."""
    both = np.concatenate([np.asarray(mu[rows]), np.asarray(logvar[rows])], axis=1)
    return np.ascontiguousarray(both).view(np.uint8).reshape(len(both), -1).view(np.uint32)


def build_family_index(
    family: str,
    mu: np.ndarray,
    logvar: np.ndarray,
    plan: IndexPlan,
    *,
    duplicates: DuplicateGroups | None = None,
    seed: int = 0,
) -> tuple[faiss.Index, dict[str, Any]]:
    """Build one family's index from mu, logvar (N, D); returns it and its final parameters.

    With `duplicates`, only the representative rows are added (under their row numbers).
    """
    params = dict(plan.params[family])
    metric = faiss.METRIC_INNER_PRODUCT if params["faiss_metric"] == "ip" else faiss.METRIC_L2
    rows = duplicates.unique_rows if duplicates is not None else np.arange(len(mu))
    if plan.index_type == "hnsw" and metric == faiss.METRIC_INNER_PRODUCT:
        # HNSW graphs are unreliable under raw inner product (recall ~0.01 on KL vectors, see
        # benchmarks/README.md); the MIPS->L2 map makes the search a true metric search.
        params["mips_radius2"] = _mips_radius2(family, mu, logvar, rows)
        metric = faiss.METRIC_L2
    if "nlist" in params:  # duplicates leave fewer vectors to train on than planned
        params["nlist"] = max(1, min(params["nlist"], len(rows) // 39))
    if "pq_m" in params and len(rows) < 1024:
        raise IndexBuildError(f"ivfpq needs 1024 distinct embeddings; got {len(rows)}: use flat")
    mips = params.get("mips_radius2")
    index = _new_index(plan.index_type, params["dim"] + (mips is not None), params, metric)
    if not index.is_trained:
        index.train(_training_sample(family, mu, logvar, rows, params, seed))
    if duplicates is not None and plan.index_type in ("flat", "hnsw"):
        index = faiss.IndexIDMap(index)  # IVF indexes store ids natively
    for batch in row_batches(len(rows)):
        vectors = family_vectors(family, mu, logvar, rows[batch])
        vectors = to_mips_l2(vectors, mips) if mips is not None else vectors
        if duplicates is None:
            index.add(vectors)  # ids = insertion order = rows
        else:
            index.add_with_ids(vectors, rows[batch].astype(np.int64))
    params["vectors"] = len(rows)
    return index, params


def _training_sample(
    family: str,
    mu: np.ndarray,
    logvar: np.ndarray,
    rows: np.ndarray,
    params: dict[str, Any],
    seed: int,
) -> np.ndarray:
    """A seeded random sample of `rows`' vectors: 64 per IVF list, at least 10k for PQ."""
    wanted = 64 * params["nlist"]
    if "pq_m" in params:
        wanted = max(wanted, 256 * 40)
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(rows, size=min(wanted, len(rows)), replace=False))
    return family_vectors(family, mu, logvar, sample)
