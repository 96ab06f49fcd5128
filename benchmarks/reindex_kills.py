"""Issue 41's crash-safe reindex, measured: `probsearch reindex --activate` killed with kill -9
at 10 moments spread over its run, and once inside the publish lock (a process that takes the
lock and kills itself), each time followed at once by the same reindex. Reports whether each
rerun succeeded, how long it took, and what temporary files or directories were left after it
(.tmp-* build dirs, .ACTIVE.*.tmp pointer files, .work chunk dirs, owner files).

    python benchmarks/reindex_kills.py
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.service_bench_setup import provenance, redis_server

ROOT = Path(__file__).resolve().parents[1]
PROBSEARCH = [sys.executable, "-c", "from probsearch.cli import main; main()"]
MOMENTS = 10
INSIDE_THE_LOCK = """
import os, signal, sys
from indexer.registry import ActiveRegistry
with ActiveRegistry(sys.argv[1], sys.argv[2]).publish_lock("image"):
    os.kill(os.getpid(), signal.SIGKILL)
"""


def cli(*args: str | Path) -> list[str]:
    return [*PROBSEARCH, *map(str, args)]


def reindex_command(data: Path, model: Path, root: Path, redis_url: str) -> list[str]:
    return cli("reindex", "--modality", "image", "--source", data, "--model", model,
               "--index-root", root, "--index-type", "flat", "--activate",
               "--redis-url", redis_url)  # fmt: skip


def leftovers(root: Path) -> list[str]:
    """Temporary things under the image gallery's dir (the .work dir of chunks included)."""
    gallery = root / "image"
    names = [p.name for p in gallery.iterdir()] if gallery.is_dir() else []
    work = gallery / ".work"
    chunks = [f".work/{p.name}" for p in work.iterdir()] if work.is_dir() else []
    temporary = [n for n in names if n.startswith((".tmp-", ".ACTIVE.")) or n.endswith(".owner")]
    return sorted(temporary + chunks)


def first_run(command: list[str], env: dict[str, str], root: Path) -> tuple[float, float]:
    """A whole reindex: (seconds until it starts writing chunks, seconds in all). Before the
    first chunk it only imports and loads the model, so the kills are spread after it."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    work_at = None
    while process.poll() is None:
        if work_at is None and (root / "image" / ".work").exists():
            work_at = time.perf_counter() - started
        time.sleep(0.01)
    assert process.returncode == 0, "the first reindex failed"
    total = time.perf_counter() - started
    return (work_at if work_at is not None else 0.0), total


def _tmp(root: Path, name: str = "") -> bool:
    return (
        any((d / name).exists() for d in (root / "image").glob(".tmp-*"))
        if name
        else any((root / "image").glob(".tmp-*"))
    )


def _versions(root: Path) -> int:
    gallery = root / "image"
    return sum(1 for d in gallery.iterdir() if d.is_dir() and not d.name.startswith("."))


# Where a kill lands: the first moment each holds, polled every 5 ms while the job runs.
TRIGGERS: list[tuple[str, Callable[[Path, dict], bool]]] = [
    ("the work dir made", lambda root, was: (root / "image" / ".work").exists()),
    ("a chunk written", lambda root, was: any((root / "image" / ".work").rglob("chunk-*.npz"))),
    ("the build dir made", lambda root, was: _tmp(root)),
    ("mu.npy written", lambda root, was: _tmp(root, "mu.npy")),
    ("metadata written", lambda root, was: _tmp(root, "metadata.sqlite")),
    ("an index file written", lambda root, was: _tmp(root, "w2.faiss")),
    ("the manifest written", lambda root, was: _tmp(root, "manifest.json")),
    ("the version renamed in", lambda root, was: _versions(root) > was["versions"]),
    ("the ACTIVE file moved", lambda root, was: _active(root) != was["active"]),
    ("after it, cleaning up", lambda root, was: _active(root) != was["active"] and _later(was)),
]


def _active(root: Path) -> str:
    pointer = root / "image" / "ACTIVE"
    return pointer.read_text() if pointer.exists() else ""


def _later(was: dict) -> bool:
    """True 20 ms after first asked (the job's last steps after activation)."""
    was.setdefault("asked", time.monotonic())
    return time.monotonic() - was["asked"] > 0.02


def kill_when(
    command: list[str], env: dict[str, str], root: Path, reached: Callable[[Path, dict], bool]
) -> bool:
    """Start the reindex and SIGKILL it the moment `reached` holds; whether it was killed (a
    phase too short to see ends with the job finishing first)."""
    was = {"versions": _versions(root), "active": _active(root)}
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    while process.poll() is None:
        if reached(root, was):
            process.send_signal(signal.SIGKILL)
            process.wait()
            return True
        time.sleep(0.005)
    return False


def timed(command: list[str], env: dict[str, str]) -> tuple[int, float]:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
    return done.returncode, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                        "reindex_kills.md")  # fmt: skip
    args = parser.parse_args()
    command_line = " ".join([".venv/bin/python benchmarks/reindex_kills.py", *sys.argv[1:]])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBSEARCH_")}
    env["PYTHONPATH"] = str(ROOT)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as redis_url:
        work = Path(tmp)
        data, model, root = work / "shapes", work / "model", work / "indexes"
        subprocess.run(cli("data", "shapes", "--out", data, "--images", args.images),
                       env=env, cwd=ROOT, check=True, capture_output=True)  # fmt: skip
        subprocess.run(cli("train", "--data", data, "--out", model, "--epochs", "1",
                           "--no-progress"), env=env, cwd=ROOT, check=True,
                       capture_output=True)  # fmt: skip
        command = reindex_command(data, model, root, redis_url)
        work_at, full = first_run(command, env, root)
        for moment, reached in TRIGGERS:
            killed = kill_when(command, env, root, reached)
            left_by_kill = leftovers(root)
            code, rerun = timed(command, env)
            rows.append((moment if killed else f"{moment} (finished first)", len(left_by_kill),
                         code, rerun, leftovers(root)))  # fmt: skip
            print(rows[-1], flush=True)
        moment = "inside the publish lock"
        subprocess.run([sys.executable, "-c", INSIDE_THE_LOCK, str(root), redis_url],
                       env=env, cwd=ROOT, capture_output=True)  # fmt: skip
        left_by_kill = leftovers(root)
        code, rerun = timed(command, env)
        rows.append((moment, len(left_by_kill), code, rerun, leftovers(root)))
    lines = [
        "# kill -9 of a reindex, then the same reindex at once",
        "",
        f"{provenance(command_line)} "
        f"`probsearch reindex --modality image --activate` of a "
        f"{args.images}-image shapes dataset (all its splits) with a 1-epoch model, against a "
        f"Redis of its own; a whole run took {full:.1f} s, of which the first {work_at:.1f} s "
        "import and load the model before anything is written. Killed at 10 moments, each "
        "the first instant (polled every 5 ms) the job reached a step, then once inside the "
        "publish lock (a process that takes the lock and kills itself, leaving the Redis lock "
        "to its 120 s lease).",
        "",
        "| killed at | temporary things left by the kill | rerun exit | rerun s | left after "
        "the rerun |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| {moment} | {left} | {code} | {rerun:.1f} | {', '.join(after) or 'nothing'} |"
            for moment, left, code, rerun, after in rows
        ),
        "",
    ]
    args.out.write_text("\n".join(lines))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
