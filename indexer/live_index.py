"""An index version opened as a live gallery: the version as built, plus the items its log
(indexer.live_log) added and deleted since, searched as one gallery (issue 43).

LiveIndex answers the same read API as IndexVersion (manifest, mu, logvar, novelty,
shortlist, metadata, record), so the searcher, the exact re-rank and the scores do not know
whether a gallery has changed. A search sees:
- the version's rows that are still live, searched inside FAISS through an ID selector
  (indexer.read_index.RowSelection), so a shortlist holds `size` live rows whenever there are;
- the added rows (the segment), few until a compaction (indexer.compaction) folds them into a
  new version, shortlisted exactly by brute force in each candidate family;
- when a filter leaves no more rows than the shortlist holds, those rows themselves, scored
  exactly.
The union goes to the exact re-rank, so for exact (flat) versions a live search equals brute
force over the live items. Writes go through `write`: logged durably, then applied.
Live writes and filters need the version's own FAISS files: a pvse version (its K-vector index)
or one served from Milvus refuses them with LiveWriteError.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from indexer.live_log import Delete, Entry, LiveLog
from indexer.live_state import LiveState, RowArrays
from indexer.manifest import Manifest
from indexer.read_index import RowSelection
from indexer.store import IndexVersion
from models.distance.augmented import candidate_families
from models.distance.gaussian import pairwise_distance

MAX_ID_CHARS = 512
# Selected rows (a filter's) scored by brute force rather than through an approximate index,
# whose probed lists would hold too few of them; beyond, the index's search is widened.
BRUTE_FORCE_ROWS = 16_384
MAX_EF_SEARCH = 4096
_FILTER_CACHE = 64  # filters whose version rows are remembered per version


class LiveWriteError(ValueError):
    """This version cannot take live writes or filters, or a write is malformed."""


class VersionMovedError(RuntimeError):
    """The version is no longer the active one (a compaction replaced it): write to that."""


class RowFilter(Protocol):
    """A filter on item metadata (indexer.metadata_filter.MetadataFilter)."""

    def cache_key(self) -> str: ...

    def matches(self, record: dict[str, Any]) -> bool: ...

    def matching_rows(self, db: Any, count: int) -> np.ndarray: ...


@dataclass(frozen=True)
class WriteResult:
    """What a write did: how many entries were logged, which deletes found no item (not
    logged), and the log offset the state now serves."""

    logged: int
    missing: tuple[str, ...]
    offset: int


class LiveIndex:
    """An IndexVersion and the writes of its log, as one gallery (module docstring)."""

    def __init__(self, version: IndexVersion) -> None:
        self.version = version
        self.log = LiveLog(version.path)
        self._state = LiveState.empty(version.manifest.count, version.manifest.dim)
        self._offset = 0
        self._lock = threading.Lock()  # one replay or write at a time
        self._filter_rows: OrderedDict[str, np.ndarray] = OrderedDict()
        self._state_cache: dict[tuple, tuple[LiveState, Any]] = {}
        self.refresh()

    # ----- what the version is ----------------------------------------------------------

    @property
    def manifest(self) -> Manifest:
        return self.version.manifest

    @property
    def path(self) -> Path:
        return self.version.path

    @property
    def backend(self) -> Any:
        return self.version.backend

    @property
    def multivector(self) -> Any:
        return self.version.multivector

    def supports(self, metric: str) -> bool:
        return self.version.supports(metric)

    def search_family(self, *args: Any, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        """The version's own family search (its rows as built)."""
        return self.version.search_family(*args, **kwargs)

    # ----- the live rows ----------------------------------------------------------------

    @property
    def live_offset(self) -> int:
        """The log offset the served state has applied (0: the version as built)."""
        return self._offset

    def snapshot(self) -> tuple[LiveState, int]:
        """The served state and the log offset it has applied, read together."""
        with self._lock:
            return self._state, self._offset

    @property
    def count(self) -> int:
        """Items a search can return now."""
        return self._state.live_count

    @property
    def mu(self) -> np.ndarray | RowArrays:
        return self._rows(self.version.mu, lambda s: s.segment.mu)

    @property
    def logvar(self) -> np.ndarray | RowArrays:
        return self._rows(self.version.logvar, lambda s: s.segment.logvar)

    @property
    def novelty(self) -> np.ndarray | RowArrays | None:
        if self.version.novelty is None:
            return None
        return self._rows(self.version.novelty, lambda s: s.segment.novelty)

    def _rows(self, base: np.ndarray, part: Callable[[LiveState], np.ndarray]) -> Any:
        state = self._state
        if state.size == 0:
            return base
        return RowArrays(base, part(state)[: state.size])

    def refresh(self) -> None:
        """Apply what other processes logged since (a stat when nothing was)."""
        if self.log.size() == self._offset:
            return
        with self._lock:
            entries, end = self.log.read(self._offset)
            if entries:
                self._set_state(self._state.applied(entries, self.version.row_of))
            self._offset = end

    # ----- reads ------------------------------------------------------------------------

    def metadata(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        """Metadata of gallery rows (version or segment), in the order given."""
        state, wanted = self._state, [int(r) for r in rows]
        base = [r for r in wanted if r < state.base_count]
        found = dict(zip(base, self.version.metadata(base), strict=True))
        return [found[r] if r < state.base_count else state.record(r) for r in wanted]

    def record(self, item_id: str) -> dict[str, Any] | None:
        """Metadata of the live item with this id; None if there is none."""
        row = self._state.row_of(item_id, self.version.row_of)
        return None if row is None else self.metadata([row])[0]

    def matching_count(self, row_filter: RowFilter) -> int:
        """Live items the filter matches."""
        state = self._state
        selection = self._selection(state, row_filter)
        version_rows = state.base_count if selection is None else selection.count
        return version_rows + len(self._segment_rows(state, row_filter))

    def shortlist(
        self,
        metric: str,
        mu_q: np.ndarray,
        logvar_q: np.ndarray | None,
        size: int,
        row_filter: RowFilter | None = None,
    ) -> np.ndarray:
        """Candidate rows (Q, C) for the exact re-rank, as IndexVersion.shortlist, over the
        live items (those `row_filter` matches when given); -1 padded, repeats allowed."""
        state = self._state
        if self._offset == 0 and row_filter is None:  # the version as built
            return self.version.shortlist(metric, mu_q, logvar_q, size)
        if not self.version.supports(metric):
            return self.version.shortlist(metric, mu_q, logvar_q, size)  # raises, saying why
        self._check_live(what="a filter" if row_filter is not None else "live writes")
        families = candidate_families(metric)
        selection = self._selection(state, row_filter)
        parts = self._version_candidates(
            state, families, mu_q, logvar_q, size, selection, row_filter
        )
        parts += self._segment_candidates(state, families, mu_q, logvar_q, size, row_filter)
        return np.concatenate(parts, axis=1)

    def _version_candidates(
        self,
        state: LiveState,
        families: Sequence[str],
        mu_q: np.ndarray,
        logvar_q: np.ndarray | None,
        size: int,
        selection: RowSelection | None,
        row_filter: RowFilter | None,
    ) -> list[np.ndarray]:
        """The version's candidates among the selected rows: all of them when no more than
        the shortlist; through the index's selector when it is exact (flat) or most rows are
        selected (its search widened by the share left out); else by exact brute force, since
        an approximate index's probed lists hold too few of them."""
        if selection is None:  # every row of the version is live and allowed
            return [self.version.search_family(f, mu_q, logvar_q, size)[1] for f in families]
        if selection.count <= size:
            return [np.broadcast_to(selection.rows(), (len(mu_q), selection.count))]
        if self.manifest.index_type != "flat" and selection.count <= BRUTE_FORCE_ROWS:
            rows = selection.rows()

            def arrays() -> tuple[torch.Tensor, torch.Tensor]:
                mu = np.asarray(self.version.mu[rows], np.float32)
                return torch.from_numpy(mu), torch.from_numpy(
                    np.asarray(self.version.logvar[rows], np.float32)
                )

            found = self._per_state(state, ("version-arrays", _key(row_filter)), arrays)
            return _nearest(rows, found, families, mu_q, logvar_q, size)
        return [
            self.version.search_family(
                f, mu_q, logvar_q, size, allowed=selection,
                search_params=self._widened(f, selection),
            )[1]
            for f in families
        ]  # fmt: skip

    def _widened(self, family: str, selection: RowSelection) -> dict[str, Any] | None:
        """The family's search parameters with nprobe / efSearch grown by the share of rows
        the selection leaves out, twice over (capped), so that at least as many selected rows
        are reached as an unfiltered search reaches rows."""
        params = dict(self.manifest.search_params.get(family, {}))
        factor = 2 * len(selection.allowed) / max(selection.count, 1)  # 2: a margin
        if factor <= 1 or not params:
            return None
        if "nprobe" in params:
            nlist = int(self.manifest.index_params.get(family, {}).get("nlist", params["nprobe"]))
            params["nprobe"] = min(nlist, int(np.ceil(params["nprobe"] * factor)))
        if "efSearch" in params:
            params["efSearch"] = min(MAX_EF_SEARCH, int(np.ceil(params["efSearch"] * factor)))
        return params

    def _selection(self, state: LiveState, row_filter: RowFilter | None) -> RowSelection | None:
        """The version's rows a search may return in `state` (None: all of them); its FAISS
        selector is a bitmap over every row, so it is made once per state and filter."""
        if state.base_dead is None and row_filter is None:
            return None

        def make() -> RowSelection:
            allowed = np.ones(state.base_count, bool)
            if state.base_dead is not None:
                allowed &= ~state.base_dead
            if row_filter is not None:
                allowed &= self._version_matches(row_filter)
            return RowSelection(allowed)

        return self._per_state(state, ("selection", _key(row_filter)), make)

    def _per_state(self, state: LiveState, key: tuple, make: Callable[[], Any]) -> Any:
        """`make()`, remembered while `state` is served (the derived arrays of a state are
        the same for every query, and a large gallery's cost a pass over all its rows)."""
        with self._lock:
            found = self._state_cache.get(key)
            if found is not None and found[0] is state:
                return found[1]
        value = make()
        with self._lock:
            if state is self._state:
                self._state_cache[key] = (state, value)
                while len(self._state_cache) > 2 * _FILTER_CACHE:
                    self._state_cache.pop(next(iter(self._state_cache)))
        return value

    def _set_state(self, state: LiveState) -> None:
        """Serve `state` (under self._lock); what was derived from the previous one goes."""
        self._state = state
        self._state_cache = {}

    def _version_matches(self, row_filter: RowFilter) -> np.ndarray:
        key = row_filter.cache_key()
        with self._lock:
            found = self._filter_rows.get(key)
            if found is not None:
                self._filter_rows.move_to_end(key)
                return found
        with self.version.metadata_lock:
            found = row_filter.matching_rows(self.version.metadata_db, self.manifest.count)
        with self._lock:
            self._filter_rows[key] = found
            while len(self._filter_rows) > _FILTER_CACHE:
                self._filter_rows.popitem(last=False)
        return found

    def _segment_rows(self, state: LiveState, row_filter: RowFilter | None) -> np.ndarray:
        """The segment's live rows (those the filter matches), as gallery row numbers."""

        def make() -> np.ndarray:
            rows = state.alive_segment_rows()
            if row_filter is None:
                return rows
            return np.array([r for r in rows if row_filter.matches(state.record(r))], np.int64)

        return self._per_state(state, ("segment", _key(row_filter)), make)

    def _segment_candidates(
        self,
        state: LiveState,
        families: Sequence[str],
        mu_q: np.ndarray,
        logvar_q: np.ndarray | None,
        size: int,
        row_filter: RowFilter | None,
    ) -> list[np.ndarray]:
        """The segment's best `size` rows per family, by exact distance (all when few)."""
        rows = self._segment_rows(state, row_filter)
        if len(rows) <= size:
            return [np.broadcast_to(rows, (len(mu_q), len(rows)))] if len(rows) else []
        index = rows - state.base_count
        arrays = self._per_state(
            state, ("segment-arrays", _key(row_filter)),
            lambda: (torch.from_numpy(state.segment.mu[index]),
                     torch.from_numpy(state.segment.logvar[index])),
        )  # fmt: skip
        return _nearest(rows, arrays, families, mu_q, logvar_q, size)

    # ----- writes -----------------------------------------------------------------------

    def write(
        self, entries: Sequence[Entry], still_active: Callable[[], bool] | None = None
    ) -> WriteResult:
        """Log the entries durably, then serve them. Deletes of ids with no live item are
        not logged (returned as missing). `still_active` is asked under the log's lock: when
        it says no, nothing is logged and VersionMovedError tells the caller to write to the
        version that is active now (a compaction copies a log's tail only under that lock)."""
        self._check_live(what="live writes")
        for entry in entries:
            self._check_entry(entry)
        with self.log.locked() as locked:
            if still_active is not None and not still_active():
                raise VersionMovedError(f"index version {self.manifest.version} is not active")
            self.refresh()
            logged, missing = self._to_log(entries)
            offset = locked.append(logged) if logged else self._offset
            with self._lock:
                if logged:
                    self._set_state(self._state.applied(logged, self.version.row_of))
                self._offset = offset
        return WriteResult(len(logged), tuple(missing), offset)

    def _to_log(self, entries: Sequence[Entry]) -> tuple[list[Entry], list[str]]:
        """The entries worth logging: deletes only of ids live once the earlier ones apply."""
        state, logged, missing = self._state, [], []
        for entry in entries:
            if (
                isinstance(entry, Delete)
                and state.row_of(entry.item_id, self.version.row_of) is None
            ):
                missing.append(entry.item_id)
                continue
            logged.append(entry)
            state = state.applied([entry], self.version.row_of)
        return logged, missing

    def _check_live(self, what: str) -> None:
        if self.version.multivector is not None:
            raise LiveWriteError(
                f"index version {self.manifest.version} is a pvse (K-vector) version, which "
                f"does not take {what}: reindex the gallery instead"
            )
        if getattr(self.version.backend, "name", "faiss") != "faiss":
            raise LiveWriteError(
                f"index version {self.manifest.version} is served from "
                f"{self.version.backend.name}; {what} need the FAISS backend for now"
            )

    def _check_entry(self, entry: Entry) -> None:
        if not isinstance(entry.item_id, str) or not 0 < len(entry.item_id) <= MAX_ID_CHARS:
            raise LiveWriteError(f"an item id must be 1 to {MAX_ID_CHARS} characters")
        if isinstance(entry, Delete):
            return
        dim = self.manifest.dim
        for name, array in (("mu", entry.mu), ("logvar", entry.logvar)):
            if array.shape != (dim,) or not np.isfinite(array).all():
                raise LiveWriteError(
                    f"{name} of item {entry.item_id!r} must be {dim} finite numbers; got shape "
                    f"{array.shape}"
                )

    def close(self) -> None:
        self.version.close()


def _nearest(
    rows: np.ndarray,
    arrays: tuple[torch.Tensor, torch.Tensor],
    families: Sequence[str],
    mu_q: np.ndarray,
    logvar_q: np.ndarray | None,
    size: int,
) -> list[np.ndarray]:
    """Of `rows` (whose (mu, logvar) are `arrays`), each family's `size` nearest per query,
    by the exact distance: (Q, size) per family."""
    queries = torch.from_numpy(np.asarray(mu_q, np.float32))
    query_logvar = torch.from_numpy(
        np.asarray(logvar_q if logvar_q is not None else np.zeros_like(mu_q), np.float32)
    )
    parts = []
    for family in families:
        distances = pairwise_distance(family, queries, query_logvar, *arrays)  # (Q, M)
        best = torch.topk(distances, size, dim=1, largest=False).indices.numpy()
        parts.append(rows[best])
    return parts


def _key(row_filter: RowFilter | None) -> str | None:
    return None if row_filter is None else row_filter.cache_key()
