"""The index versions being served, one per gallery, hot-swapped when another is activated.

A watcher thread listens on the Redis activation channel (pub/sub) and also re-reads the
active version every `poll_interval_s`, so a missed message or a Redis outage only delays a
swap: while Redis is down the ACTIVE pointer files decide. A new version is opened in the
watcher thread, swapped in atomically, and the old one is closed once the last request that
acquired it has finished.
"""

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import redis

from indexer.active_record import ActiveRecord
from indexer.calibration_inheritance import familiarity_gate, uncalibrated_metrics
from indexer.live_index import LiveIndex, VersionMovedError, WriteResult
from indexer.live_log import Entry, LiveLogError
from indexer.registry import ActiveRegistry, ActiveSides
from indexer.shortlist import ShortlistBackend
from indexer.store import IndexVersion, open_version
from service.cache import REDIS_ERRORS, Backoff, redis_connection_kwargs
from service.errors import IndexUnavailableError
from service.metrics import ServiceMetrics
from service.outage_log import OutageLog

log = logging.getLogger(__name__)


class LoadedIndex:
    """One open index version (with its live writes) plus the count of requests using it."""

    def __init__(self, modality: str, version: str, index: LiveIndex, generation: int = 0) -> None:
        self.modality = modality
        self.version = version
        self.generation = generation  # of the activation it was loaded for
        self.index = index
        # read once here, not per query: a version's calibration is fixed once it is published
        self.uncalibrated_metrics = tuple(uncalibrated_metrics(index.manifest))
        # what a caption gallery's calibration says of the pictures image queries may return
        self.familiarity_gate = familiarity_gate(index.manifest) if modality == "text" else None
        self.in_flight = 0
        self.retired = False

    @property
    def cache_version(self) -> str:
        """What the result cache keys answers by: the version, and the live writes it serves
        (their log offset), so an answer never outlives a write that would change it."""
        offset = self.index.live_offset
        return self.version if offset == 0 else f"{self.version}+{offset}"


def calibration_warning(loaded: LoadedIndex) -> str:
    """A sentence when the version serves metrics without a rejection threshold, else ""."""
    missing = loaded.uncalibrated_metrics
    if not missing:
        return ""
    return (
        f"the {loaded.modality} index {loaded.version} has no calibration for "
        f"{', '.join(missing)}: queries are never rejected there; run `probsearch calibrate`"
    )


