"""Backbone features per second for each layout of the CPUs: ONNX Runtime threads per runner x
batches encoded at once (models.backbones.feature_cache.split_features' workers), on an idle
machine and beside a busy process. The measurement behind models.threads.concurrent_batches
for batch commands. Writes a Markdown table to --out.

    python benchmarks/feature_workers.py --data .cache/demo/data
    python benchmarks/feature_workers.py --data D --images 320 --captions 1024 --rounds 1

Each cell runs split_features on the first --images images and --captions captions of the
train split (a copy of the records whose cache goes to a temporary folder), with the shipped
backbones exported once per thread count. Cells alternate within a round, so a drift of the
shared machine reaches every layout alike; a figure is the median over the rounds. "busy": one
pure-Python busy loop beside the cell, as another user's job would be.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from result_header import ROOT, result_header

# isort: split
# torch after result_header: its OpenMP reads OMP_WAIT_POLICY, which that import sets, on load.
import torch

from models.backbones.feature_cache import split_features
from models.backbones.registry import load_backbone
from models.datasets.records import PairedDataset, load_dataset

LAYOUTS = ((1, 1), (1, 2), (2, 1))  # (threads per runner, batches at once)


def sample(data: Path, images: int, captions: int, root: Path) -> PairedDataset:
    """The first images and captions of the train split, cached under `root`."""
    train = load_dataset(data).split("train")
    return replace(
        train, root=root, images=train.images[:images], captions=train.captions[:captions]
    )


def per_second(dataset: PairedDataset, kind: str, runner, workers: int, key: str) -> float:
    """Items per second of one split_features call that computes every feature."""
    start = time.perf_counter()
    ids, _ = split_features(dataset, "train", kind, key, runner, workers=workers)
    return len(ids) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a clip-art dataset directory")
    parser.add_argument("--images", type=int, default=640)
    parser.add_argument("--captions", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/feature_workers.md")
    args = parser.parse_args()
    started, load = time.perf_counter(), os.getloadavg()
    torch.set_num_threads(1)
    backbones = {kind: load_backbone(name, kind) for kind, name in
                 (("image", "efficientnet-lite0"), ("text", "all-minilm-l6-v2"))}  # fmt: skip
    runners = {(kind, t): b.onnx_runner(t) for kind, b in backbones.items() for t in (1, 2)}
    figures: dict[tuple, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="feature-workers-") as folder:
        dataset = sample(args.data, args.images, args.captions, Path(folder))
        for machine in ("idle", "busy"):
            loop = None
            if machine == "busy":
                loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                for round_ in range(args.rounds):
                    for threads, workers in LAYOUTS[round_ % 3 :] + LAYOUTS[: round_ % 3]:
                        for kind in ("image", "text"):
                            key = f"{machine}-{round_}-{threads}-{workers}"
                            rate = per_second(dataset, kind, runners[kind, threads], workers, key)
                            figures.setdefault((machine, threads, workers, kind), []).append(rate)
                            print(machine, round_, threads, workers, kind, f"{rate:.1f}/s",
                                  flush=True)  # fmt: skip
            finally:
                if loop is not None:
                    loop.kill()
    write(args, figures, load, started)


def write(args: argparse.Namespace, figures: dict, load: tuple, started: float) -> None:
    title = "Backbone features per second: threads per runner x batches at once"
    lines = [
        *result_header(title, load, started),
        "",
        f"{args.images} train images and {args.captions} train captions of `{args.data}`, "
        f"batches of 32, median of {args.rounds} rounds (each round's figures in brackets).",
        "",
        "| machine | threads per runner | batches at once | images/s | captions/s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for machine in ("idle", "busy"):
        for threads, workers in LAYOUTS:
            cells = []
            for kind in ("image", "text"):
                rates = figures[machine, threads, workers, kind]
                each = ", ".join(f"{r:.1f}" for r in rates)
                cells.append(f"{statistics.median(rates):.1f} ({each})")
            lines.append(f"| {machine} | {threads} | {workers} | " + " | ".join(cells) + " |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
