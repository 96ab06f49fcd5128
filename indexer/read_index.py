"""Query-time index classes (the read side): a family's FAISS index, read from its file in a
version dir onto the device, searched in Gaussian terms.

Search parameters (nprobe / efSearch) are stored per family and passed with every search call,
never set on the shared index. Duplicate embeddings are indexed once and expanded here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from indexer.manifest import ManifestError
from models.distance.augmented import query_vectors, scores_to_distances

log = logging.getLogger(__name__)


class DuplicateGroups:
    """Rows sharing one embedding; the index holds each group once, under its first row."""

    def __init__(self, representatives: np.ndarray) -> None:
        self.representatives = np.asarray(representatives, np.int64)  # (N,)
        self._order = np.argsort(self.representatives, kind="stable")  # (N,) grouped rows
        self._sorted = self.representatives[self._order]
        self.unique_rows = np.flatnonzero(self.representatives == np.arange(len(representatives)))
        rows = np.arange(len(self.representatives))
        self._size = np.bincount(self.representatives, minlength=len(rows))  # (N,) per group
        self._start = np.searchsorted(self._sorted, rows)  # (N,) where a group starts in _order

    def members(self, representative: int) -> np.ndarray:
        """All rows of a group, in row order (the representative first)."""
        start = self._start[representative]
        return self._order[start : start + self._size[representative]]

    def expand(
        self, distances: np.ndarray, rows: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Replace each representative (Q, k') by its group's rows, keeping the first k of each
        query; a query's rows end at its first -1. Vectorised: a Python loop over the
        representatives cost a re-rank's shortlist about 0.5 ms a query."""
        rows = np.asarray(rows, np.int64)
        searched = np.cumprod(rows >= 0, axis=1).astype(bool)  # (Q, k') up to the first -1
        sizes = np.where(searched, self._size[np.where(searched, rows, 0)], 0)  # (Q, k')
        entry = np.repeat(np.arange(sizes.size), sizes.ravel())  # (T,) a (q, j) per member
        offset = np.arange(len(entry)) - np.repeat(np.cumsum(sizes) - sizes.ravel(), sizes.ravel())
        slot = np.repeat((np.cumsum(sizes, axis=1) - sizes).ravel(), sizes.ravel()) + offset
        kept = slot < k
        entry, slot = entry[kept], slot[kept]
        query = entry // max(rows.shape[1], 1)
        out_distances = np.full((len(rows), k), np.inf, np.float32)
        out_rows = np.full((len(rows), k), -1, np.int64)
        out_rows[query, slot] = self._order[self._start[rows.ravel()[entry]] + offset[kept]]
        out_distances[query, slot] = np.asarray(distances).ravel()[entry]
        return out_distances, out_rows


