"""Does a caption's learned log-det follow what the `spread` objective asks of it? (val split)

The spread objective (models.objectives.regularizers.partner_spread_loss) makes a caption's
variance the spread of its plausible images' means, counted over the images of the training
batch. This measures, on the val split of a clip-art dataset, the Spearman correlation with
ln(#plausible images) of:

- the caption's learned log-det (what the model serves);
- the same objective's target computed over the whole val gallery: sum over dims of
  ln(variance of the plausible images' means + SPREAD_FLOOR), the floor alone for a caption
  with one plausible image;
- the total variance of those means (the trace, without the log).

If the whole-gallery target follows ambiguity but the learned log-det does not, the objective
asks for the right thing and the training does not deliver it (one plausible image in a batch
of 128 drawn from thousands leaves most captions at the floor). Also: the learned log-det's
correlation counting each distinct caption text once (clip art repeats its texts).

    python benchmarks/spread_target.py --data D --model-dir M [--model-dir M2 ...] --out F
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.datasets.records import load_dataset, plausible_match_matrix
from models.evaluation.evaluate import EvalConfig, embed_split
from models.objectives.regularizers import SPREAD_FLOOR, spread_target


def gallery_targets(image_mu: np.ndarray, plausible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per caption (rows of plausible (C, I)): the spread objective's log-det target over the
    whole gallery, and the trace of its plausible images' covariance (the target without the
    floor)."""
    target = spread_target(
        torch.from_numpy(image_mu).double(), torch.from_numpy(plausible.T).double()
    ).numpy()  # (C, D)
    return np.log(target).sum(axis=1), (target - SPREAD_FLOOR).sum(axis=1)


def rank_correlation(x: np.ndarray, y: np.ndarray) -> float:
    return float(spearmanr(x, y).correlation)


def model_row(model_dir: Path, dataset, plausible: np.ndarray, first: np.ndarray) -> str:
    """One table row: the model's Spearman figures against ln(#plausible)."""
    split = embed_split(model_dir, dataset, EvalConfig(mc_samples=0))
    ambiguity = np.log(np.maximum(plausible.sum(axis=1), 1))
    learned = split.captions.logvar.sum(axis=1)
    target, trace = gallery_targets(split.images.mu, plausible)
    cells = [
        rank_correlation(learned, ambiguity),
        rank_correlation(learned[first], ambiguity[first]),
        rank_correlation(target, ambiguity),
        rank_correlation(trace, ambiguity),
        rank_correlation(learned, target),
    ]
    return f"| {model_dir} | " + " | ".join(f"{c:+.2f}" for c in cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a clip-art dataset dir")
    parser.add_argument("--model-dir", type=Path, action="append", required=True)
    parser.add_argument("--split", default="val")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/spread_target.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    started, load = time.perf_counter(), os.getloadavg()[0]
    dataset = load_dataset(args.data, args.split)
    plausible = plausible_match_matrix(dataset.captions, dataset.images)  # (C, I)
    texts = [c.text for c in dataset.captions]
    first = np.unique(texts, return_index=True)[1]
    rows = [model_row(m, dataset, plausible, first) for m in args.model_dir]
    counts = plausible.sum(axis=1)
    lines = [
        "# Caption log-det against the spread objective's target",
        "",
        f"Command: `python {' '.join(sys.argv)}`; machine: "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load (1 min) "
        f"{load:.1f} at start, {os.getloadavg()[0]:.1f} at end; wall time "
        f"{(time.perf_counter() - started) / 60:.1f} min.",
        "",
        f"{args.split} split: {len(texts)} captions, {len(first)} distinct texts; plausible "
        f"images per caption: median {np.median(counts):.0f}, max {counts.max()}.",
        "Spearman with ln(#plausible images) unless said (positive: vaguer captions get more).",
        "",
        "| model | learned log-det | same, each text once | whole-gallery spread target "
        "| trace of that spread | learned log-det vs target |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
