"""The shortlist backends (indexer.shortlist's interface): a version's FAISS files, or Milvus,
as a setting names them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from indexer.milvus_store import MilvusBackend
from indexer.shortlist import FamilySearcher, ShortlistBackend

if TYPE_CHECKING:  # faiss stays unimported until a FAISS backend opens a version
    from indexer.manifest import Manifest
    from indexer.read_index import DuplicateGroups

SHORTLIST_BACKENDS = ("faiss", "milvus")


class FaissBackend:
    """Today's local indexes: `<family>.faiss` in the version dir, on CPU or GPU."""

    name = "faiss"

    def __init__(self, device: str = "auto") -> None:
        self.device = device

    def open_families(
        self, path: Path, manifest: Manifest, duplicates: DuplicateGroups | None
    ) -> dict[str, FamilySearcher]:
        # not at the top: read_index loads faiss (an extra), needed once a version is opened
        from indexer.read_index import index_file_name, place_family, read_family_index

        return {
            family: place_family(
                family,
                read_family_index(path / index_file_name(family)),
                self.device,
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
        if not milvus_uri:
            raise ValueError(
                "shortlist backend milvus needs PROBSEARCH_MILVUS_URI: a Milvus Lite file "
                "(e.g. /var/lib/probsearch/milvus.db) or a server URI (http://host:19530)"
            )
        return MilvusBackend(milvus_uri)
    raise ValueError(
        f"unknown shortlist backend {name!r}; choose {' or '.join(SHORTLIST_BACKENDS)}"
    )
