"""Could a head trained to predict a wrong answer beat the distance of the means? A probe on val.

Issue 39 asks for a reject score above the best training-free baseline; on clip art the
learned scores of the demo's heads do not beat the top-1 distance of the means
(benchmarks/results/reject_means_clipart.md). ConfidNet (Corbiere et al., 2019) beats a
classifier's top-1 probability by regressing the probability of the true class on the
training set. Its retrieval analogue, per direction and model dir (one training seed each):
each training query's true-match probability, the softmax (cosine of the means / T) mass on
its plausible matches over the training gallery, is regressed (ridge) on the first principal
components of its backbone vector; on val the prediction (low = less sure) is read alone and
beside the means' top-1 distance, the pair fitted on one half of val and read on the other
(benchmarks/reject_combination.cross_fitted). Nothing here reads the test split.

    python benchmarks/confidence_probe.py --data runs/reject_means/data \\
        --models runs/reject_means/models/gcie-count-qm-pc/seed0,...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.reject_combination import (
    DIRECTIONS,
    cross_fitted,
    mean_sd,
    nauprc,
    run_line,
    run_models,
    scored,
)
from models.backbones.feature_cache import split_features
from models.backbones.registry import load_backbone
from models.datasets.records import load_dataset, plausible_match_matrix
from models.evaluation.evaluate import EvalConfig, embed_split
from models.networks.model_config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
ROWS = ("top-1 distance of the means", "predicted true-match probability", "both, cross-fitted")


def true_match_probability(
    queries: np.ndarray, gallery: np.ndarray, plausible: np.ndarray, temperature: float
) -> np.ndarray:
    """(Q,) the softmax mass of cos(query, item) / T over the gallery on the plausible items;
    queries (Q, D) and gallery (G, D) unit means, plausible (Q, G) bool."""
    logits = torch.from_numpy(queries).double() @ torch.from_numpy(gallery).double().T
    return (torch.softmax(logits / temperature, dim=1).numpy() * plausible).sum(axis=1)


def ridge_predictor(features: np.ndarray, target: np.ndarray, components: int, ridge: float):
    """A function of features (N, F) -> (N,) prediction of `target`: ridge regression on the
    standardised first `components` principal components of the training `features`."""
    centre = features.mean(axis=0)
    basis = np.linalg.svd(features - centre, full_matrices=False)[2][:components].T  # (F, k)
    projected = (features - centre) @ basis
    scale_centre, scale = projected.mean(axis=0), projected.std(axis=0) + 1e-12
    z = (projected - scale_centre) / scale
    beta = np.linalg.solve(z.T @ z + ridge * np.eye(z.shape[1]), z.T @ (target - target.mean()))
    return lambda x: (((x - centre) @ basis - scale_centre) / scale) @ beta + target.mean()


def cached_features(dataset, split: str, kind: str, backbone: str) -> np.ndarray:
    """float64 (N, F) backbone vectors of a split's images or captions in the dataset's order,
    from the cache training left beside the dataset (never computed here)."""

    def missing(_: list) -> np.ndarray:
        raise SystemExit(f"no cached {backbone} features of the {split} {kind}s: train first")

    key = load_backbone(backbone, kind).key
    return split_features(dataset, split, kind, key, missing)[1].astype(np.float64)


def training_target(embedded, plausible: np.ndarray, captions: bool, temperature: float):
    """ln of each training query's true-match probability (captions or images as queries)."""
    if captions:
        queries, gallery = embedded.captions.mu, embedded.images.mu
    else:
        queries, gallery, plausible = embedded.images.mu, embedded.captions.mu, plausible.T
    probability = true_match_probability(queries, gallery, plausible, temperature)
    return np.log(np.clip(probability, 1e-6, 1.0))


def one_model(model_dir: Path, data: Path, seed: int, args: argparse.Namespace) -> dict:
    """direction -> row -> val nAUPRC."""
    config = ModelConfig.load(model_dir)
    dataset = load_dataset(data)
    train = dataset.split("train")
    embedded = embed_split(model_dir, train, EvalConfig(mc_samples=0, seed=seed))
    plausible = plausible_match_matrix(train.captions, train.images)  # (C, I)
    val = scored(model_dir, data, "val", seed)
    result = {}
    for direction in DIRECTIONS:
        captions = direction == "t2i"
        target = training_target(embedded, plausible, captions, args.temperature)
        backbone = config.text_backbone if captions else config.image_backbone
        kind = "text" if captions else "image"
        train_features = cached_features(dataset, "train", kind, backbone)
        predict = ridge_predictor(train_features, target, args.components, args.ridge)
        scores, correct = val[direction]
        confidence = -predict(cached_features(dataset, "val", kind, backbone))
        scores = {**scores, "confidence": confidence}
        result[direction] = dict(zip(ROWS, (
            nauprc(scores["top1_mean_distance"], correct),
            nauprc(scores["confidence"], correct),
            cross_fitted(["top1_mean_distance", "confidence"], scores, correct, seed),
        ), strict=True))  # fmt: skip
    return result


def render(args: argparse.Namespace, runs: list[dict], seconds: float) -> str:
    lines = [
        "# A head trained to predict a wrong answer, against the distance of the means (val)",
        "",
        f"{run_line(args, seconds)}; {args.components} principal components, ridge "
        f"{args.ridge}, T {args.temperature}.",
        "",
        "Val nAUPRC (0 chance, 1 oracle) of refusing a wrong first answer, mean ± sd over the "
        "models (one training seed each). The prediction is fitted on the training split; "
        "'both' is fitted on one half of val and read on the other, both ways, averaged over "
        "random halvings.",
    ]
    for direction in DIRECTIONS:
        lines += ["", f"## {direction}", "", "| reject score | val nAUPRC |", "| --- | --- |"]
        lines += [f"| {row} | {mean_sd([r[direction][row] for r in runs])} |" for row in ROWS]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help="comma-separated model dirs")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--components", type=int, default=64)
    parser.add_argument("--ridge", type=float, default=10.0)
    parser.add_argument("--temperature", type=float, default=0.1, help="the heads' InfoNCE T")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/confidence_probe_val.md"
    )
    args = parser.parse_args()
    run_models(args, "confidence_probe.py",
               lambda model, seed: one_model(model, args.data, seed, args), render)  # fmt: skip


if __name__ == "__main__":
    main()
