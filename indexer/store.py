"""Index version dirs opened for searching (the service's read API): the files a version holds,
its arrays, shortlist, metadata and pvse vectors. Writing them is indexer.version_writer's."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexer.manifest import Manifest, ManifestError, read_manifest, verify_checksums
from indexer.multivector import EMBEDDINGS_FILE, open_multivector
from indexer.read_index import DuplicateGroups, RowSelection
from indexer.shortlist import ShortlistBackend
from indexer.shortlist_backends import FaissBackend
from models.distance.augmented import candidate_families
from models.distance.gaussian import METRICS

MU_NAME = "mu.npy"
LOGVAR_NAME = "logvar.npy"
METADATA_NAME = "metadata.sqlite"
REPORT_NAME = "report.json"
DUPLICATES_NAME = "duplicates.npy"  # (N,) first row with the same embedding; absent if none
NOVELTY_NAME = "novelty.npy"  # (N,) each picture's novelty (pretrained image encoders only)


class UnsupportedMetricError(ValueError):
    """The version has no index family that can shortlist this metric."""


class IndexVersion:
    """An opened version dir: manifest, memory-mapped arrays, FAISS indexes, metadata."""

    def __init__(
        self, path: Path, device: str = "auto", backend: ShortlistBackend | None = None
    ) -> None:
        self.path = Path(path)
        self.manifest: Manifest = read_manifest(self.path)
        self.mu: np.ndarray = np.load(self.path / MU_NAME, mmap_mode="r")  # (N, D)
        self.logvar: np.ndarray = np.load(self.path / LOGVAR_NAME, mmap_mode="r")  # (N, D)
        self._duplicates = None
        if (self.path / DUPLICATES_NAME).is_file():
            self._duplicates = DuplicateGroups(np.load(self.path / DUPLICATES_NAME))
        # the shortlist of each family: local FAISS files, or Milvus (indexer.shortlist_backends)
        self.backend: ShortlistBackend = backend or FaissBackend(device)
        self._indexes = self.backend.open_families(self.path, self.manifest, self._duplicates)
        self._metadata = MetadataReader(self.path / METADATA_NAME)
        # pvse versions: K vectors per row for the exact best-pair search (indexer.multivector)
        self.multivector = open_multivector(self.path)
        novelty = self.path / NOVELTY_NAME
        self.novelty = np.load(novelty, mmap_mode="r") if novelty.is_file() else None  # (N,)
        self._check_counts()

    def _check_counts(self) -> None:
        count, dim = self.manifest.count, self.manifest.dim
        problems = [
            f"{name} has shape {array.shape}"
            for name, array in ((MU_NAME, self.mu), (LOGVAR_NAME, self.logvar))
            if array.shape != (count, dim)
        ]
        if self._duplicates is not None and len(self._duplicates.representatives) != count:
            problems.append(f"{DUPLICATES_NAME} has {len(self._duplicates.representatives)} rows")
        indexed = count if self._duplicates is None else len(self._duplicates.unique_rows)
        problems += [
            f"the {f} shortlist has {i.count} vectors, expected {indexed}"
            for f, i in self._indexes.items()
            if i.count != indexed
        ]
        if self._metadata.count != count:
            problems.append(f"{METADATA_NAME} has {self._metadata.count} rows")
        if self.multivector is not None and self.multivector.count != count:
            problems.append(f"{EMBEDDINGS_FILE} has {self.multivector.count} rows")
        if problems:
            raise ManifestError(
                f"{self.path}: manifest says {count} items of dim {dim}, but " + "; ".join(problems)
            )

    def supports(self, metric: str) -> bool:
        """Whether this version can shortlist `metric` (all its candidate families are built)."""
        if metric not in METRICS:
            return False
        return set(candidate_families(metric)) <= set(self._indexes)

    def shortlist(
        self, metric: str, mu_q: np.ndarray, logvar_q: np.ndarray | None, size: int
    ) -> np.ndarray:
        """Candidate rows for `metric`, (Q, C) int64, for the exact re-rank to rank
        (models.scoring.rerank): the `size` rows of its index family, or for a metric of
        several families (min_kl: kl and kl_reverse) each family's `size` rows side by side
        (C = families x size; repeats are the re-rank's to drop). Missing results are -1.
        """
        if not self.supports(metric):
            raise UnsupportedMetricError(
                f"index version {self.manifest.version} cannot shortlist {metric!r}; it serves "
                f"{', '.join(self.manifest.metrics)} (rebuild with --metrics {metric})"
            )
        families = candidate_families(metric)
        return np.concatenate(
            [self.search_family(f, mu_q, logvar_q, size)[1] for f in families], axis=1
        )

    def search_family(
        self,
        family: str,
        mu_q: np.ndarray,
        logvar_q: np.ndarray | None,
        size: int,
        allowed: RowSelection | None = None,
        search_params: dict[str, Any] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """One index family's answer: its distances (Q, size) float32 (exact for flat,
        approximate for compressed indexes; +inf past the last result) and rows (Q, size),
        among the `allowed` rows only when given (FAISS versions), with `search_params`
        instead of the family's tuned ones when given."""
        if family not in self._indexes:
            raise UnsupportedMetricError(
                f"index version {self.manifest.version} has no {family!r} index"
            )
        if size < 1:
            raise ValueError(f"shortlist size must be >= 1; got {size}")
        mu_q = np.ascontiguousarray(mu_q, dtype=np.float32)  # (Q, D)
        if allowed is None and search_params is None:
            return self._indexes[family].search(mu_q, logvar_q, size)
        return self._indexes[family].search(
            mu_q, logvar_q, size, search_params=search_params, allowed=allowed
        )

    def metadata(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        """Metadata {"id", "text" or "uri", "extra"} of each row, in the order given."""
        return self._metadata.lookup(rows)

    def record(self, item_id: str) -> dict[str, Any] | None:
        """Metadata of the item with this id (ids are unique in a version); None if unknown."""
        return self._metadata.find(item_id)

    def row_of(self, item_id: str) -> int | None:
        """The row of the item with this id; None if unknown."""
        return self._metadata.row_of(item_id)

    @property
    def metadata_db(self) -> sqlite3.Connection:
        """The read-only metadata connection (for filters computed in SQL); use under
        `metadata_lock`."""
        return self._metadata.db

    @property
    def metadata_lock(self) -> threading.Lock:
        return self._metadata.lock

    def close(self) -> None:
        """Release the FAISS indexes, the memory maps and the metadata connection."""
        self._indexes = {}
        self._metadata.close()
        del self.mu, self.logvar


def open_version(
    path: Path,
    device: str = "auto",
    verify: bool = False,
    backend: ShortlistBackend | None = None,
) -> IndexVersion:
    """Open a version dir for searching; `verify` also checks every file's sha256 (slow).

    `backend` serves the shortlist (default: the version's FAISS files on `device`).
    """
    path = Path(path)
    if verify:
        verify_checksums(path, read_manifest(path))
    return IndexVersion(path, device, backend)


class MetadataReader:
    """Thread-safe read-only lookups in metadata.sqlite (immutable once published)."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise ManifestError(f"metadata file {path} is missing")
        uri = path.resolve().as_uri() + "?mode=ro&immutable=1"
        self.db = sqlite3.connect(uri, uri=True, check_same_thread=False)
        self.lock = threading.Lock()
        self.count = self.db.execute("SELECT COUNT(*) FROM items").fetchone()[0]

    def lookup(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        wanted = [int(r) for r in rows]
        bad = [r for r in wanted if not 0 <= r < self.count]
        if bad:
            raise ValueError(f"rows {bad[:5]} out of range 0..{self.count - 1}")
        found: dict[int, dict[str, Any]] = {}
        with self.lock:
            for start in range(0, len(wanted), 500):
                chunk = sorted(set(wanted[start : start + 500]))
                marks = ",".join("?" * len(chunk))
                query = f"SELECT row, id, text, uri, extra FROM items WHERE row IN ({marks})"
                for row, item_id, text, uri, extra in self.db.execute(query, chunk):
                    record: dict[str, Any] = {"id": item_id, "extra": json.loads(extra)}
                    if text is not None:
                        record["text"] = text
                    if uri is not None:
                        record["uri"] = uri
                    found[row] = record
        return [found[r] for r in wanted]

    def find(self, item_id: str) -> dict[str, Any] | None:
        row = self.row_of(item_id)
        return None if row is None else self.lookup([row])[0]

    def row_of(self, item_id: str) -> int | None:
        """The row of the item with this id (ids are unique), or None."""
        with self.lock:
            found = self.db.execute("SELECT row FROM items WHERE id = ?", (item_id,)).fetchone()
        return None if found is None else int(found[0])

    def close(self) -> None:
        with self.lock:
            self.db.close()
