"""Does training the heads on augmented views of the training drawings help on unseen ones?

The heads on frozen backbones fit the 5,889 training drawings' backbone vectors and do not
carry over to unseen drawings (docs/pretrained.md: seen pairs reach t2i P@1 92, unseen 52).
This trains a run of model_comparison (by default the demo's heads, gcie-count-nce) with each
training drawing's vector drawn, every epoch, from K views of it: the drawing itself, its
mirror image, and random crops (each possibly mirrored); the val and test splits keep the
drawings as they are. The views' vectors are computed once with the image backbone and kept
in --work-dir. Figures are on the val split only (this script chooses; the test split is
read only by model_comparison); the same run without views is trained beside it, per seed.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/augmented_views_val.py \\
        --data .cache/demo/data --views 2,4 --seeds 0,1,2 --parallel 2
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import heads_val_sweep
from benchmarks.heads_val_sweep import FIGURES, cell, figure_digits, parse_variant
from benchmarks.model_comparison import PRETRAINED_RUNS, Run
from models.backbones.feature_cache import split_features
from models.backbones.registry import load_backbone
from models.datasets.records import load_dataset
from models.networks.preprocess import load_image
from models.threads import available_cpus
from models.training import train as train_module
from models.training.training_data import captioned_images

ROOT = Path(__file__).resolve().parents[1]
CROP_SCALE = (0.6, 1.0)  # share of the drawing's area a crop keeps
CROP_RATIO = (3 / 4, 4 / 3)


def augmented(image, rng: np.random.Generator, view: int):
    """View `view` of a PIL image: 0 itself, 1 its mirror, later ones a random crop (area
    CROP_SCALE of it, aspect CROP_RATIO), mirrored half the time."""
    from PIL import ImageOps

    if view == 0:
        return image
    if view == 1:
        return ImageOps.mirror(image)
    width, height = image.size
    area = width * height * rng.uniform(*CROP_SCALE)
    ratio = np.exp(rng.uniform(*np.log(CROP_RATIO)))
    w = round(min(width, np.sqrt(area * ratio)))
    h = round(min(height, np.sqrt(area / ratio)))
    left, top = rng.integers(0, width - w + 1), rng.integers(0, height - h + 1)
    crop = image.crop((int(left), int(top), int(left) + w, int(top) + h))
    return ImageOps.mirror(crop) if rng.random() < 0.5 else crop


def view_features(data: Path, views: int, work: Path) -> np.ndarray:
    """(views, N_train, dim) float32: each captioned training drawing's vector per view, in
    training's row order; computed once and kept in `work`."""
    path = work / f"views-{views}.npy"
    if path.is_file():
        return np.load(path)
    dataset = load_dataset(data)
    backbone = load_backbone(PRETRAINED_RUNS[0].model["image_backbone"], "image")
    ids, plain = split_features(dataset, "train", "image", backbone.key, backbone.encode)
    row_of = {image_id: row for row, image_id in enumerate(ids)}
    records = captioned_images(dataset.split("train"))
    out = np.empty((views, len(records), plain.shape[1]), np.float32)
    out[0] = plain[[row_of[r.id] for r in records]]
    encode = backbone.onnx_runner(available_cpus())
    for view in range(1, views):
        rng = np.random.default_rng([view, 20261128])
        for start in tqdm(range(0, len(records), 64), desc=f"view {view}"):
            batch = records[start : start + 64]
            images = [augmented(load_image(r.path).convert("RGB"), rng, view) for r in batch]
            out[view, start : start + len(batch)] = encode(images)
    work.mkdir(parents=True, exist_ok=True)
    np.save(path, out)
    return out


def _with_views(views: torch.Tensor, seed: int):
    """train_epoch, wrapped so that each epoch's training split holds, per drawing, the vector
    of one of its views drawn at random (seeded by the run's seed and the epoch)."""
    original = train_module.train_epoch

    def train_epoch(model, optimizer, split, config, epoch, *args, **kwargs):
        if split.num_images == views.shape[1]:
            rng = np.random.default_rng([seed, epoch, 7])
            pick = torch.from_numpy(rng.integers(0, views.shape[0], views.shape[1]))
            split = dataclasses.replace(split, pixels=views[pick, torch.arange(views.shape[1])])
        return original(model, optimizer, split, config, epoch, *args, **kwargs)

    return train_epoch


def run_seed(data: Path, out: Path, run: Run, seed: int, epochs: int, views_file: str) -> dict:
    """heads_val_sweep.run_seed, on the views in `views_file` ("": the drawings alone)."""
    patch = contextlib.nullcontext()
    if views_file:
        views = torch.from_numpy(np.load(views_file))
        patch = _patched(train_module, "train_epoch", _with_views(views, seed))
    with patch:
        return heads_val_sweep.run_seed(data, out, run, seed, epochs, {"views": views_file})


@contextlib.contextmanager
def _patched(module, name: str, value):
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--run", default="gcie-count-nce")
    parser.add_argument("--views", default="2,4", help="view counts to try, comma-separated")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "augmented_views")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/augmented_views_val.md"
    )
    args = parser.parse_args()
    run = parse_variant(args.run, PRETRAINED_RUNS)
    seeds = [int(s) for s in args.seeds.split(",")]
    load = os.getloadavg()[0]
    counts = [int(v) for v in args.views.split(",")]
    arms = [("plain", "")]
    for count in counts:
        view_features(args.data, count, args.work_dir)
        arms.append((f"views{count}", str(args.work_dir / f"views-{count}.npy")))
    jobs = {
        (label, seed): (
            args.data,
            args.work_dir / label / f"seed{seed}",
            run,
            seed,
            args.epochs,
            vf,
        )
        for label, vf in arms
        for seed in seeds
    }
    with ProcessPoolExecutor(args.parallel) as pool:
        futures = {key: pool.submit(run_seed, *job) for key, job in jobs.items()}
        results = {key: future.result() for key, future in futures.items()}
    lines = [
        "# Augmented views of the training drawings (val split)",
        "",
        f"Command: `{' '.join(sys.argv)}`; run {args.run}, seeds {args.seeds}, {args.epochs} "
        f"epochs; machine {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {load:.2f} at start, {os.getloadavg()[0]:.2f} at end.",
        "",
        "| training drawings | best epoch | " + " | ".join(FIGURES) + " |",
        "| --- | --- | " + " | ".join("---" for _ in FIGURES) + " |",
    ]
    for label, _ in arms:
        rows = [results[(label, seed)] for seed in seeds]
        cells = [cell([r["best_epoch"] for r in rows])] + [
            cell([r[f] for r in rows], figure_digits(f)) for f in FIGURES
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
