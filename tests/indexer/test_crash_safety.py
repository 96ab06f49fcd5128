"""A reindex killed with kill -9 leaves nothing that blocks or litters the next one: the Redis
publish lock of a dead owner is broken at once, a live one's lease is renewed, and the build
dirs and pointer temp files of dead jobs are removed by the next reindex and by `index gc`."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from indexer.cli import app
from indexer.job_owner import owner_file, remove_debris
from indexer.registry import ActiveRegistry, PublishLockedError, namespace_of, publish_lock_key

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def dead_pid() -> int:
    """The pid of a process that has exited."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_only_the_leftovers_of_dead_jobs_of_this_host_are_removed(tmp_path) -> None:
    here, gone = socket.gethostname(), dead_pid()
    owners = {".tmp-dead": f"{here}:{gone}", ".tmp-live": f"{here}:{os.getpid()}",
              ".tmp-elsewhere": f"another-host:{gone}"}  # fmt: skip
    for name, owner in owners.items():
        (tmp_path / name).mkdir()
        owner_file(tmp_path / name).write_text(owner)
    (tmp_path / ".tmp-fresh").mkdir()  # no owner file yet: a job that has just made it
    old = tmp_path / ".tmp-orphan"
    old.mkdir()
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    (tmp_path / f".ACTIVE.{gone}.tmp").write_text("v1\n")
    (tmp_path / f".ACTIVE.{os.getpid()}.tmp").write_text("v1\n")
    assert remove_debris(tmp_path) == sorted([".tmp-dead", ".tmp-orphan", f".ACTIVE.{gone}.tmp"])
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".owner"))
    assert not (tmp_path / ".tmp-dead.owner").exists()
    assert left == sorted(
        [".tmp-elsewhere", ".tmp-fresh", ".tmp-live", f".ACTIVE.{os.getpid()}.tmp"]
    )


def test_a_lock_whose_owner_is_dead_is_broken_and_a_live_ones_is_not(tmp_path, redis_url) -> None:
    client = redis.Redis.from_url(redis_url)
    key = publish_lock_key(namespace_of(tmp_path), "text")
    registry = ActiveRegistry(tmp_path, redis_url)
    client.set(key, f"{socket.gethostname()}:{dead_pid()}", ex=120)
    with registry.publish_lock("text"):
        assert client.get(key).decode() == f"{socket.gethostname()}:{os.getpid()}"
    assert client.get(key) is None
    for live in (f"{socket.gethostname()}:{os.getpid()}", f"another-host:{dead_pid()}"):
        client.set(key, live, ex=120)
        with pytest.raises(PublishLockedError), registry.publish_lock("text"):
            pass
        assert client.get(key).decode() == live
    client.delete(key)


def test_the_lease_is_renewed_while_held(tmp_path, redis_url) -> None:
    client = redis.Redis.from_url(redis_url)
    with ActiveRegistry(tmp_path, redis_url).publish_lock("image", timeout_s=0.6):
        time.sleep(1.5)  # more than twice the lease: only renewals keep it
        assert client.pttl(publish_lock_key(namespace_of(tmp_path), "image")) > 0


KILLED_INSIDE_THE_LOCK = """
import os, signal, sys
from indexer.registry import ActiveRegistry
with ActiveRegistry(sys.argv[1], sys.argv[2]).publish_lock("image"):
    print("locked", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_reindex_right_after_a_kill_inside_the_lock_succeeds(
    tmp_path, redis_url, small_shapes, random_model
) -> None:
    """A job is killed holding the publish lock, another leaves a build dir and a pointer temp
    file: the rerun publishes at once and leaves no temp dir or file behind."""
    root = tmp_path / "index"
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_INSIDE_THE_LOCK, str(root), redis_url],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL and killed.stdout.strip() == "locked"
    lock_key = publish_lock_key(namespace_of(root), "image")
    assert redis.Redis.from_url(redis_url).get(lock_key) is not None
    gone = dead_pid()
    build = root / "image" / ".tmp-20260101T000000000000Z-deadbeef"
    build.mkdir(parents=True)
    owner_file(build).write_text(f"{socket.gethostname()}:{gone}")
    (root / "image" / f".ACTIVE.{gone}.tmp").write_text("stale\n")
    args = ["reindex", "--modality", "image", "--source", str(small_shapes), "--model",
            str(random_model), "--index-root", str(root), "--index-type", "flat", "--activate",
            "--redis-url", redis_url]  # fmt: skip
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert ActiveRegistry(root, redis_url).active_version("image") is not None
    assert [
        p.name for p in (root / "image").iterdir() if p.name.startswith((".tmp", ".ACTIVE"))
    ] == []


def test_index_gc_removes_what_dead_jobs_left(tmp_path) -> None:
    gone = dead_pid()
    build = tmp_path / "text" / ".tmp-v9"
    build.mkdir(parents=True)
    owner_file(build).write_text(f"{socket.gethostname()}:{gone}")
    (tmp_path / "text" / f".ACTIVE.{gone}.tmp").write_text("v9\n")
    args = ["index", "gc", "--modality", "text", "--index-root", str(tmp_path)]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"removed what dead jobs left: .ACTIVE.{gone}.tmp, .tmp-v9" in result.output
    assert list((tmp_path / "text").iterdir()) == []
