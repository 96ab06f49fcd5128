"""The write-ahead log of a live gallery: the items added to and deleted from one index version
since it was built, in the order they were acknowledged (issue 43).

The log is `live.wal` inside the version dir: one JSON line per write, appended under an
exclusive file lock and fsynced before the write is acknowledged, so an acknowledged write
survives kill -9 of the process that took it and every process serving the version (replicas
on a shared index root, the CLI) sees it. A put carries the item's mean and log-variance as
computed when it was taken, so replaying the log never re-encodes anything and always gives the
same arrays. A line cut short by a crash was never acknowledged: readers stop before it and the
next writer cuts it off. The byte offset a reader has applied up to names the state it serves
(`LiveIndex.live_offset`), which is what the result cache keys on.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from indexer.manifest import LIVE_LOG_NAME


class LiveLogError(ValueError):
    """A line of the log cannot be read (not a torn tail: corruption in the middle)."""


@dataclass(frozen=True)
class Put:
    """An item added, or replacing the item of the same id."""

    item_id: str
    mu: np.ndarray  # (D,) float32
    logvar: np.ndarray  # (D,) float32
    record: dict[str, Any]  # {"text"?, "uri"?, "extra"}, as metadata.sqlite holds it
    novelty: float | None = None  # pictures of a model on pretrained backbones
    op: str = field(default="put", init=False)


@dataclass(frozen=True)
class Delete:
    """The item of this id removed."""

    item_id: str
    op: str = field(default="delete", init=False)


Entry = Put | Delete


def encode_entry(entry: Entry) -> bytes:
    """One log line (JSON, newline-terminated)."""
    if isinstance(entry, Delete):
        return (json.dumps({"op": "delete", "id": entry.item_id}) + "\n").encode()
    line = {
        "op": "put",
        "id": entry.item_id,
        "mu": _pack(entry.mu),
        "logvar": _pack(entry.logvar),
        "record": entry.record,
        "novelty": entry.novelty,
    }
    return (json.dumps(line, sort_keys=True) + "\n").encode()


def decode_entry(line: bytes) -> Entry:
    """The entry of one complete log line; LiveLogError if it is not one."""
    try:
        value = json.loads(line)
        if value["op"] == "delete":
            return Delete(str(value["id"]))
        if value["op"] == "put":
            novelty = value.get("novelty")
            return Put(
                str(value["id"]), _unpack(value["mu"]), _unpack(value["logvar"]),
                dict(value["record"]), None if novelty is None else float(novelty),
            )  # fmt: skip
    except (ValueError, KeyError, TypeError) as error:
        raise LiveLogError(f"unreadable log line ({error}): {line[:120]!r}") from None
    raise LiveLogError(f"unknown log operation {value['op']!r}")


def _pack(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype="<f4").tobytes()).decode()


def _unpack(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4").astype(np.float32)


class LiveLog:
    """The log file of one version dir: read from an offset, append under its lock."""

    def __init__(self, version_dir: Path) -> None:
        self.path = Path(version_dir) / LIVE_LOG_NAME
        self._thread_lock = threading.Lock()  # flock does not order threads of one process

    def size(self) -> int:
        """Bytes in the log now (0 when there is none)."""
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def read(self, start: int) -> tuple[list[Entry], int]:
        """The complete entries after byte `start`, and the offset after the last of them."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(start)
                data = handle.read()
        except FileNotFoundError:
            return [], start
        complete = data[: data.rfind(b"\n") + 1]
        entries = [decode_entry(line) for line in complete.splitlines() if line.strip()]
        return entries, start + len(complete)

    @contextmanager
    def locked(self) -> Iterator[LockedLog]:
        """Exclusive use of the log (between processes and threads) for a read and append."""
        with self._thread_lock:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield LockedLog(fd, self)
            finally:
                os.close(fd)  # releases the flock


class LockedLog:
    """The log while its lock is held: appends are durable when `append` returns."""

    def __init__(self, fd: int, log: LiveLog) -> None:
        self._fd = fd
        self.log = log

    def append(self, entries: list[Entry]) -> int:
        """Write the entries after the last complete line, fsync, and return the new size."""
        end = self._complete_end()
        if end != os.fstat(self._fd).st_size:
            os.ftruncate(self._fd, end)  # a torn line of a crashed writer, never acknowledged
        os.write(self._fd, b"".join(encode_entry(e) for e in entries))
        os.fsync(self._fd)
        return os.fstat(self._fd).st_size

    def copy_after(self, start: int, target: LiveLog) -> int:
        """Append this log's complete entries after byte `start` to `target` (a compaction's
        new version), durably; returns how many were copied."""
        entries, _ = self.log.read(start)
        if entries:
            with target.locked() as locked:
                locked.append(entries)
        return len(entries)

    def _complete_end(self) -> int:
        size = os.fstat(self._fd).st_size
        if size == 0:
            return 0
        tail = os.pread(self._fd, min(size, 1 << 20), max(0, size - (1 << 20)))
        cut = tail.rfind(b"\n")
        if cut < 0:
            return 0 if size <= 1 << 20 else size  # a line longer than 1 MiB: leave it be
        return size - len(tail) + cut + 1
