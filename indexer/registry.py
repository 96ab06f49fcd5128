"""Which index version is active: Redis key + ACTIVE pointer file, publish lock, activation events.

Both stores hold the same record (indexer.active_record): the version and a generation that
every activation raises. Readers take the higher generation and repair the lower store, so a
Redis that lost writes (paused, restored from a snapshot, a lagging replica) or a pointer file
moved by a job without Redis never sends anyone back to an older activation. Redis is also how
running services are told at once (an "activated" event); the pointer file
<root>/<modality>/ACTIVE lets a service started while Redis is down find the active version.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from indexer.active_record import SET_IF_NEWER, ActiveRecord, newest, parse_record
from indexer.job_owner import is_dead_here, owner_token
from indexer.manifest import MANIFEST_NAME, read_manifest

log = logging.getLogger(__name__)

ACTIVE_NAME = "ACTIVE"
MODALITIES = ("image", "text")
PUBLISH_LOCK_TIMEOUT_S = 120


DEFAULT_LOCAL_REDIS = "redis://127.0.0.1:6379/0"


def redis_answering(url: str | None) -> bool:
    """Whether a Redis server answers PING at `url` within a second."""
    if not url:
        return False
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def default_redis_url(configured: str | None) -> str | None:
    """The Redis a command uses: the configured one (flag or PROBSEARCH_REDIS_URL), else the
    local one when it answers, as the demo's service does; None: the pointer files only."""
    if configured:
        return configured
    return DEFAULT_LOCAL_REDIS if redis_answering(DEFAULT_LOCAL_REDIS) else None


def namespace_of(index_root: Path) -> str:
    """The default namespace of an index root's Redis keys: its directory name and a hash of
    its absolute path, so two index roots sharing one Redis never see each other's versions,
    locks, events or cached answers, and every process naming the same root agrees."""
    resolved = Path(index_root).resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:10]
    return f"{resolved.name or 'root'}-{digest}"


def active_key(namespace: str, modality: str) -> str:
    """Redis key naming the active version of a modality's gallery."""
    return f"probsearch:{namespace}:active:{modality}"


def publish_lock_key(namespace: str, modality: str) -> str:
    """Redis key of the lock held while a job publishes a version of `modality`."""
    return f"probsearch:{namespace}:lock:publish:{modality}"


def events_channel(namespace: str) -> str:
    """Redis pub/sub channel of the index root's activation events."""
    return f"probsearch:{namespace}:events"


class RegistryError(ValueError):
    """A registry operation cannot be done as asked."""


class VersionNotFoundError(RegistryError):
    """No complete version of that name exists."""


class PublishLockedError(RegistryError):
    """Another job is publishing the same modality right now."""


class RedisUnreachableError(RegistryError):
    """The pointer file took an activation but the configured Redis did not."""


@dataclass(frozen=True)
class ActiveSides:
    """What each store says is active (None: nothing there), and why Redis did not answer."""

    file: ActiveRecord | None
    redis: ActiveRecord | None
    redis_configured: bool
    redis_error: str | None

    @property
    def active(self) -> ActiveRecord | None:
        """The record readers follow: the higher generation (Redis on a tie)."""
        return newest(self.redis, self.file)

    def disagreement(self) -> str | None:
        """A sentence when the stores differ (or Redis cannot be read), else None."""
        if self.redis_error is not None:
            return f"Redis unreachable ({self.redis_error}); ACTIVE file: {_show(self.file)}"
        if self.redis_configured and self.redis != self.file:
            return f"the ACTIVE file says {_show(self.file)}, Redis says {_show(self.redis)}"
        return None


def _show(record: ActiveRecord | None) -> str:
    return "nothing" if record is None else f"{record.version} (generation {record.generation})"


def one_line_error(error: Exception) -> str:
    return " ".join(str(error).split()) or type(error).__name__


class VersionAliases(Protocol):
    """Names kept outside the index root that follow activation (Milvus collection aliases)."""

    def activate(self, modality: str, version: str, families: Sequence[str]) -> None: ...

    def drop_version(self, modality: str, version: str, families: Sequence[str]) -> None: ...


