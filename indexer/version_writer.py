"""Index version dirs written: arrays and metadata, the indexes of each family (built and tuned
by indexer.build and indexer.tuning), and the calibration a version's manifest records.

The file names and the read side (IndexVersion, MetadataReader) are indexer.store's.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from indexer.build import IndexPlan, build_family_index, duplicate_representatives, plan_index
from indexer.manifest import Calibration, Manifest, ManifestError, read_manifest, write_manifest
from indexer.read_index import DuplicateGroups, FamilyIndex, index_file_name
from indexer.store import DUPLICATES_NAME, LOGVAR_NAME, METADATA_NAME, MU_NAME, NOVELTY_NAME
from indexer.tuning import tune_search_params
from models.distance.augmented import INDEX_FAMILIES, candidate_families
from models.distance.gaussian import METRICS

log = logging.getLogger(__name__)


def families_for(metrics: Iterable[str]) -> tuple[str, ...]:
    """The index families needed to shortlist every metric of `metrics` (sorted, unique)."""
    return tuple(sorted({f for metric in metrics for f in candidate_families(metric)}))


def served_metrics(families: Iterable[str]) -> tuple[str, ...]:
    """Metrics with an exact index form (INDEX_FAMILIES) whose families are all in `families`."""
    built = set(families)
    return tuple(m for m in INDEX_FAMILIES if set(candidate_families(m)) <= built)


class MetadataWriter:
    """Appends rows (row -> id, text or uri, extra JSON) to a new metadata.sqlite."""

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path)
        self._db.execute(
            "CREATE TABLE items (row INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE,"
            " text TEXT, uri TEXT, extra TEXT NOT NULL)"
        )
        self.count = 0

    def add(self, records: Sequence[dict[str, Any]]) -> None:
        """Append records {"id", "text"?, "uri"?, "extra"?} as the next rows."""
        rows = [
            (
                self.count + i,
                r["id"],
                r.get("text"),
                r.get("uri"),
                json.dumps(_finite(r.get("extra") or {}), sort_keys=True, allow_nan=False),
            )
            for i, r in enumerate(records)
        ]
        self._db.executemany("INSERT INTO items VALUES (?, ?, ?, ?, ?)", rows)
        self.count += len(rows)

    def close(self) -> None:
        """Commit and close."""
        self._db.commit()
        self._db.close()


def _finite(value: Any) -> Any:
    """`value` with NaN and infinities as null: Python's JSON writes them, but they are no
    JSON, and SQLite's JSON functions (which filters run on) refuse the whole row."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


@dataclass(frozen=True)
class WrittenIndexes:
    """What a version's manifest records of the indexes write_version_indexes built."""

    families: tuple[str, ...]
    index_type: str
    index_params: dict[str, dict[str, Any]]
    search_params: dict[str, dict[str, Any]]


def write_version_indexes(
    version_dir: Path, metrics: Iterable[str], index_type: str, memory_budget: int, seed: int = 0
) -> WrittenIndexes:
    """Plan (indexer.build.plan_index) and write the indexes of every family `metrics` need,
    over the mu.npy / logvar.npy already written into `version_dir`."""
    mu = np.load(version_dir / MU_NAME, mmap_mode="r")  # (N, D)
    logvar = np.load(version_dir / LOGVAR_NAME, mmap_mode="r")
    families = families_for(metrics)
    plan = plan_index(index_type, mu.shape[0], mu.shape[1], families, memory_budget)
    index_params, search_params = write_indexes(version_dir, mu, logvar, plan, seed=seed)
    return WrittenIndexes(families, plan.index_type, index_params, search_params)


def write_indexes(
    version_dir: Path, mu: np.ndarray, logvar: np.ndarray, plan: IndexPlan, *, seed: int = 0
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Build, tune and write `<family>.faiss` for each family of the plan.

    Rows with identical embeddings are indexed once; their groups go to duplicates.npy.
    Returns (index_params, search_params) keyed by family, as stored in the manifest.
    """
    representatives = duplicate_representatives(mu, logvar)
    duplicates = None
    if representatives is not None:
        np.save(version_dir / DUPLICATES_NAME, representatives)
        duplicates = DuplicateGroups(representatives)
    index_params: dict[str, dict[str, Any]] = {}
    search_params: dict[str, dict[str, Any]] = {}
    for family in plan.params:
        index, params = build_family_index(
            family, mu, logvar, plan, duplicates=duplicates, seed=seed
        )
        family_index = FamilyIndex(family, index, params, {}, duplicates)
        search, recall = tune_search_params(family_index, mu, logvar, plan, seed=seed)
        params["tuned_recall_at_10"] = round(recall, 4)
        faiss.write_index(index, str(version_dir / index_file_name(family)))
        index_params[family], search_params[family] = params, search
        log.info("built %s %s index: %s, search %s", family, plan.index_type, params, search)
    return index_params, search_params


def update_calibration(path: Path, calibration: dict[str, Calibration]) -> Manifest:
    """Replace the calibration (T, tau) of some metrics in a version's manifest, atomically."""
    manifest = read_manifest(path)
    unknown = sorted(set(calibration) - set(METRICS))
    if unknown:
        raise ManifestError(f"unknown metrics in calibration: {unknown}")
    manifest = replace(manifest, calibration={**manifest.calibration, **calibration})
    write_manifest(path, manifest)
    return manifest


def write_arrays_and_metadata(
    version_dir: Path,
    parts: Iterable[tuple[np.ndarray, np.ndarray, Sequence[dict[str, Any]]]],
    count: int,
    dim: int,
    dtype: str = "float32",
) -> None:
    """Stream (mu, logvar, records) parts into mu.npy, logvar.npy and metadata.sqlite."""
    if dtype not in ("float32", "float16"):
        raise ValueError(f"unknown dtype {dtype!r}; choose float32 or float16")
    mu = np.lib.format.open_memmap(version_dir / MU_NAME, "w+", dtype, (count, dim))
    logvar = np.lib.format.open_memmap(version_dir / LOGVAR_NAME, "w+", dtype, (count, dim))
    writer = MetadataWriter(version_dir / METADATA_NAME)
    start = 0
    for part_mu, part_logvar, records in parts:
        stop = start + len(records)
        mu[start:stop] = part_mu  # (n, D)
        logvar[start:stop] = part_logvar
        writer.add(records)
        start = stop
    writer.close()
    if start != count:
        raise ValueError(f"expected {count} rows, the parts held {start}")
    mu.flush()
    logvar.flush()
    del mu, logvar


def write_novelty(version_dir: Path, parts: Iterable[np.ndarray | None]) -> np.ndarray | None:
    """Save each picture's novelty (the chunks' (n,) parts in row order) as novelty.npy, so
    that searches and reindex can tell which pictures the familiarity gate would refuse;
    nothing when the encoder gives none (a text gallery, an encoder trained from scratch)."""
    chunks = list(parts)
    if not chunks or any(c is None for c in chunks):
        return None
    novelty = np.concatenate(chunks).astype(np.float32)
    np.save(version_dir / NOVELTY_NAME, novelty)
    return novelty
