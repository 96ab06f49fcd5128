"""What the held-out, several-seed benchmarks share (outlier_ranking.py, reject_rule.py): their
command line, the dataset and photographs they train and read on, and the mean ± sd cells."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

from models.datasets.photos import write_photos
from models.datasets.shapes import generate_shapes

ROOT = Path(__file__).resolve().parents[1]


def parse_args(doc: str, name: str, data_seed: int) -> argparse.Namespace:
    """The flags of benchmarks/<name>.py; `args.command` is the line that reproduces the run."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--data-seed", type=int, default=data_seed)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / name)
    parser.add_argument("--out", type=Path, default=ROOT / f"benchmarks/results/{name}.md")
    args = parser.parse_args()
    args.command = " ".join([f".venv/bin/python benchmarks/{name}.py", *sys.argv[1:]])
    return args


def prepare(args: argparse.Namespace) -> list[int]:
    """Write the shapes dataset (once) and the photographs under the work dir; the seeds."""
    if not (args.work_dir / "data" / "dataset.json").is_file():
        generate_shapes(args.work_dir / "data", args.images, seed=args.data_seed, overwrite=True)
    write_photos(args.work_dir / "photos")
    return [int(s) for s in args.seeds.split(",")]


def header(args: argparse.Namespace, title: str, seconds: float) -> list[str]:
    """The title and the line naming the command, machine, load and wall time."""
    return [
        f"# {title}",
        "",
        f"Command: `{args.command}`; machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, load (1 min) {os.getloadavg()[0]:.1f}; wall time "
        f"{seconds / 60:.1f} min.",
    ]


def mean_sd(values: list[float]) -> str:
    """'mean ± sd' over the seeds (sd 0 for one seed)."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3g} ± {sd:.2g}"
