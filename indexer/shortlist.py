"""The shortlist interface: per-family searchers over augmented vectors, from FAISS or Milvus.

A backend opens, for one index version, one searcher per metric family. A searcher answers
`search(mu_q, logvar_q, k) -> (distances (Q, k) float32, rows (Q, k) int64)` in Gaussian
terms (per-query constants added back, -1 / +inf padding), so IndexVersion.shortlist, the
exact re-rank and everything after it do not depend on where the vectors live. The backends
are indexer.shortlist_backends' (FAISS) and indexer.milvus_store's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from indexer.manifest import Manifest
    from indexer.read_index import DuplicateGroups


class ShortlistUnavailableError(ConnectionError):
    """The shortlist backend (a Milvus server) cannot be reached right now; retry later."""


class FamilySearcher(Protocol):
    """One metric family's shortlist of one index version."""

    family: str

    @property
    def count(self) -> int:
        """Vectors indexed (duplicate embeddings count once)."""
        ...

    def search(
        self, mu_q: np.ndarray, logvar_q: np.ndarray | None, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Distances (Q, k) float32 of the family's metric and rows (Q, k) int64, -1 padded."""
        ...


class ShortlistBackend(Protocol):
    """Where a version's augmented vectors are searched."""

    name: str

    def open_families(
        self, path: Path, manifest: Manifest, duplicates: DuplicateGroups | None
    ) -> dict[str, FamilySearcher]:
        """One searcher per family of the version at `path` (manifest.families)."""
        ...

    def health(self, manifest: Manifest) -> str | None:
        """None when the version's shortlist can answer now, else why not."""
        ...
