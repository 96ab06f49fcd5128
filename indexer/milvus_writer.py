"""Writing a version's Milvus collections (`probsearch reindex` with the milvus shortlist
backend): each family's augmented vectors under the gallery row, with the row's metadata as
scalar fields, indexed like the version's FAISS files. Searching them is indexer.milvus_store's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexer.build import family_vectors, row_batches
from indexer.manifest import Manifest, read_manifest
from indexer.milvus_schema import create_collection, entities
from indexer.milvus_store import (
    MilvusBackend,
    MilvusCollectionError,
    MilvusConnection,
    collection_name,
    row_count,
)
from indexer.read_index import DuplicateGroups
from indexer.store import DUPLICATES_NAME, LOGVAR_NAME, METADATA_NAME, MU_NAME, MetadataReader
from models.distance.augmented import augmented_dim, index_form

log = logging.getLogger(__name__)

MetadataLookup = Callable[[Sequence[int]], list[dict[str, Any]]]
INSERT_BYTES = 16 << 20  # rows per insert call: ~16 MB of vectors, under gRPC's 64 MB limit


def milvus_index(
    index_type: str, params: dict[str, Any], family: str
) -> tuple[str, str, dict[str, Any]]:
    """(Milvus index type, metric type, build params) for a manifest's index type and params.

    flat -> FLAT (exact); ivf -> IVF_FLAT; hnsw -> HNSW (Milvus searches inner product in
    HNSW natively, no MIPS transform); ivfpq -> IVF_PQ; ivfsq -> IVF_SQ8.
    """
    metric = "L2" if index_form(family).faiss_metric == "l2" else "IP"
    if index_type == "flat":
        return "FLAT", metric, {}
    if index_type == "ivf":
        return "IVF_FLAT", metric, {"nlist": int(params["nlist"])}
    if index_type == "ivfsq":
        return "IVF_SQ8", metric, {"nlist": int(params["nlist"])}
    if index_type == "hnsw":
        build = {"M": int(params["hnsw_m"]), "efConstruction": int(params["ef_construction"])}
        return "HNSW", metric, build
    if index_type == "ivfpq":
        dim = int(params["dim"])  # Milvus needs m | dim; FAISS pads instead
        m = max(d for d in range(1, int(params["pq_m"]) + 1) if dim % d == 0)
        return "IVF_PQ", metric, {"nlist": int(params["nlist"]), "m": m, "nbits": 8}
    raise MilvusCollectionError(f"index type {index_type!r} has no Milvus counterpart")


def write_version(
    backend: MilvusBackend,
    manifest: Manifest,
    mu: np.ndarray,
    logvar: np.ndarray,
    metadata: MetadataLookup,
    duplicates: DuplicateGroups | None = None,
) -> list[str]:
    """Write each family's augmented vectors of a version, with each row's metadata
    (`metadata(rows)` -> records) as scalar fields, into a new collection; build its index
    (the manifest's type) and check the counts; returns the collection names."""
    rows = duplicates.unique_rows if duplicates is not None else np.arange(len(mu))
    written: list[str] = []
    try:
        for family in manifest.families:
            name = collection_name(manifest.modality, manifest.version, family)
            written.append(name)
            _write_family(backend.connection, name, family, manifest, (mu, logvar), metadata, rows)
    except BaseException:
        backend.drop(written)
        raise
    return written


def _write_family(
    connection: MilvusConnection,
    name: str,
    family: str,
    manifest: Manifest,
    arrays: tuple[np.ndarray, np.ndarray],
    metadata: MetadataLookup,
    rows: np.ndarray,
) -> None:
    dim = augmented_dim(family, manifest.dim)
    params = {**manifest.index_params.get(family, {}), "dim": dim}
    index_type, metric, build = milvus_index(manifest.index_type, params, family)
    connection.call(lambda c: create_collection(c, name, dim, index_type, metric, build))
    per_insert = max(1, INSERT_BYTES // (4 * dim))
    for batch in row_batches(len(rows), per_insert):
        batch_rows = rows[batch]
        vectors = family_vectors(family, *arrays, batch_rows)  # (n, D')
        data = entities(batch_rows, vectors, metadata(batch_rows.tolist()))
        connection.call(lambda c, d=data: c.insert(name, d))
    connection.call(lambda c: c.flush(name))
    stored = connection.call(lambda c: row_count(c, name))
    if stored != len(rows):
        raise MilvusCollectionError(f"{name} holds {stored} vectors, expected {len(rows)}")
    log.info("wrote Milvus collection %s: %d vectors, %s %s", name, stored, index_type, metric)


def write_version_dir(backend: MilvusBackend, version_dir: Path) -> list[str]:
    """Write the collections of a complete version dir (reindex, before it is published)."""
    manifest = read_manifest(version_dir)
    mu = np.load(version_dir / MU_NAME, mmap_mode="r")  # (N, D)
    logvar = np.load(version_dir / LOGVAR_NAME, mmap_mode="r")
    duplicates = None
    if (version_dir / DUPLICATES_NAME).is_file():
        duplicates = DuplicateGroups(np.load(version_dir / DUPLICATES_NAME))
    metadata = MetadataReader(version_dir / METADATA_NAME)
    try:
        return write_version(backend, manifest, mu, logvar, metadata.lookup, duplicates)
    finally:
        metadata.close()
