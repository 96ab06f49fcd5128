"""What an image query's first answer says, per ranking metric: is it true of the image, is it
the image's own caption, and how much does it name?

Plausible P@1 counts "a scene with a triangle" as a right answer for any image holding a
triangle, so a metric that ranks the vaguest true caption first wins it while telling the user
little. This prints, over the given model dirs (one per training seed), mean ± sd of: plausible
P@1, exact-pair R@1 and the attributes (shape, colour, size words) the first caption names,
against the mean over all captions of the split.

    .venv/bin/python benchmarks/answer_specificity.py --data runs/seeds11/data-s11-n3000 \\
        --split val --metrics w2,kl,elk runs/seeds11/models/<recipe>-seed{0,1,2}
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.datasets.records import attributes_named, load_dataset, plausible_match_matrix
from models.distance.gaussian import pairwise_distance
from models.evaluation.evaluate import EvalConfig, embed_split


def first_answers(model_dir: Path, dataset, metric: str) -> np.ndarray:
    """Row of the first caption for each image query, ranked with `metric` over the split."""
    split = embed_split(model_dir, dataset, EvalConfig(mc_samples=0))
    q, g = split.images, split.captions
    tensors = (torch.from_numpy(a) for a in (q.mu, q.logvar, g.mu, g.logvar))
    return pairwise_distance(metric, *tensors).argmin(1).numpy()


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.1f} ± {sd:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--split", default="val")
    parser.add_argument("--metrics", default="w2,kl,elk")
    parser.add_argument("models", type=Path, nargs="+")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dataset = load_dataset(args.data, args.split)
    plausible = plausible_match_matrix(dataset.captions, dataset.images).T  # (I, C)
    row_of = {image.id: row for row, image in enumerate(dataset.images)}
    own_image = np.array([row_of[c.image_id] for c in dataset.captions])
    named = np.array([attributes_named(c) for c in dataset.captions])
    queries = np.arange(len(dataset.images))
    print(f"Data `{args.data}`, split {args.split}; models {', '.join(map(str, args.models))}.")
    print(f"A caption of the split names {named.mean():.2f} attributes on average.\n")
    print("| metric | plausible P@1 | exact-pair R@1 | attributes the first caption names |")
    print("| --- | --- | --- | --- |")
    for metric in args.metrics.split(","):
        figures: list[list[float]] = [[], [], []]
        for model_dir in args.models:
            top = first_answers(model_dir, dataset, metric)
            figures[0].append(100 * float(plausible[queries, top].mean()))
            figures[1].append(100 * float((own_image[top] == queries).mean()))
            figures[2].append(float(named[top].mean()))
        print(f"| {metric} | " + " | ".join(mean_sd(f) for f in figures) + " |", flush=True)


if __name__ == "__main__":
    main()
