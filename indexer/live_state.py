"""What a live gallery holds at one point of its log: the immutable version's rows less those
deleted or replaced, plus a segment of rows added since (issue 43).

Rows are numbered as one gallery: the version's rows 0..N-1, then the segment's N, N+1, ...
in the order they were added. A row number never changes meaning: a put of an id that exists
kills its old row and adds a new one, a delete kills a row, and nothing is ever reused. So a
request that read rows from one state can look them up in any later state, and states can be
replaced while requests run. Each write makes a new LiveState; the segment's arrays are
shared between states (a state only reads its first `size` rows, which later writes never
touch), and the masks are copied on write.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from indexer.live_log import Delete, Entry, Put

_MIN_CAPACITY = 64


class RowArrays:
    """A gallery-wide (N + M, ...) array read by row numbers: the version's (memory-mapped)
    rows, then the segment's. What the exact re-rank gathers its candidates from."""

    def __init__(self, base: np.ndarray, segment: np.ndarray) -> None:
        self.base = base
        self.segment = segment
        self.shape = (len(base) + len(segment), *base.shape[1:])
        self.dtype = np.dtype(np.float32)
        self.range_source = base  # models.scoring.gallery_range summarises the version's rows

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: Any) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        if rows.ndim == 0:
            row = int(rows)
            base_count = len(self.base)
            return np.asarray(
                self.base[row] if row < base_count else self.segment[row - base_count]
            )
        out = np.empty((*rows.shape, *self.shape[1:]), dtype=np.float32)
        in_base = rows < len(self.base)
        out[in_base] = self.base[rows[in_base]]
        out[~in_base] = self.segment[rows[~in_base] - len(self.base)]
        return out


@dataclass(frozen=True)
class Segment:
    """Append-only storage of the added rows, shared by successive states."""

    mu: np.ndarray  # (capacity, D) float32
    logvar: np.ndarray  # (capacity, D) float32
    novelty: np.ndarray  # (capacity,) float64; NaN where none was given
    records: list[dict[str, Any]]  # appended only; a state reads its first `size`

    @classmethod
    def empty(cls, dim: int, capacity: int = _MIN_CAPACITY) -> Segment:
        return cls(
            np.zeros((capacity, dim), np.float32), np.zeros((capacity, dim), np.float32),
            np.full(capacity, np.nan), [],
        )  # fmt: skip

    def with_room(self, size: int) -> Segment:
        """This segment, or a copy with twice the capacity when row `size` does not fit."""
        if size < len(self.mu):
            return self
        capacity = 2 * len(self.mu)
        grown = Segment.empty(self.mu.shape[1], capacity)
        grown.mu[:size], grown.logvar[:size] = self.mu[:size], self.logvar[:size]
        grown.novelty[:size] = self.novelty[:size]
        grown.records.extend(self.records[:size])
        return grown


@dataclass(frozen=True)
class LiveState:
    """The live rows at one log offset; see the module docstring."""

    base_count: int
    base_dead: np.ndarray | None  # (N,) bool; None: no version row deleted or replaced
    segment: Segment
    size: int  # segment rows used
    segment_alive: np.ndarray  # (capacity,) bool, valid below `size`
    segment_ids: dict[str, int]  # id -> segment index of its live row
    puts: int = 0
    deletes: int = 0

    @classmethod
    def empty(cls, base_count: int, dim: int) -> LiveState:
        segment = Segment.empty(dim)
        return cls(base_count, None, segment, 0, np.zeros(len(segment.mu), bool), {})

    @property
    def changed(self) -> bool:
        """Whether any write has been applied (else the version serves as it was built)."""
        return self.size > 0 or self.base_dead is not None

    @property
    def live_count(self) -> int:
        """Items a search can return now."""
        dead = 0 if self.base_dead is None else int(self.base_dead.sum())
        return self.base_count - dead + len(self.segment_ids)

    def row_of(self, item_id: str, base_row: Callable[[str], int | None]) -> int | None:
        """The live row of `item_id` (a gallery row number), or None when it has none.

        `base_row` finds an id among the version's rows (MetadataReader.row_of)."""
        if item_id in self.segment_ids:
            return self.base_count + self.segment_ids[item_id]
        row = base_row(item_id)
        if row is None or (self.base_dead is not None and self.base_dead[row]):
            return None
        return row

    def applied(self, entries: Sequence[Entry], base_row: Callable[[str], int | None]) -> LiveState:
        """The state after `entries`, in order. A delete of an id with no live row changes
        nothing (the writer answered it 404 before logging it, or a replay repeats it)."""
        state = self
        for entry in entries:
            killed = state._killed(state.row_of(entry.item_id, base_row))
            state = killed._added(entry) if isinstance(entry, Put) else killed
            if isinstance(entry, Delete):
                state = replace(state, deletes=state.deletes + 1)
        return state

    def live_version_rows(self) -> np.ndarray:
        """The version's rows still live, ascending."""
        if self.base_dead is None:
            return np.arange(self.base_count)
        return np.flatnonzero(~self.base_dead)

    def live_rows(self) -> np.ndarray:
        """Every live row (the version's, then the segment's), as gallery row numbers."""
        return np.concatenate([self.live_version_rows(), self.alive_segment_rows()])

    def alive_segment_rows(self) -> np.ndarray:
        """The live rows of the segment, as gallery row numbers, ascending."""
        return self.base_count + np.flatnonzero(self.segment_alive[: self.size])

    def record(self, row: int) -> dict[str, Any]:
        """The metadata of a segment row (row >= base_count)."""
        return self.segment.records[row - self.base_count]

    def _killed(self, row: int | None) -> LiveState:
        if row is None:
            return self
        if row < self.base_count:
            dead = np.zeros(self.base_count, bool) if self.base_dead is None else self.base_dead
            dead = dead.copy()
            dead[row] = True
            return replace(self, base_dead=dead)
        index = row - self.base_count
        alive = self.segment_alive.copy()
        alive[index] = False
        ids = dict(self.segment_ids)
        record_id = self.segment.records[index]["id"]
        if ids.get(record_id) == index:
            del ids[record_id]
        return replace(self, segment_alive=alive, segment_ids=ids)

    def _added(self, put: Put) -> LiveState:
        segment = self.segment.with_room(self.size)
        index = self.size
        segment.mu[index] = put.mu
        segment.logvar[index] = put.logvar
        segment.novelty[index] = np.nan if put.novelty is None else put.novelty
        del segment.records[index:]  # rows a discarded later state wrote; never read since
        segment.records.append({"id": put.item_id, **put.record})
        alive = np.zeros(len(segment.mu), bool)
        alive[:index] = self.segment_alive[:index]
        alive[index] = True
        ids = {**self.segment_ids, put.item_id: index}
        return replace(
            self, segment=segment, size=index + 1, segment_alive=alive, segment_ids=ids,
            puts=self.puts + 1,
        )  # fmt: skip
