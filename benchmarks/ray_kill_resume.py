"""Kill check of `reindex --engine ray`: five SIGKILLs at random points, then a rerun.

After each kill: the active version is unchanged and how many of the command's Ray processes
are still alive 10 s later. Then the rerun must complete and equal the --engine local version.

    python benchmarks/ray_kill_resume.py --out benchmarks/results/ray_kill_resume.md
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from indexer.registry import ActiveRegistry
from indexer.store import open_version
from models.datasets.records import load_dataset
from models.datasets.shapes import generate_shapes
from models.networks.model_config import VOCAB_FILE, ModelConfig
from models.networks.probabilistic_model import ProbabilisticModel
from models.networks.tokenizer import Tokenizer
from models.onnx.export import export_encoders

REPO = Path(__file__).resolve().parents[1]
IMAGES, CHUNK_ITEMS, KILLS = 400, 8, 5
TABLE = (
    "| kill | chunks before | killed after | chunks after | active | versions"
    " | Ray processes left |"
)


def make_model(out: Path, shapes: Path) -> Path:
    """A gcie model dir with seeded random weights (the engines only need a real encoder)."""
    out.mkdir()
    tokenizer = Tokenizer.build(c.text for c in load_dataset(shapes).captions)
    config = ModelConfig(model_type="gcie", embed_dim=8, vocab_size=len(tokenizer), name="rand")
    torch.manual_seed(0)
    config.save(out)
    tokenizer.save(out / VOCAB_FILE)
    export_encoders(ProbabilisticModel(config).eval(), out, verify=False)
    return out


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (read from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="ray-kill-"))
    shapes = generate_shapes(tmp / "shapes", IMAGES, seed=0, workers=1, progress=False)
    model = make_model(tmp / "model", shapes)
    root = tmp / "indexes"
    base = ["reindex", "--modality", "image", "--source", str(shapes), "--model", str(model),
            "--index-root", str(root), "--index-type", "flat", "--metrics", "w2,kl",
            "--chunk-items", str(CHUNK_ITEMS), "--batch-size", str(CHUNK_ITEMS),
            "--activate"]  # fmt: skip
    cli = [sys.executable, "-c", "from indexer.cli import app; app()"]
    subprocess.run([*cli, *base, "--engine", "local"], cwd=REPO, check=True, capture_output=True)
    registry = ActiveRegistry(root, None)
    old = registry.active_version("image")
    for chunk in (root / "image" / ".work").glob("*/chunk-*.npz"):
        chunk.unlink()  # the local run cleans up anyway; start the Ray runs from nothing
    total_chunks = -(-IMAGES // CHUNK_ITEMS)
    ray_run = [*cli, *base, "--engine", "ray", "--ray-workers", "2"]
    lines = [f"seed {seed}; {IMAGES} images in {total_chunks} chunks of {CHUNK_ITEMS}", "",
             TABLE,
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for kill in range(1, KILLS + 1):
        chunks = lambda: len(list((root / "image" / ".work").glob("*/chunk-*.npz")))  # noqa: E731
        before = chunks()
        target = rng.randint(before, total_chunks)
        job = subprocess.Popen(
            ray_run, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        started = time.monotonic()
        family: set[int] = set()
        while job.poll() is None and chunks() < target:
            family |= descendants(job.pid)
            time.sleep(0.01)
        family |= descendants(job.pid)
        finished = job.poll() is not None
        job.send_signal(signal.SIGKILL)
        job.wait()
        killed_after = time.monotonic() - started
        time.sleep(10)  # give Ray's processes the time to notice their driver is gone
        left = alive(family)
        active = "unchanged" if registry.active_version("image") == old else "CHANGED"
        lines.append(
            f"| {kill} | {before} | {'(finished first) ' if finished else ''}{killed_after:.1f} s"
            f" (target {target}) | {chunks()} | {active}"
            f" | {len(registry.versions('image'))} | {len(left)} |"
        )  # fmt: skip
        print(lines[-1], flush=True)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    rerun = subprocess.run(ray_run, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - started
    new = registry.active_version("image")
    local, on_ray = (
        open_version(root / "image" / old),
        open_version(root / "image" / new, verify=True),
    )
    same_ids = local.metadata(range(IMAGES)) == on_ray.metadata(range(IMAGES))
    gap = float(np.abs(np.asarray(local.mu) - np.asarray(on_ray.mu)).max())
    want = local.shortlist("kl", np.asarray(local.mu), np.asarray(local.logvar), 10)
    got = on_ray.shortlist("kl", np.asarray(local.mu), np.asarray(local.logvar), 10)
    lines += ["", f"rerun: exit {rerun.returncode} in {wall:.1f} s; "
              + rerun.stdout.strip().splitlines()[0 if rerun.returncode else -2][-120:],
              f"rerun activated {new} (was {old}); same ids in order: {same_ids}; max |mu gap| vs"
              f" the local version: {gap:.1e}; kl top-10 of all {IMAGES} items equal:"
              f" {np.array_equal(got, want)}"]  # fmt: skip
    print("\n".join(lines[-2:]))
    header = [f"# {__doc__.splitlines()[0]}", "", "```",
              f"python benchmarks/{Path(__file__).name} --out {args.out}", "```", "",
              f"Machine: {os.cpu_count()} CPUs, shared with other jobs; load average"
              f" {os.getloadavg()[0]:.1f} at the end.", ""]  # fmt: skip
    args.out.write_text("\n".join(header + lines) + "\n")


if __name__ == "__main__":
    main()
