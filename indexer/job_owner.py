"""Who owns a job's lock or temporary files, and whether that owner is still alive.

A reindex killed with kill -9 leaves what it held: the Redis publish lock (until its lease
runs out), its `.tmp-<version>` build dir and the `.ACTIVE.<pid>.tmp` file of an activation cut
short. Each is marked with its owner, "<host>:<pid>" (a build dir in the file beside it,
`.tmp-<version>.owner`; a pointer temp file by its name), so a later job on the same host can tell
a dead owner's leftovers from a live job's and remove them (`remove_debris`); a job on another
host cannot see the owner's processes and waits for the lease to lapse instead.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from pathlib import Path

OWNER_SUFFIX = ".owner"
ORPHAN_AGE_S = 60.0  # a build dir without an owner file (cut before writing it) older than this
_ACTIVE_TMP = re.compile(r"^\.ACTIVE\.(\d+)\.tmp$")


def owner_token() -> str:
    """This process as an owner: "<host>:<pid>"."""
    return f"{socket.gethostname()}:{os.getpid()}"


def is_dead_here(token: str) -> bool:
    """Whether `token` names a process of this host that no longer runs (False for another
    host's, whose processes this host cannot see)."""
    host, _, pid = token.rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and not _alive(int(pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_file(build_dir: Path) -> Path:
    """Where a build dir's owner is recorded: beside it, so that the dir holds only what its
    manifest lists."""
    return build_dir.with_name(build_dir.name + OWNER_SUFFIX)


def mark_owner(build_dir: Path) -> None:
    """Record this process as the owner of a build dir it has just made."""
    owner_file(build_dir).write_text(owner_token())


def release_owner(build_dir: Path) -> None:
    """Forget a build dir's owner (the dir is published or removed)."""
    owner_file(build_dir).unlink(missing_ok=True)


def remove_debris(modality_dir: Path) -> list[str]:
    """Remove the build dirs (with their owner files) and pointer temp files that dead jobs of
    this host left in a modality dir; returns their names."""
    if not modality_dir.is_dir():
        return []
    removed = []
    for path in modality_dir.iterdir():
        if path.is_dir() and path.name.startswith(".tmp-") and _abandoned(path):
            shutil.rmtree(path, ignore_errors=True)
            release_owner(path)
            removed.append(path.name)
        elif path.name.endswith(OWNER_SUFFIX) and not path.with_name(path.stem).exists():
            path.unlink(missing_ok=True)  # its dir is gone: the job died between the two
        elif (match := _ACTIVE_TMP.match(path.name)) and not _alive(int(match.group(1))):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return sorted(removed)


def _abandoned(build_dir: Path) -> bool:
    owner = owner_file(build_dir)
    if owner.is_file():
        return is_dead_here(owner.read_text().strip())
    return time.time() - build_dir.stat().st_mtime > ORPHAN_AGE_S