class RowSelection:
    """The rows of a version a search may return (the live ones, those a filter matches), as
    a FAISS ID selector over the row numbers the index holds."""

    def __init__(self, allowed: np.ndarray) -> None:
        self.allowed = np.asarray(allowed, bool)  # (N,)
        self.count = int(self.allowed.sum())
        self.excluded = len(self.allowed) - self.count
        self._selectors: dict[bool, tuple[faiss.IDSelector, np.ndarray]] = {}

    def rows(self) -> np.ndarray:
        """The allowed rows, ascending."""
        return np.flatnonzero(self.allowed)

    def selector(self, duplicates: DuplicateGroups | None) -> faiss.IDSelector:
        """A bitmap selector of the ids in the index: the allowed rows, or with duplicate
        embeddings each group's representative when any of its rows is allowed."""
        key = duplicates is not None
        if key not in self._selectors:
            ids = self.allowed
            if duplicates is not None:
                ids = np.zeros(len(self.allowed), bool)
                ids[duplicates.representatives[self.allowed]] = True
            bitmap = np.packbits(ids, bitorder="little")
            # the selector reads the bitmap in place: keep it alive with the selector
            self._selectors[key] = (
                faiss.IDSelectorBitmap(len(ids), faiss.swig_ptr(bitmap)),
                bitmap,
            )
        return self._selectors[key][0]

    def first_allowed(
        self, distances: np.ndarray, rows: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each query's first k allowed rows (Q, k), in the order given, -1 / +inf padded."""
        keep = (rows >= 0) & self.allowed[np.maximum(rows, 0)]
        out_distances = np.full((len(rows), k), np.inf, np.float32)
        out_rows = np.full((len(rows), k), -1, np.int64)
        for q in range(len(rows)):
            found = np.flatnonzero(keep[q])[:k]
            out_rows[q, : len(found)] = rows[q, found]
            out_distances[q, : len(found)] = distances[q, found]
        return out_distances, out_rows


class FamilyIndex:
    """One family's FAISS index with its search parameters; searches in Gaussian terms.

    `selection_index`, when given, answers the searches among selected rows (`allowed`): the
    CPU original of a GPU copy. On an H100 (benchmarks/results/gpu_faiss_check.md) FAISS's
    GPU indexes either failed such searches (cuVS IVF-Flat: a CUDA "invalid argument") or
    answered them with other rows than the CPU index (FAISS's own GPU code), so a filter or a
    live gallery's deletions are never trusted to the GPU copy.
    """

    def __init__(
        self,
        family: str,
        index: faiss.Index,
        params: dict[str, Any],
        search_params: dict[str, Any],
        duplicates: DuplicateGroups | None = None,
        selection_index: faiss.Index | None = None,
    ) -> None:
        self.family = family
        self.index = index
        self.selection_index = index if selection_index is None else selection_index
        self.params = params
        self.search_params = dict(search_params)
        self.duplicates = duplicates
        self._mips_radius2: float | None = params.get("mips_radius2")

    @property
    def count(self) -> int:
        """Vectors in the index (duplicate embeddings count once)."""
        return int(self.index.ntotal)

    def search(
        self,
        mu_q: np.ndarray,
        logvar_q: np.ndarray | None,
        k: int,
        search_params: dict[str, Any] | None = None,
        allowed: RowSelection | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Distances (Q, k) float32 of the family's metric and rows (Q, k) int64, -1 padded;
        only `allowed` rows when given (searched inside FAISS, so k come back whenever k
        rows are allowed)."""
        distances, rows = self.search_index(mu_q, logvar_q, k, search_params, allowed)
        if self.duplicates is None:
            return distances, rows
        if allowed is None:
            return self.duplicates.expand(distances, rows, k)
        # a group is searched when any of its rows is allowed: expand all, keep the allowed
        wide = min(len(self.duplicates.representatives), k + allowed.excluded)
        distances, rows = self.duplicates.expand(distances, rows, wide)
        return allowed.first_allowed(distances, rows, k)

    def search_index(
        self,
        mu_q: np.ndarray,
        logvar_q: np.ndarray | None,
        k: int,
        search_params: dict[str, Any] | None = None,
        allowed: RowSelection | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Like search, but duplicate embeddings appear once, as their representative row."""
        queries, const = query_vectors(self.family, mu_q, logvar_q)  # (Q, D'), (Q,)
        if self._mips_radius2 is not None:
            queries = np.concatenate([queries, np.zeros((len(queries), 1), np.float32)], axis=1)
        selector = None if allowed is None else allowed.selector(self.duplicates)
        index = self.index if selector is None else self.selection_index
        faiss_params = make_search_parameters(index, search_params or self.search_params, selector)
        scores, rows = index.search(queries, k, params=faiss_params)  # (Q, k) each
        if self._mips_radius2 is not None:
            # ||q' - x'||^2 = |q|^2 + R^2 - 2 <q, x>  ->  <q, x>
            q_norm2 = (queries.astype(np.float64) ** 2).sum(axis=1, keepdims=True)
            scores = np.where(rows >= 0, 0.5 * (q_norm2 + self._mips_radius2 - scores), -np.inf)
        distances = scores_to_distances(self.family, scores, const)
        distances[rows < 0] = np.inf
        return distances, rows.astype(np.int64)


def make_search_parameters(
    index: faiss.Index, search_params: dict[str, Any], selector: faiss.IDSelector | None = None
) -> faiss.SearchParameters | None:
    """Per-call faiss.SearchParameters for `index` (None for flat indexes searched whole).

    IndexIDMap passes them through to its index, translating the selector's ids;
    IndexPreTransform needs them wrapped.
    """
    params: faiss.SearchParameters | None = None
    if "nprobe" in search_params:
        params = faiss.SearchParametersIVF(nprobe=int(search_params["nprobe"]))
    elif "efSearch" in search_params:
        params = faiss.SearchParametersHNSW(efSearch=int(search_params["efSearch"]))
    if selector is not None:
        params = params if params is not None else faiss.SearchParameters()
        params.sel = selector
    if params is not None and isinstance(index, faiss.IndexPreTransform):
        wrapper = faiss.SearchParametersPreTransform()
        wrapper.index_params = params
        wrapper.referenced_objects = [params]  # keep the inner object alive with the wrapper
        params = wrapper
    return params


def to_device(index: faiss.Index, device: str, name: str = "index") -> faiss.Index:
    """`index` copied to all GPUs when `device` is "cuda", or "auto" and FAISS sees a GPU.

    HNSW (no GPU implementation) and indexes FAISS cannot copy stay on the CPU, with a log line.
    """
    num_gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    want_gpu = device == "cuda" or (device == "auto" and num_gpus > 0)
    if not want_gpu:
        return index
    if num_gpus == 0:
        raise ValueError("device='cuda' asked for, but this FAISS build sees no GPU")
    if isinstance(index, faiss.IndexHNSW):
        log.info("%s: HNSW has no GPU implementation; searching it on CPU", name)
        return index
    try:
        return faiss.index_cpu_to_all_gpus(index)
    except RuntimeError as e:  # e.g. a pre-transform or PQ size the GPU code does not take
        log.warning("%s stays on CPU: FAISS could not copy it to the GPU (%s)", name, e)
        return index


def index_file_name(family: str) -> str:
    """File name of a family's FAISS index inside a version dir."""
    return f"{family}.faiss"


def place_family(
    family: str,
    index: faiss.Index,
    device: str,
    params: dict[str, Any],
    search_params: dict[str, Any],
    duplicates: DuplicateGroups | None = None,
) -> FamilyIndex:
    """A FamilyIndex over `index` copied to the GPUs (to_device), keeping the CPU original for
    the searches among selected rows when it was copied."""
    searched = to_device(index, device, f"{family}.faiss")
    original = None if searched is index else index
    return FamilyIndex(family, searched, params, search_params, duplicates, original)


def read_family_index(path: Path) -> faiss.Index:
    """A family's FAISS index read from its file in a version dir, on the CPU."""
    if not path.is_file():
        raise ManifestError(f"index file {path} is missing")
    return faiss.read_index(str(path))
