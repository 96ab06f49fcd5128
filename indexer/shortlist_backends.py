"""The shortlist interface: per-family searchers over augmented vectors, from FAISS or Milvus.

A backend opens, for one index version, one searcher per metric family. A searcher answers
`search(mu_q, logvar_q, k) -> (distances (Q, k) float32, rows (Q, k) int64)` in Gaussian
terms (per-query constants added back, -1 / +inf padding), so IndexVersion.shortlist, the
exact re-rank and everything after it do not depend on where the vectors live.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:  # faiss stays unimported until a FAISS backend opens a version
    from indexer.manifest import Manifest
    from indexer.read_index import DuplicateGroups

SHORTLIST_BACKENDS = ("faiss", "milvus")


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


class FaissBackend:
    """Today's local indexes: `<family>.faiss` in the version dir, on CPU or GPU."""

    name = "faiss"

    def __init__(self, device: str = "auto") -> None:
        self.device = device

    def open_families(
        self, path: Path, manifest: Manifest, duplicates: DuplicateGroups | None
    ) -> dict[str, FamilySearcher]:
        # not at the top: read_index loads faiss (an extra), needed once a version is opened
        from indexer.read_index import FamilyIndex, index_file_name, load_index

        return {
            family: FamilyIndex(
                family,
                load_index(path / index_file_name(family), self.device),
                manifest.index_params.get(family, {}),
                manifest.search_params.get(family, {}),
                duplicates,
            )
            for family in manifest.families
        }

    def health(self, manifest: Manifest) -> str | None:
        del manifest  # files in memory: always answers
        return None


def make_backend(name: str, milvus_uri: str | None, device: str = "auto") -> ShortlistBackend:
    """The backend a setting names: "faiss" (local files) or "milvus" (at `milvus_uri`).

    Raises ValueError with the fix for an unknown name, a missing URI or a missing pymilvus.
    """
    if name == "faiss":
        return FaissBackend(device)
    if name == "milvus":
        from indexer.milvus_store import MilvusBackend

        if not milvus_uri:
            raise ValueError(
                "shortlist backend milvus needs PROBSEARCH_MILVUS_URI: a Milvus Lite file "
                "(e.g. /var/lib/probsearch/milvus.db) or a server URI (http://host:19530)"
            )
        return MilvusBackend(milvus_uri)
    raise ValueError(
        f"unknown shortlist backend {name!r}; choose {' or '.join(SHORTLIST_BACKENDS)}"
    )
