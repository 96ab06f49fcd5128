"""Compaction of a live gallery: the active version's live rows (its own, less those deleted or
replaced, then those added since) written as a new version, from the stored means and
log-variances, re-encoding nothing, and activated atomically (issue 43).

Writes keep arriving while the new version is built. The build reads the live state at one log
offset; then, under the publish lock and the old log's lock, the log's entries after that
offset are copied into the new version's log and the new version is activated, so a write is
either folded into the new version or copied into its log, never lost. Writers check, under
the same log lock, that their version is still active (LiveIndex.write), and move to the new
one when it is not.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from indexer.job_owner import mark_owner, release_owner
from indexer.live_index import LiveIndex
from indexer.live_log import LiveLog
from indexer.live_state import LiveState
from indexer.manifest import checksum_dir, write_manifest
from indexer.publish import new_version_name, publish_version
from indexer.registry import ActiveRegistry, RegistryError
from indexer.store import REPORT_NAME, open_version
from indexer.version_writer import write_arrays_and_metadata, write_novelty, write_version_indexes

log = logging.getLogger(__name__)
_BLOCK_ROWS = 65_536


@dataclass(frozen=True)
class CompactionResult:
    """The version compacted, the one written (None: nothing to compact), and its counts."""

    old_version: str
    new_version: str | None
    items: int
    folded_writes: int
    copied_writes: int


def compact(
    registry: ActiveRegistry, modality: str, memory_budget: int = 1 << 30
) -> CompactionResult:
    """Fold the active `modality` version's log into a new version and activate it."""
    old = registry.active_version(modality)
    if old is None:
        raise RegistryError(f"no active {modality} version to compact")
    live = LiveIndex(open_version(registry.version_path(modality, old), device="cpu"))
    try:
        state, offset = live.snapshot()
        if not state.changed:
            return CompactionResult(old, None, live.count, 0, 0)
        new = new_version_name(f"compact-{old}")
        path = _build(registry, modality, live, state, new, memory_budget)
        with registry.publish_lock(modality), live.log.locked() as locked:
            if registry.active_version(modality) != old:
                shutil.rmtree(path, ignore_errors=True)
                raise RegistryError(
                    f"the active {modality} version changed from {old} during the compaction; "
                    "nothing was activated (run it again)"
                )
            copied = locked.copy_after(offset, LiveLog(path))
            registry.activate(modality, new)
        log.info("compacted %s %s into %s (%d writes copied)", modality, old, new, copied)
        return CompactionResult(old, new, state.live_count, state.puts + state.deletes, copied)
    finally:
        live.close()


def _build(
    registry: ActiveRegistry,
    modality: str,
    live: LiveIndex,
    state: LiveState,
    new: str,
    memory_budget: int,
) -> Path:
    """Write, verify and publish (not activate) the new version; its final path."""
    manifest = live.manifest
    tmp_dir = registry.modality_dir(modality) / f".tmp-{new}"
    try:
        tmp_dir.mkdir(parents=True)
        mark_owner(tmp_dir)
        count = state.live_count
        write_arrays_and_metadata(tmp_dir, _parts(live, state), count, manifest.dim, manifest.dtype)
        if live.version.novelty is not None:
            write_novelty(tmp_dir, [_novelty(live, state)])
        source_report = live.path / REPORT_NAME
        if source_report.is_file():
            shutil.copyfile(source_report, tmp_dir / REPORT_NAME)
        indexes = write_version_indexes(
            tmp_dir, manifest.metrics, manifest.index_type, memory_budget
        )
        written = replace(
            manifest, version=new, count=count, families=indexes.families,
            index_type=indexes.index_type, index_params=indexes.index_params,
            search_params=indexes.search_params, calibration_inherited_from=manifest.version,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )  # fmt: skip
        write_manifest(tmp_dir, written.with_files(checksum_dir(tmp_dir)))
        return publish_version(tmp_dir, registry, modality, new, activate=False)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        release_owner(tmp_dir)


def _parts(
    live: LiveIndex, state: LiveState
) -> Iterator[tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]]:
    """(mu, logvar, records) of the live rows: the version's in blocks, then the segment's."""
    rows = state.live_version_rows()
    for start in range(0, len(rows), _BLOCK_ROWS):
        block = rows[start : start + _BLOCK_ROWS]
        records = live.version.metadata(block.tolist())
        yield live.version.mu[block], live.version.logvar[block], records
    segment = state.alive_segment_rows() - state.base_count
    if len(segment):
        records = [state.segment.records[i] for i in segment]
        yield state.segment.mu[segment], state.segment.logvar[segment], records


def _novelty(live: LiveIndex, state: LiveState) -> np.ndarray:
    assert live.version.novelty is not None
    segment = state.alive_segment_rows() - state.base_count
    return np.concatenate(
        [
            np.asarray(live.version.novelty[state.live_version_rows()]),
            state.segment.novelty[segment],
        ]
    )
