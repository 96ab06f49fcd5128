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

from indexer.milvus_schema import ROW_FIELD, VECTOR_FIELD
from indexer.shortlist import FamilySearcher, ShortlistUnavailableError
from models.distance.augmented import index_form, query_vectors
from models.distance.augmented import scores_to_distances as to_distances

if TYPE_CHECKING:  # faiss (read_index) stays unloaded by the milvus backend
    from indexer.manifest import Manifest
    from indexer.read_index import DuplicateGroups

log = logging.getLogger(__name__)

T = TypeVar("T")
TIMEOUT_S = 10.0  # one Milvus call; then the shortlist counts as unavailable
MAX_TOP_K = 16384  # Milvus's largest limit per search

# pymilvus logs each failed call itself: an ERROR with the traceback per RPC (decorators) and a
# WARNING with the traceback per failed reconnect (connection_manager). In a 30 s Milvus
# outage at 8 clients that was 21 MB of log, 11,453 tracebacks (benchmarks/milvus_outage.py).
# Every failure of a call made through MilvusConnection reaches its caller as an exception
# chained to pymilvus's (the search batcher logs it once per outage with a count, /readyz
# answers it), so these loggers pass only CRITICAL once a connection is made.
PYMILVUS_FAILURE_LOGGERS = ("pymilvus.decorators", "pymilvus.client.connection_manager")


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
        import grpc  # loaded with pymilvus

        self._grpc = grpc
        for name in PYMILVUS_FAILURE_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        self._client: Any = None
        self._lock = threading.Lock()

    def call(self, action: Callable[[Any], T]) -> T:
        """action(client); connection failures raise ShortlistUnavailableError."""
        exception, grpc = self._pymilvus.MilvusException, self._grpc
        try:
            return action(self._get())
        except exception as e:
            if _is_not_found(e):
                raise MilvusCollectionError(str(e.message)) from e
            self._drop()
            raise ShortlistUnavailableError(
                f"the Milvus shortlist at {self.uri} is unavailable ({e.message}); retry later"
            ) from e
        except grpc.RpcError as e:
            # A Milvus that hangs (paused, partitioned) lets gRPC's own error through pymilvus:
            # DEADLINE_EXCEEDED after timeout_s. It was a 500 with uvicorn's traceback per
            # request (a 30 s SIGSTOP at 8 clients: 103 KB of log), not a 503 logged once.
            code = e.code() if isinstance(e, grpc.Call) else None
            if code not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                raise
            self._drop()
            raise ShortlistUnavailableError(
                f"the Milvus shortlist at {self.uri} is unavailable ({code.name}: "
                f"{e.details()}); retry later"
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
    """Shortlists from Milvus collections written by `probsearch reindex` (indexer.milvus_writer),
    and the aliases that follow the active version."""

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

    # ---- activation and gc ----------------------------------------------------------------

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
