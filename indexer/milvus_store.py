"""The Milvus shortlist backend: one collection per index version and metric family.

Each collection holds a family's augmented gallery vectors (models.distance.augmented) under the
gallery row as primary key, with the row's metadata as scalar fields (indexer.milvus_schema),
so Milvus's L2 / inner-product search is the exact Gaussian metric once the per-query
constant is added back. An alias per modality and family names
the active version's collection; the service searches the collection of the version it
serves (its rows must match that version's mu/logvar), never the alias, so a swap can never
pair one version's rows with another's arrays. mu/logvar stay in the version dir.

The URI is a Milvus Lite file (one machine, tests) or a server/cluster URI (http://host:19530).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from indexer.build import family_vectors, row_batches
from indexer.milvus_schema import ROW_FIELD, VECTOR_FIELD, create_collection, entities
from indexer.read_index import DuplicateGroups
from indexer.shortlist_backends import FamilySearcher, ShortlistUnavailableError
from models.distance.augmented import augmented_dim, index_form, query_vectors
from models.distance.augmented import scores_to_distances as to_distances

if TYPE_CHECKING:
    from indexer.manifest import Manifest

log = logging.getLogger(__name__)

T = TypeVar("T")
MetadataLookup = Callable[[Sequence[int]], list[dict[str, Any]]]
INSERT_BYTES = 16 << 20  # rows per insert call: ~16 MB of vectors, under gRPC's 64 MB limit
TIMEOUT_S = 10.0  # one Milvus call; then the shortlist counts as unavailable
MAX_TOP_K = 16384  # Milvus's largest limit per search


class MilvusMissingError(ValueError):
    """The milvus backend is configured but pymilvus is not installed."""


class MilvusCollectionError(ValueError):
    """A version has no (complete) Milvus collection for a family."""


def import_pymilvus() -> Any:
    """The pymilvus module, or MilvusMissingError saying how to install it."""
    try:
        import pymilvus
    except ImportError:
        raise MilvusMissingError(
            "PROBSEARCH_SHORTLIST_BACKEND=milvus needs pymilvus, which is not installed: "
            "pip install 'probsearch[milvus]' (and milvus-lite for a local file URI), "
            "or set PROBSEARCH_SHORTLIST_BACKEND=faiss"
        ) from None
    return pymilvus


def collection_name(modality: str, version: str, family: str) -> str:
    """The collection of one version's family (Milvus names: letters, digits, underscores)."""
    return re.sub(r"[^0-9A-Za-z_]", "_", f"probsearch_{modality}_{version}_{family}")


def alias_name(modality: str, family: str) -> str:
    """The alias naming the active version's collection of a modality's family."""
    return f"probsearch_{modality}_{family}_active"


def milvus_index(
    index_type: str, params: dict[str, Any], family: str
) -> tuple[str, str, dict[str, Any]]:
    """(Milvus index type, metric type, build params) for a manifest's index type and params.

    flat -> FLAT (exact); ivf -> IVF_FLAT; hnsw -> HNSW (Milvus searches inner product in
    HNSW natively, no MIPS transform); ivfpq -> IVF_PQ; ivfsq8 -> IVF_SQ8.
    """
    metric = "L2" if index_form(family).faiss_metric == "l2" else "IP"
    if index_type == "flat":
        return "FLAT", metric, {}
    if index_type == "ivf":
        return "IVF_FLAT", metric, {"nlist": int(params["nlist"])}
    if index_type == "ivfsq8":
        return "IVF_SQ8", metric, {"nlist": int(params["nlist"])}
    if index_type == "hnsw":
        build = {"M": int(params["hnsw_m"]), "efConstruction": int(params["ef_construction"])}
        return "HNSW", metric, build
    if index_type == "ivfpq":
        dim = int(params["dim"])  # Milvus needs m | dim; FAISS pads instead
        m = max(d for d in range(1, int(params["pq_m"]) + 1) if dim % d == 0)
        return "IVF_PQ", metric, {"nlist": int(params["nlist"]), "m": m, "nbits": 8}
    raise MilvusCollectionError(f"index type {index_type!r} has no Milvus counterpart")


def milvus_search_params(search_params: dict[str, Any]) -> dict[str, Any]:
    """Milvus search params from the manifest's tuned FAISS ones (nprobe, efSearch)."""
    if "nprobe" in search_params:
        return {"nprobe": int(search_params["nprobe"])}
    if "efSearch" in search_params:
        return {"ef": int(search_params["efSearch"])}
    return {}


