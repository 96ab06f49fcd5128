"""Which index version is active: Redis key + ACTIVE pointer file, publish lock, activation events.

Redis (when configured and up) is what running services read and are notified through; the
pointer file <root>/<modality>/ACTIVE is always written too, so that a service started while
Redis is down still finds the active version.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from indexer.job_owner import is_dead_here, owner_token
from indexer.manifest import MANIFEST_NAME, read_manifest

log = logging.getLogger(__name__)

ACTIVE_NAME = "ACTIVE"
EVENTS_CHANNEL = "probsearch:events"
MODALITIES = ("image", "text")
PUBLISH_LOCK_TIMEOUT_S = 120


def active_key(modality: str) -> str:
    """Redis key naming the active version of a modality's gallery."""
    return f"probsearch:active:{modality}"


def publish_lock_key(modality: str) -> str:
    """Redis key of the lock held while a job publishes a version of `modality`."""
    return f"probsearch:lock:publish:{modality}"


class RegistryError(ValueError):
    """A registry operation cannot be done as asked."""


class VersionNotFoundError(RegistryError):
    """No complete version of that name exists."""


class PublishLockedError(RegistryError):
    """Another job is publishing the same modality right now."""


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
        self, index_root: Path, redis_url: str | None, aliases: VersionAliases | None = None
    ) -> None:
        self.index_root = Path(index_root)
        self.redis_url = redis_url
        self.aliases = aliases
        self._client: redis.Redis | None = None
        if redis_url:
            # One try, no backoff: a down Redis must fall back to the pointer file at once.
            self._client = redis.Redis.from_url(
                redis_url,
                socket_connect_timeout=1.0,
                socket_timeout=2.0,
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

    def active_version(self, modality: str) -> str | None:
        """The active version: Redis when reachable and set, else the pointer file, else None."""
        if self._client is not None:
            try:
                value = self._client.get(active_key(modality))
                if value is not None:
                    return value.decode()
            except redis.RedisError as e:
                log.warning("Redis unreachable (%s); reading the ACTIVE pointer file", e)
        pointer = self.modality_dir(modality) / ACTIVE_NAME
        if pointer.is_file():
            return pointer.read_text(encoding="utf-8").strip() or None
        return None

    def activate(self, modality: str, version: str) -> None:
        """Make `version` active: pointer file, Redis key, and an "activated" event."""
        path = self.version_path(modality, version)
        if not (path / MANIFEST_NAME).is_file():
            known = ", ".join(self.versions(modality)) or "none"
            raise VersionNotFoundError(
                f"no complete {modality} version {version!r} under {self.index_root}"
                f" (known: {known})"
            )
        if self.aliases is not None:
            self.aliases.activate(modality, version, read_manifest(path).families)
        _write_atomically(self.modality_dir(modality) / ACTIVE_NAME, version + "\n")
        if self._client is None:
            log.warning("no Redis configured: %s is active through the ACTIVE file only", version)
            return
        try:
            self._client.set(active_key(modality), version)
            event = {"event": "activated", "modality": modality, "version": version}
            self._client.publish(EVENTS_CHANNEL, json.dumps(event))
        except redis.RedisError as e:
            log.warning(
                "Redis unreachable (%s): %s is active in the ACTIVE file only; run "
                "`probsearch index activate` again once Redis is back",
                e,
                version,
            )

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
        key = publish_lock_key(modality)
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