class ActiveRegistry:
    """Reads and sets the active version of each modality under one index root.

    With `aliases` (the Milvus shortlist backend), activation first moves them to the
    version's collections, so a failure there leaves the active version unchanged, and gc
    drops the collections of the versions it deletes.
    """

    def __init__(
        self,
        index_root: Path,
        redis_url: str | None,
        aliases: VersionAliases | None = None,
        socket_timeout_s: float = 2.0,
        namespace: str | None = None,
    ) -> None:
        self.index_root = Path(index_root)
        self.redis_url = redis_url
        self.aliases = aliases
        self.namespace = namespace or namespace_of(self.index_root)
        self.events_channel = events_channel(self.namespace)
        self._client: redis.Redis | None = None
        if redis_url:
            # One try, no backoff: a down Redis must fall back to the pointer file at once.
            self._client = redis.Redis.from_url(
                redis_url,
                socket_connect_timeout=min(1.0, socket_timeout_s),
                socket_timeout=socket_timeout_s,
                retry=Retry(NoBackoff(), 0),
            )

    # ---- versions on disk -------------------------------------------------------------------

    def modality_dir(self, modality: str) -> Path:
        """<root>/<modality>; RegistryError for an unknown modality."""
        if modality not in MODALITIES:
            raise RegistryError(f"unknown modality {modality!r}; choose one of {MODALITIES}")
        return self.index_root / modality

    def version_path(self, modality: str, version: str) -> Path:
        """Path of a version dir (which may not exist)."""
        if not version or "/" in version or version.startswith("."):
            raise RegistryError(f"invalid version name {version!r}")
        return self.modality_dir(modality) / version

    def versions(self, modality: str) -> list[str]:
        """Complete (published) versions of a modality, oldest first (names sort by time)."""
        root = self.modality_dir(modality)
        if not root.is_dir():
            return []
        return sorted(
            p.name
            for p in root.iterdir()
            if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST_NAME).is_file()
        )

    # ---- the active version -----------------------------------------------------------------

    def sides(self, modality: str) -> ActiveSides:
        """What the pointer file and Redis each say is active, read now, nothing repaired."""
        redis_record, redis_error = None, None
        if self._client is not None:
            try:
                redis_record = parse_record(self._client.get(active_key(self.namespace, modality)))
            except redis.RedisError as e:
                redis_error = one_line_error(e)
        return ActiveSides(
            file=self._read_pointer(modality),
            redis=redis_record,
            redis_configured=self._client is not None,
            redis_error=redis_error,
        )

    def active_record(self, modality: str) -> ActiveRecord | None:
        """The active version and its generation: the higher of the two stores, after
        bringing the lower one up to it (a paused or restored Redis, a file moved by a job
        that had no Redis), so that no reader ever goes back to an older activation."""
        sides = self.sides(modality)
        if sides.redis_error is not None:
            log.warning("Redis unreachable (%s); reading the ACTIVE file", sides.redis_error)
        best = sides.active
        if best is not None:
            self._repair(modality, sides, best)
        return best

    def active_version(self, modality: str) -> str | None:
        """The active version's name (active_record), or None when none was activated."""
        record = self.active_record(modality)
        return record.version if record is not None else None

    def activate(self, modality: str, version: str) -> ActiveRecord:
        """Make `version` active under the next generation: pointer file, Redis key, and an
        "activated" event. RedisUnreachableError when the configured Redis did not take it
        (the pointer file did: readers of this index root follow it all the same)."""
        path = self.version_path(modality, version)
        if not (path / MANIFEST_NAME).is_file():
            known = ", ".join(self.versions(modality)) or "none"
            raise VersionNotFoundError(
                f"no complete {modality} version {version!r} under {self.index_root}"
                f" (known: {known})"
            )
        if self.aliases is not None:
            self.aliases.activate(modality, version, read_manifest(path).families)
        with self._pointer_lock(modality):
            sides = self.sides(modality)
            latest = newest(sides.redis, sides.file)
            record = ActiveRecord(version, latest.generation + 1 if latest else 1)
            _write_atomically(self._pointer_path(modality), record.to_text() + "\n")
        if self._client is None:
            log.warning(
                "no Redis configured: %s is active through the ACTIVE file only (generation "
                "%d); services reading %s switch on their next poll",
                version,
                record.generation,
                self.index_root,
            )
            return record
        try:
            self._set_redis_if_newer(modality, record)
        except redis.RedisError as e:
            raise RedisUnreachableError(
                f"{modality} version {version} is active in the ACTIVE file (generation "
                f"{record.generation}), but Redis at {self.redis_url} did not take it "
                f"({one_line_error(e)}): services reading {self.index_root} follow the file, "
                "and the next reader that reaches Redis brings it up to date; run `probsearch "
                "index activate` again to be sure"
            ) from None
        return record

    def _repair(self, modality: str, sides: ActiveSides, best: ActiveRecord) -> None:
        """Bring the store of the lower generation up to `best` (best effort: a read-only
        index root, or a Redis that fails now, is left for a later reader)."""
        behind = sides.file is None or sides.file.generation < best.generation
        if behind and (self.version_path(modality, best.version) / MANIFEST_NAME).is_file():
            try:
                with self._pointer_lock(modality):
                    current = self._read_pointer(modality)
                    if current is None or current.generation < best.generation:
                        _write_atomically(self._pointer_path(modality), best.to_text() + "\n")
                        log.warning("ACTIVE file of %s brought up to %s", modality, best)
            except OSError as e:
                log.debug("cannot repair the %s ACTIVE file (%s)", modality, e)
        redis_behind = sides.redis is None or sides.redis.generation < best.generation
        if self._client is not None and sides.redis_error is None and redis_behind:
            try:
                if self._set_redis_if_newer(modality, best):
                    log.warning("Redis active %s version brought up to %s", modality, best)
            except redis.RedisError as e:
                log.debug("cannot repair the %s Redis key (%s)", modality, e)

    def _set_redis_if_newer(self, modality: str, record: ActiveRecord) -> bool:
        """Write `record` to Redis unless it holds a newer one, and announce it; whether it
        wrote."""
        assert self._client is not None
        key = active_key(self.namespace, modality)
        wrote = bool(self._client.eval(SET_IF_NEWER, 1, key, record.to_text(), record.generation))
        if wrote:
            event = {
                "event": "activated",
                "modality": modality,
                "version": record.version,
                "generation": record.generation,
            }
            self._client.publish(self.events_channel, json.dumps(event))
        return wrote

    def _pointer_path(self, modality: str) -> Path:
        return self.modality_dir(modality) / ACTIVE_NAME

    def _read_pointer(self, modality: str) -> ActiveRecord | None:
        pointer = self._pointer_path(modality)
        return parse_record(pointer.read_text(encoding="utf-8")) if pointer.is_file() else None

    @contextlib.contextmanager
    def _pointer_lock(self, modality: str) -> Iterator[None]:
        """Serialise read-compare-write of the pointer file among this host's processes."""
        root = self.modality_dir(modality)
        root.mkdir(parents=True, exist_ok=True)
        with open(root / ".active.lock", "w") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            yield

    def rollback(self, modality: str) -> str:
        """Activate the newest version older than the active one; returns it."""
        active = self.active_version(modality)
        if active is None:
            raise RegistryError(f"no {modality} version is active under {self.index_root}")
        older = [v for v in self.versions(modality) if v < active]
        if not older:
            raise VersionNotFoundError(
                f"no {modality} version older than {active!r} to roll back to"
            )
        self.activate(modality, older[-1])
        return older[-1]

    def gc(self, modality: str, keep: int) -> list[str]:
        """Delete all but the newest `keep` versions, never the active one; returns the deleted."""
        if keep < 1:
            raise RegistryError(f"--keep must be >= 1; got {keep}")
        active = self.active_version(modality)
        versions = self.versions(modality)
        doomed = [v for v in versions[: max(len(versions) - keep, 0)] if v != active]
        for version in doomed:
            path = self.version_path(modality, version)
            if self.aliases is not None:
                self.aliases.drop_version(modality, version, read_manifest(path).families)
            shutil.rmtree(path)
        return doomed

    # ---- the publish lock -------------------------------------------------------------------

    @contextlib.contextmanager
    def publish_lock(
        self, modality: str, timeout_s: float = PUBLISH_LOCK_TIMEOUT_S
    ) -> Iterator[None]:
        """Hold the publish lock of a modality: a local file lock, and the Redis lock when up.

        Raises PublishLockedError at once (no waiting) when another job holds either.
        """
        root = self.modality_dir(modality)
        root.mkdir(parents=True, exist_ok=True)
        with open(root / ".publish.lock", "w") as lock_file:
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise PublishLockedError(self._locked_message(modality, "a local job")) from None
            with self._redis_lock(modality, timeout_s):
                yield

    @contextlib.contextmanager
    def _redis_lock(self, modality: str, timeout_s: float) -> Iterator[None]:
        """The Redis lock as a lease: its value names the owner (indexer.job_owner), a thread
        renews it every third of `timeout_s` while held, and a lock whose owner is a dead
        process of this host is broken at once instead of blocking every rerun until it
        lapses."""
        if self._client is None:
            yield
            return
        key = publish_lock_key(self.namespace, modality)
        lock = self._client.lock(key, timeout=timeout_s, blocking=False, thread_local=False)
        try:
            acquired = lock.acquire(token=owner_token()) or (
                self._break_dead_lock(key) and lock.acquire(token=owner_token())
            )
        except redis.RedisError as e:
            log.warning("Redis unreachable (%s): publishing under the local file lock only", e)
            yield
            return
        if not acquired:
            raise PublishLockedError(self._locked_message(modality, key))
        stop = threading.Event()
        renewer = threading.Thread(target=_renew, args=(lock, timeout_s, stop), daemon=True)
        renewer.start()
        try:
            yield
        finally:
            stop.set()
            renewer.join()
            with contextlib.suppress(redis.RedisError):
                lock.release()

    def _break_dead_lock(self, key: str) -> bool:
        """Delete the lock at `key` if its owner is a dead process of this host; whether it was."""
        assert self._client is not None
        holder = self._client.get(key)
        if holder is None or not is_dead_here(holder.decode()):
            return False
        log.warning("breaking the publish lock of %s, a job that is gone", holder.decode())
        return bool(self._client.eval(_DELETE_IF_EQUAL, 1, key, holder))

    @staticmethod
    def _locked_message(modality: str, holder: str) -> str:
        return (
            f"another job is publishing a {modality} version right now (lock held by {holder});"
            " wait for it to finish, then run this again"
        )


# Delete a key only while it still holds the value read (another job may have taken it since).
_DELETE_IF_EQUAL = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


def _renew(lock: redis.lock.Lock, timeout_s: float, stop: threading.Event) -> None:
    """Extend the lease to `timeout_s` every third of it until `stop` is set."""
    while not stop.wait(timeout_s / 3):
        try:
            lock.reacquire()
        except (redis.RedisError, redis.exceptions.LockError) as e:
            log.warning("could not renew the publish lock: %s", e)


def _write_atomically(path: Path, text: str) -> None:
    """Write a small file so readers see the old or the new content, never a mix."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
