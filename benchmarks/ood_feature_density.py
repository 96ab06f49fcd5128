"""Can feature density tell real photographs from shapes images? The classic dataset-shift
detectors (Mahalanobis distance to the training features, Lee et al. 2018; mean distance to
the k nearest training features) on the demo recipe's embeddings (mu, logvar) and on the CNN
trunk's features, against the image log-det. Writes AUROC (1 = every photograph more
atypical than every shapes test image) to --out.

    python benchmarks/ood_feature_density.py --model-dir M --data D --photos P --out F

M: a model trained on D (e.g. benchmarks/heldout_check.py's, shapes seed 7); P: the output of
`probsearch data photos`.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.datasets.records import load_dataset
from models.evaluation.rejection_metrics import auroc
from models.networks.preprocess import images_to_array, load_image
from models.networks.probabilistic_model import load_model
from models.onnx.encoder_runtime import Embeddings, OnnxEncoder

Features = dict[str, np.ndarray]  # train, test, photos


def mahalanobis(reference: np.ndarray, x: np.ndarray, ridge: float = 1e-3) -> np.ndarray:
    """Squared Mahalanobis distance of each row of x to the reference rows' Gaussian fit."""
    mean = reference.mean(0)
    covariance = np.cov(reference, rowvar=False) + ridge * np.eye(reference.shape[1])
    d = x - mean
    return np.einsum("ij,jk,ik->i", d, np.linalg.inv(covariance), d)


def knn_distance(reference: np.ndarray, x: np.ndarray, k: int = 5) -> np.ndarray:
    """Mean squared distance of each row of x to its k nearest reference rows."""
    squared = ((x[:, None, :] - reference[None]) ** 2).sum(-1)
    return np.sort(squared, axis=1)[:, :k].mean(1)


def trunk_features(model_dir: Path, images: list) -> np.ndarray:
    """The image encoder's trunk features, what its Gaussian heads read (the pooled grid plus,
    with "objects" pooling, the per-cell object detectors), no dropout."""
    model = load_model(model_dir)
    encoder = model.image_encoder
    out = []
    with torch.no_grad():
        for start in range(0, len(images), 256):
            x = torch.from_numpy(images_to_array(images[start : start + 256], model.config))
            for block in encoder.blocks:
                x = block(x)
            features = encoder.project(x)
            if encoder.objects is not None:
                features = features + encoder.objects(x)
            out.append(features.numpy())
    return np.concatenate(out)


def rows(features: Features, name: str) -> list[str]:
    cells = []
    for score in (mahalanobis, knn_distance):
        in_dist = score(features["train"], features["test"])
        shifted = score(features["train"], features["photos"])
        cells.append(f"{auroc(in_dist, shifted):.3f}")
    return [f"| {name} | " + " | ".join(cells) + " |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--model-dir", "--data", "--photos", "--out"):
        parser.add_argument(flag, type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    images = {
        split: [load_image(r.path) for r in load_dataset(args.data, split).images]
        for split in ("train", "test")
    }
    images["photos"] = [load_image(p) for p in sorted(args.photos.glob("*.png"))]
    encoder = OnnxEncoder(args.model_dir, "image", device="cpu")
    embedded: dict[str, Embeddings] = {k: encoder.encode_images(v) for k, v in images.items()}
    views: dict[str, Callable[[Embeddings], np.ndarray]] = {
        "embedding mu": lambda e: e.mu,
        "embedding logvar": lambda e: e.logvar,
        "embedding mu and logvar": lambda e: np.concatenate([e.mu, e.logvar], 1),
    }
    table = [r for name, view in views.items()
             for r in rows({k: view(e) for k, e in embedded.items()}, name)]  # fmt: skip
    trunk = {k: trunk_features(args.model_dir, v) for k, v in images.items()}
    table += rows(trunk, "CNN trunk features")
    log_det = auroc(embedded["test"].logvar.sum(1), embedded["photos"].logvar.sum(1))
    lines = [
        "# Dataset shift by feature density: photographs against shapes images",
        "",
        f"Command: `python benchmarks/ood_feature_density.py --model-dir {args.model_dir} "
        f"--data {args.data} --photos {args.photos} --out {args.out}`; machine: "
        f"{platform.machine()}, {os.cpu_count()} CPUs; load (1 min) {os.getloadavg()[0]:.1f}.",
        f"Reference: the {len(images['train'])} training images' features; in-distribution: "
        f"the {len(images['test'])} test images; shifted: {len(images['photos'])} photographs. "
        "AUROC: 1 = every photograph scores as more atypical than every test image, "
        "0.5 = chance, below 0.5 = the photographs look more typical.",
        "",
        "| features | Mahalanobis AUROC | 5-NN distance AUROC |",
        "| --- | --- | --- |",
        *table,
        "",
        f"Image log-det for comparison: AUROC {log_det:.3f}.",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out.read_text())


if __name__ == "__main__":
    main()