class MilvusConnection:
    """A MilvusClient made on first use and again after a failure; errors of reach become
    ShortlistUnavailableError, so a server that comes back is used without a restart."""

    def __init__(self, uri: str, timeout_s: float = TIMEOUT_S) -> None:
        self.uri = uri
        self.timeout_s = timeout_s
        self._pymilvus = import_pymilvus()
        self._client: Any = None
        self._lock = threading.Lock()

    def call(self, action: Callable[[Any], T]) -> T:
        """action(client); connection failures raise ShortlistUnavailableError."""
        exception = self._pymilvus.MilvusException
        try:
            return action(self._get())
        except exception as e:
            if _is_not_found(e):
                raise MilvusCollectionError(str(e.message)) from e
            self._drop()
            raise ShortlistUnavailableError(
                f"the Milvus shortlist at {self.uri} is unavailable ({e.message}); retry later"
            ) from e

    def _get(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._pymilvus.MilvusClient(self.uri, timeout=self.timeout_s)
            return self._client

    def _drop(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception as e:  # a dead connection may fail to close; it is gone anyway
                log.debug("closing a failed Milvus client: %s", e)

    def close(self) -> None:
        """Close the client (a later call opens a new one)."""
        self._drop()


def _is_not_found(error: Any) -> bool:
    return getattr(error, "code", None) == 100 or "not exist" in str(error).lower()


class MilvusFamilyIndex:
    """One family's collection of one version; searches in Gaussian terms like FamilyIndex."""

    def __init__(
        self,
        connection: MilvusConnection,
        name: str,
        family: str,
        count: int,
        search_params: dict[str, Any],
        duplicates: DuplicateGroups | None,
    ) -> None:
        self.connection = connection
        self.name = name
        self.family = family
        self._count = count
        self._metric = "L2" if index_form(family).faiss_metric == "l2" else "IP"
        self._params = milvus_search_params(search_params)
        self.duplicates = duplicates

    @property
    def count(self) -> int:
        return self._count

    def search(
        self, mu_q: np.ndarray, logvar_q: np.ndarray | None, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Distances (Q, k) float32 of the family's metric and rows (Q, k) int64, -1 padded."""
        queries, const = query_vectors(self.family, mu_q, logvar_q)  # (Q, D'), (Q,)
        limit = min(k, MAX_TOP_K, max(self._count, 1))
        hits = self.connection.call(lambda client: self._search(client, queries, limit))
        scores = np.full((len(queries), k), np.nan, np.float64)  # (Q, k)
        rows = np.full((len(queries), k), -1, np.int64)
        for q, query_hits in enumerate(hits):
            for j, hit in enumerate(query_hits):
                rows[q, j], scores[q, j] = hit.id, hit.distance
        distances = to_distances(self.family, np.nan_to_num(scores, nan=np.inf), const)
        distances[rows < 0] = np.inf
        if self.duplicates is None:
            return distances, rows
        return self.duplicates.expand(distances, rows, k)

    def _search(self, client: Any, queries: np.ndarray, limit: int) -> Any:
        """client.search; a collection released by a restarted server is loaded again."""

        def search() -> Any:
            return client.search(
                self.name,
                data=list(queries),
                limit=limit,
                anns_field=VECTOR_FIELD,
                search_params={"metric_type": self._metric, "params": self._params},
                output_fields=[ROW_FIELD],
                timeout=self.connection.timeout_s,
            )

        try:
            return search()
        except Exception as e:
            if not _is_not_loaded(e):
                raise
        log.warning("Milvus collection %s was released; loading it again", self.name)
        client.load_collection(self.name, timeout=self.connection.timeout_s)
        return search()


def _is_not_loaded(error: Exception) -> bool:
    message = str(error).lower()
    return getattr(error, "code", None) == 101 or "not loaded" in message or "released" in message


class MilvusBackend:
    """Shortlists from Milvus collections written by `probsearch reindex` (write_version)."""

    name = "milvus"

    def __init__(self, uri: str, timeout_s: float = TIMEOUT_S) -> None:
        self.connection = MilvusConnection(uri, timeout_s)

    def open_families(
        self, path: Path, manifest: Manifest, duplicates: DuplicateGroups | None
    ) -> dict[str, FamilySearcher]:
        """Load the version's collections; MilvusCollectionError if one is missing."""
        del path  # the vectors live in Milvus
        searchers: dict[str, FamilySearcher] = {}
        for family in manifest.families:
            name = collection_name(manifest.modality, manifest.version, family)
            if not self.connection.call(lambda c, n=name: c.has_collection(n)):
                raise MilvusCollectionError(
                    f"{manifest.modality} version {manifest.version} has no Milvus collection "
                    f"{name} at {self.connection.uri}; rebuild it with "
                    "PROBSEARCH_SHORTLIST_BACKEND=milvus probsearch reindex"
                )
            self.connection.call(lambda c, n=name: c.load_collection(n))
            count = self.connection.call(lambda c, n=name: row_count(c, n))
            searchers[family] = MilvusFamilyIndex(
                self.connection,
                name,
                family,
                count,
                manifest.search_params.get(family, {}),
                duplicates,
            )
        return searchers

    def health(self, manifest: Manifest) -> str | None:
        """None when Milvus answers for this version's first collection, else why not."""
        name = collection_name(manifest.modality, manifest.version, manifest.families[0])
        try:
            self.connection.call(lambda c: c.has_collection(name, timeout=2.0))
        except (ShortlistUnavailableError, MilvusCollectionError) as e:
            return str(e)
        return None

    # ---- writing (reindex) and activation -------------------------------------------------

    def write_version(
        self,
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
                self._write_family(name, family, manifest, (mu, logvar), metadata, rows)
        except BaseException:
            self.drop(written)
            raise
        return written

    def _write_family(
        self,
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
        self.connection.call(lambda c: create_collection(c, name, dim, index_type, metric, build))
        per_insert = max(1, INSERT_BYTES // (4 * dim))
        for batch in row_batches(len(rows), per_insert):
            batch_rows = rows[batch]
            vectors = family_vectors(family, *arrays, batch_rows)  # (n, D')
            data = entities(batch_rows, vectors, metadata(batch_rows.tolist()))
            self.connection.call(lambda c, d=data: c.insert(name, d))
        self.connection.call(lambda c: c.flush(name))
        stored = self.connection.call(lambda c: row_count(c, name))
        if stored != len(rows):
            raise MilvusCollectionError(f"{name} holds {stored} vectors, expected {len(rows)}")
        log.info("wrote Milvus collection %s: %d vectors, %s %s", name, stored, index_type, metric)

    def activate(self, modality: str, version: str, families: Sequence[str]) -> None:
        """Point each family's alias at `version`'s collection (create or move it)."""
        for family in families:
            name = collection_name(modality, version, family)
            alias = alias_name(modality, family)
            if not self.connection.call(lambda c, n=name: c.has_collection(n)):
                raise MilvusCollectionError(
                    f"{modality} version {version} has no Milvus collection {name}; it was built "
                    "without PROBSEARCH_SHORTLIST_BACKEND=milvus, rebuild it to activate it"
                )
            self.connection.call(lambda c, n=name, a=alias: _point_alias(c, a, n))

    def active_collection(self, modality: str, family: str) -> str | None:
        """The collection a family's alias points at (None: no alias yet)."""
        alias = alias_name(modality, family)
        try:
            return self.connection.call(lambda c: c.describe_alias(alias)["collection_name"])
        except MilvusCollectionError:
            return None

    def drop(self, names: Sequence[str]) -> None:
        """Drop collections (missing ones are skipped)."""
        for name in names:
            self.connection.call(lambda c, n=name: c.drop_collection(n))

    def drop_version(self, modality: str, version: str, families: Sequence[str]) -> None:
        """Drop a version's collections (index gc)."""
        self.drop([collection_name(modality, version, f) for f in families])


def row_count(client: Any, name: str) -> int:
    """Vectors in a collection."""
    return int(client.get_collection_stats(name)["row_count"])


def _point_alias(client: Any, alias: str, name: str) -> None:
    if alias in client.list_aliases(name).get("aliases", []):
        return
    try:
        client.describe_alias(alias)
    except Exception:  # no such alias yet
        client.create_alias(name, alias)
        return
    client.alter_alias(name, alias)


def write_version_dir(backend: MilvusBackend, version_dir: Path) -> list[str]:
    """Write the collections of a complete version dir (reindex, before it is published)."""
    from indexer.manifest import read_manifest
    from indexer.store import DUPLICATES_NAME, LOGVAR_NAME, METADATA_NAME, MU_NAME, MetadataReader

    manifest = read_manifest(version_dir)
    mu = np.load(version_dir / MU_NAME, mmap_mode="r")  # (N, D)
    logvar = np.load(version_dir / LOGVAR_NAME, mmap_mode="r")
    duplicates = None
    if (version_dir / DUPLICATES_NAME).is_file():
        duplicates = DuplicateGroups(np.load(version_dir / DUPLICATES_NAME))
    metadata = MetadataReader(version_dir / METADATA_NAME)
    try:
        return backend.write_version(manifest, mu, logvar, metadata.lookup, duplicates)
    finally:
        metadata.close()
