"""Reindex throughput: --engine local against --engine ray with 1 and 2 encoder actors.

On one image gallery: wall time of the whole command (Ray start-up, embedding, FAISS build,
verification, publish) and items/s, each run from an empty work dir. By default a shapes
gallery and a random-weight small model; with --model and --source, a trained model (e.g. the
clip-art demo's, on pretrained backbones) and a dataset split.

    python benchmarks/ray_reindex.py --images 20000 --out benchmarks/results/ray_reindex.md
    python benchmarks/ray_reindex.py --model .cache/demo/model --source .cache/demo/data \
        --split test --out benchmarks/results/ray_reindex_clipart.md
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ray_kill_resume import REPO, make_model

from models.datasets.records import load_dataset
from models.datasets.shapes import generate_shapes
from models.networks.model_config import ModelConfig
from models.onnx import ENCODE_BATCH

RUNS = {  # name -> extra reindex flags
    "local (1 process, the batch budget: half the CPUs)": ["--engine", "local"],
    "ray, 1 actor x 1 thread": ["--engine", "ray", "--ray-workers", "1", "--ray-threads", "1"],
    "ray, 2 actors x 1 thread": ["--engine", "ray", "--ray-workers", "2", "--ray-threads", "1"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--chunk-items", type=int, default=1024)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", type=Path, help="a trained model dir (with --source)")
    parser.add_argument("--source", type=Path, help="a dataset dir to index (with --model)")
    parser.add_argument("--split", default="", help="the split of --source to index")
    args = parser.parse_args()
    if (args.model is None) != (args.source is None):
        parser.error("--model and --source go together")
    tmp = Path(tempfile.mkdtemp(prefix="ray-bench-"))
    started = time.monotonic()
    if args.model is None:
        source = generate_shapes(tmp / "shapes", args.images, seed=0, workers=1, progress=False)
        model = make_model(tmp / "model", source)
        described = "random-weight gcie encoder, D = 8"
    else:
        source, model = args.source.resolve(), args.model.resolve()
        args.images = sum(1 for _ in _images(source, args.split))
        described = f"model {args.model} ({ModelConfig.load(model).name}), {args.source}"
        described += f" split {args.split}" if args.split else ""
    print(f"gallery and model in {time.monotonic() - started:.0f} s", flush=True)
    cli = [sys.executable, "-c", "from indexer.cli import app; app()", "reindex",
           "--modality", "image", "--source", str(source), "--model", str(model),
           "--index-type", "flat", "--chunk-items", str(args.chunk_items)]  # fmt: skip
    cli += ["--split", args.split] if args.split else []
    rows = []
    for number, (name, flags) in enumerate(RUNS.items()):
        command = [*cli, "--index-root", str(tmp / f"indexes-{number}"), *flags]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
        wall = float(re.search(r"in ([0-9.]+) s wall time", done.stdout).group(1))
        rows.append(f"| {name} | {args.images} | {wall:.1f} | {args.images / wall:.0f} |")
        print(rows[-1], flush=True)
    lines = [f"# {__doc__.splitlines()[0]}", "", "```",
             f"python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}",
             "```", "", f"Machine: {os.cpu_count()} CPUs shared with other jobs (load average"
             f" {os.getloadavg()[0]:.1f} at the end); {described};"
             f" chunks of {args.chunk_items} images, batches of {ENCODE_BATCH}.", "",
             "| engine | images | wall s | images/s |", "| --- | --- | --- | --- |",
             *rows]  # fmt: skip
    args.out.write_text("\n".join(lines) + "\n")


def _images(source: Path, split: str):
    """The dataset's image records of `split` (all of them for "")."""
    return load_dataset(source, split or None).images


if __name__ == "__main__":
    main()