class IndexHolder:
    """Serves the active index version of each gallery and swaps versions without downtime.

    Args:
        index_root: root of the <modality>/<version>/ dirs.
        galleries: gallery modalities to serve.
        redis_url: Redis for the active version and activation events; None: files only.
        check: called on every newly opened version before it is served; raising refuses it
            (e.g. an index built with another model), and the current version stays.
        backend: where shortlists are searched (default: the versions' FAISS files); a
            version that cannot be opened there (Milvus unreachable) is retried every poll.
        namespace: of the index root's Redis keys (default: indexer.registry.namespace_of).
    """

    def __init__(
        self,
        index_root: Path,
        galleries: list[str],
        redis_url: str | None,
        metrics: ServiceMetrics,
        *,
        device: str = "auto",
        check: Callable[[IndexVersion], None] | None = None,
        poll_interval_s: float = 2.0,
        socket_timeout_s: float = 0.5,
        backoff_max_s: float = 30.0,
        backend: ShortlistBackend | None = None,
        namespace: str | None = None,
    ) -> None:
        self.index_root = Path(index_root)
        self.galleries = list(galleries)
        self._redis_url = redis_url
        self._metrics = metrics
        self._device = device
        self._check = check
        self._backend = backend
        self._poll_interval_s = poll_interval_s
        self._socket_timeout_s = socket_timeout_s
        self._backoff = Backoff(maximum_s=backoff_max_s)
        self._redis_registry = (
            ActiveRegistry(
                self.index_root, redis_url, socket_timeout_s=socket_timeout_s, namespace=namespace
            )
            if redis_url
            else None
        )
        self._file_registry = ActiveRegistry(self.index_root, None, namespace=namespace)
        self.namespace = self._file_registry.namespace
        self._current: dict[str, LoadedIndex] = {}
        self._lock = threading.Lock()  # guards _current and the in-flight counts
        self._load_lock = threading.Lock()  # one version load at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._log_failures = OutageLog(log, "reading a live gallery's log")

    # ----- serving -----------------------------------------------------------------------

    @contextmanager
    def acquire(self, modality: str) -> Iterator[LoadedIndex]:
        """Pin the current version of `modality` for the duration of a request, with the
        live writes logged so far (by this process or any other)."""
        with self._lock:
            loaded = self._current.get(modality)
            if loaded is None:
                raise IndexUnavailableError(self.unavailable_message(modality))
            loaded.in_flight += 1
        try:
            self._catch_up(loaded)
            yield loaded
        finally:
            with self._lock:
                loaded.in_flight -= 1
                close_now = loaded.retired and loaded.in_flight == 0
            if close_now:
                self._close(loaded)

    def _catch_up(self, loaded: LoadedIndex) -> None:
        try:
            loaded.index.refresh()
        except (OSError, LiveLogError) as error:  # serve what was read; say so once
            self._log_failures.failed(error)
        else:
            if self._log_failures.count:
                self._log_failures.succeeded()

    def write(self, modality: str, entries: list[Entry]) -> tuple[WriteResult, str]:
        """Log `entries` to the active version of `modality` and serve them; the result and
        the version written. A compaction that activates another version meanwhile sends
        the write there (VersionMovedError, then a refresh)."""
        for _ in range(3):
            with self.acquire(modality) as loaded:
                try:
                    result = loaded.index.write(
                        entries, still_active=lambda: self._is_active(modality, loaded.version)
                    )
                    return result, loaded.version
                except VersionMovedError:
                    pass
            self.refresh([modality])
        raise IndexUnavailableError(
            f"the active {modality} version changed three times during one write; retry"
        )

    def _is_active(self, modality: str, version: str) -> bool:
        record = self._active_record(modality)
        return record is not None and record.version == version

    def registry(self) -> ActiveRegistry:
        """The registry this holder reads the active versions from (Redis when configured)."""
        return self._redis_registry or self._file_registry

    def versions(self) -> dict[str, str | None]:
        """The version served per gallery (None where none is loaded)."""
        with self._lock:
            return {
                m: (self._current[m].version if m in self._current else None)
                for m in self.galleries
            }

    def loaded(self) -> list[LoadedIndex]:
        """The loaded versions, one per gallery that has one."""
        with self._lock:
            return [self._current[m] for m in self.galleries if m in self._current]

    def shortlist_problems(self) -> list[str]:
        """Why a loaded version's shortlist cannot answer now (Milvus down); empty when fine."""
        problems = []
        for loaded in self.loaded():
            problem = loaded.index.backend.health(loaded.index.manifest)
            if problem:
                problems.append(f"{loaded.modality}: {problem}")
        return problems

    @property
    def ready(self) -> bool:
        """Whether every served gallery has a loaded version."""
        with self._lock:
            return all(m in self._current for m in self.galleries)

    # ----- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Load the active versions now, then watch for activations in a background thread."""
        self.refresh()
        self._thread = threading.Thread(target=self._watch, name="index-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching and close every version that no request still uses."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            current, self._current = list(self._current.values()), {}
            for loaded in current:
                loaded.retired = True
        for loaded in current:
            if loaded.in_flight == 0:
                self._close(loaded)

    def refresh(self, modalities: list[str] | None = None) -> dict[str, str | None]:
        """Read the active version of each gallery and swap in those activated since.

        Only a later activation (a higher generation) replaces what is served, so a store
        that comes back with an older record never takes the service back. A gallery with
        nothing loaded whose active version cannot be opened here (not on this replica's
        disk) falls back to the version its ACTIVE pointer file names.
        """
        for modality in modalities or self.galleries:
            record = self._active_record(modality)
            if record is not None and self._is_new(modality, record):
                self._load(modality, record)
            if self.versions().get(modality) is None:
                fallback = self._pointer_file_record(modality)
                if fallback is not None and fallback != record:
                    self._load(modality, fallback)
        return self.versions()

    def active_sides(self) -> dict[str, ActiveSides]:
        """What the ACTIVE file and Redis each say per gallery (for /readyz)."""
        registry = self._file_registry
        if self._redis_registry is not None and not self._backoff.down:
            registry = self._redis_registry
        return {modality: registry.sides(modality) for modality in self.galleries}

    # ----- internals ---------------------------------------------------------------------

    def _is_new(self, modality: str, record: ActiveRecord) -> bool:
        """Whether `record` is a later activation than the served one (and, for the same
        version activated again, note its generation)."""
        with self._lock:
            current = self._current.get(modality)
            if current is None or record.generation > current.generation:
                if current is not None and current.version == record.version:
                    current.generation = record.generation
                    return False
                return True
            # equal generations differ only in stores written before generations existed
            return record.generation == current.generation and record.version != current.version

    def _active_record(self, modality: str) -> ActiveRecord | None:
        registry = self._file_registry
        if self._redis_registry is not None and not self._backoff.down:
            registry = self._redis_registry
        try:
            return registry.active_record(modality)
        except (ValueError, OSError) as error:
            log.error("cannot read the active %s version: %s", modality, error)
            return None

    def _pointer_file_record(self, modality: str) -> ActiveRecord | None:
        try:
            return self._file_registry.active_record(modality)
        except (ValueError, OSError) as error:
            log.error("cannot read the %s ACTIVE pointer file: %s", modality, error)
            return None

    def _load(self, modality: str, record: ActiveRecord) -> None:
        with self._load_lock:
            if not self._is_new(modality, record):
                return
            path = self._file_registry.version_path(modality, record.version)
            try:
                version = open_version(path, device=self._device, backend=self._backend)
            except (ValueError, OSError) as error:
                log.error(
                    "cannot open %s index %s (%s); keeping the current one",
                    modality,
                    record.version,
                    error,
                )
                return
            try:
                if self._check is not None:
                    self._check(version)
                index = LiveIndex(version)
            except (ValueError, OSError) as error:
                log.error("refusing %s index %s: %s", modality, record.version, error)
                version.close()
                return
            self._swap(LoadedIndex(modality, record.version, index, record.generation))

    def _swap(self, new: LoadedIndex) -> None:
        with self._lock:
            old = self._current.get(new.modality)
            self._current[new.modality] = new
            close_now = False
            if old is not None:
                old.retired = True
                close_now = old.in_flight == 0
        previous = old.version if old is not None else None
        self._metrics.set_active_version(new.modality, new.version, previous)
        self._metrics.index_swaps.labels(modality=new.modality).inc()
        log.info("serving %s index %s (was %s)", new.modality, new.version, previous)
        warning = calibration_warning(new)
        if warning:
            log.warning(warning)
        if old is not None and close_now:
            self._close(old)

    def _close(self, loaded: LoadedIndex) -> None:
        try:
            loaded.index.close()
        except Exception:  # closing must never take a request down with it
            log.exception("closing %s index %s failed", loaded.modality, loaded.version)

    def recover(self) -> None:
        """Redis answers again (service.redis_health): resubscribe on the next watcher turn."""
        self._backoff.succeeded()

    def unavailable_message(self, modality: str) -> str:
        if modality not in self.galleries:
            return (
                f"this service does not serve the {modality} gallery "
                f"(served: {', '.join(self.galleries)})"
            )
        return (
            f"no {modality} index is loaded yet; build one with `probsearch reindex "
            f"--modality {modality} ... --activate` under {self.index_root}"
        )

    def _watch(self) -> None:
        """Watcher thread: pub/sub when Redis is up, polling always, reconnect with backoff."""
        pubsub = None
        next_poll = 0.0
        while not self._stop.is_set():
            if pubsub is None and self._redis_url is not None and self._backoff.ready():
                pubsub = self._subscribe()
            if pubsub is not None:
                pubsub = self._listen(pubsub, timeout_s=min(self._poll_interval_s, 1.0))
            else:
                self._stop.wait(min(self._poll_interval_s, 0.5))
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + self._poll_interval_s
                self._safe_refresh()
        if pubsub is not None:
            self._close_pubsub(pubsub)

    def _subscribe(self) -> "redis.client.PubSub | None":
        try:
            client = redis.Redis.from_url(
                self._redis_url, **redis_connection_kwargs(self._socket_timeout_s)
            )
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(self._file_registry.events_channel)
        except REDIS_ERRORS as error:
            self._redis_down(error)
            return None
        if self._backoff.down:
            log.info("Redis reachable again; listening for index activations")
        self._backoff.succeeded()
        self._metrics.redis_up.set(1)
        self._safe_refresh()  # catch activations missed while disconnected
        return pubsub

    def _listen(
        self, pubsub: "redis.client.PubSub", timeout_s: float
    ) -> "redis.client.PubSub | None":
        try:
            message = pubsub.get_message(timeout=timeout_s)
        except REDIS_ERRORS as error:
            self._redis_down(error)
            self._close_pubsub(pubsub)
            return None
        if message is not None and message.get("type") == "message":
            self._on_event(message.get("data"))
        return pubsub

    def _on_event(self, data: object) -> None:
        try:
            event = json.loads(data)
            modality = event["modality"]
        except (TypeError, ValueError, KeyError):
            log.warning("ignoring malformed activation event: %r", data)
            return
        if event.get("event") == "activated" and modality in self.galleries:
            self._safe_refresh([modality])

    def _safe_refresh(self, modalities: list[str] | None = None) -> None:
        try:
            self.refresh(modalities)
        except Exception:  # the watcher must survive anything and retry on the next poll
            log.exception("refreshing the active index versions failed")

    def _redis_down(self, error: Exception) -> None:
        was_down = self._backoff.down
        delay_s = self._backoff.failed()
        self._metrics.redis_errors.labels(component="index_watcher").inc()
        self._metrics.redis_up.set(0)
        if not was_down:
            log.warning(
                "Redis unavailable (%s); the ACTIVE pointer files decide the index "
                "versions; reconnecting with backoff (next try in %.1fs)",
                error,
                delay_s,
            )

    @staticmethod
    def _close_pubsub(pubsub: "redis.client.PubSub") -> None:
        with suppress(REDIS_ERRORS):
            pubsub.close()
