"""A caption bridge for drawings, tried on clip-art val: does a non-parametric second opinion add
to the trained heads?

A drawing's bridge vector is the mean MiniLM vector of the captions of its k nearest training
drawings (cosine of the centred EfficientNet vectors, softmax weights at `--temperature`), so
a drawing is compared with a caption in MiniLM's own space, where words the heads never learnt
still mean something. The script reads the heads of `--models` (one dir per seed, e.g. the
demo recipe trained by heads_val_sweep.py) and writes val P@1 in both directions for the heads'
cosine alone, the bridge alone, and their weighted sum (`--weight` on the bridge), mean ± sd
over the seeds. It also scores rejection: the top answer's distance under the heads against the
same plus the bridge's disagreement with that answer (normalised AUPRC). Test is not read.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/heads_val_sweep.py --data .cache/demo/data \\
        --parallel 2 --variant gcie-count-nce --work-dir runs/caption_bridge
    .venv/bin/python benchmarks/caption_bridge_val.py --data .cache/demo/data \\
        --models runs/caption_bridge/gcie-count-nce/seed{0,1,2} \\
        --out benchmarks/results/caption_bridge_val.md
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from heads_val_sweep import cell
from reject_combination import nauprc
from result_header import result_header, write_results

from models.backbones.feature_cache import split_features
from models.backbones.registry import load_backbone
from models.datasets.records import PairedDataset, load_dataset, plausible_match_matrix
from models.evaluation.evaluate import EvalConfig, embed_split


def features(dataset: PairedDataset, split: str, kind: str, spec: str) -> torch.Tensor:
    """The split's cached backbone vectors (computed and cached on a miss)."""
    backbone = load_backbone(spec, "image" if kind == "image" else "text")
    _, array = split_features(dataset, split, kind, backbone.key, backbone.encode)
    return torch.from_numpy(array)


class Bridge:
    """Training drawings' centred unit vectors and the mean unit MiniLM vector of each one's
    captions; `of(drawings)` is the softmax-weighted mean of its k nearest ones' caption vectors."""

    def __init__(self, drawings: torch.Tensor, words: torch.Tensor) -> None:
        """drawings: (N, F) backbone vectors; words: (N, W) each one's mean caption vector."""
        self.words = words
        self.centre = drawings.mean(0)
        self.bank = F.normalize(drawings - self.centre, dim=1)

    @classmethod
    def of_training(cls, dataset: PairedDataset, image_spec: str, text_spec: str) -> Bridge:
        train = dataset.split("train")
        drawings = features(dataset, "train", "image", image_spec)
        captions = F.normalize(features(dataset, "train", "text", text_spec), dim=1)
        row = {image.id: i for i, image in enumerate(train.images)}
        owner = torch.tensor([row[c.image_id] for c in train.captions])
        total = torch.zeros(len(train.images), captions.shape[1]).index_add_(0, owner, captions)
        count = torch.bincount(owner, minlength=len(train.images)).clamp(min=1)
        return cls(drawings, total / count[:, None].float())

    def of(self, drawings: torch.Tensor, k: int, temperature: float) -> torch.Tensor:
        similarity = F.normalize(drawings - self.centre, dim=1) @ self.bank.T
        nearest, rows = similarity.topk(k, dim=1)
        weights = torch.softmax(nearest / temperature, dim=1)
        return F.normalize((weights[:, :, None] * self.words[rows]).sum(1), dim=1)


def precision_at_1(similarity: torch.Tensor, plausible: np.ndarray) -> tuple[float, float]:
    """t2i and i2t P@1 (%) of a (captions, drawings) similarity against the plausible matches."""
    t2i = plausible[np.arange(similarity.shape[0]), similarity.argmax(1).numpy()].mean()
    i2t = plausible[similarity.argmax(0).numpy(), np.arange(similarity.shape[1])].mean()
    return 100 * float(t2i), 100 * float(i2t)


def rejection(heads: torch.Tensor, bridge: torch.Tensor, plausible: np.ndarray, weight: float):
    """nAUPRC of the top answer's heads distance alone, and with the bridge's disagreement with
    that answer added at `weight`, for caption queries (t2i) and drawing queries (i2t)."""
    figures = {}
    for direction, dim in (("t2i", 1), ("i2t", 0)):
        best, top = heads.max(dim)
        queries = torch.arange(len(top))
        pair = (queries, top) if dim == 1 else (top, queries)
        correct = plausible[pair[0].numpy(), pair[1].numpy()]
        distance, disagreement = 1 - best, 1 - bridge[pair]
        combined = distance + weight * disagreement
        figures[f"{direction} reject: distance"] = nauprc(distance.numpy(), correct)
        figures[f"{direction} reject: + bridge"] = nauprc(combined.numpy(), correct)
    return figures


def seed_figures(model: Path, dataset: PairedDataset, bridge: Bridge, args) -> dict[str, float]:
    val = dataset.split("val")
    plausible = plausible_match_matrix(val.captions, val.images)
    embedded = embed_split(model, val, EvalConfig(mc_samples=0))
    mu_caption = F.normalize(torch.from_numpy(embedded.captions.mu), dim=1)
    mu_drawing = F.normalize(torch.from_numpy(embedded.images.mu), dim=1)
    heads = mu_caption @ mu_drawing.T
    words = F.normalize(features(dataset, "val", "text", args.text_backbone), dim=1)
    drawings = bridge.of(features(dataset, "val", "image", args.image_backbone), args.k,
                         args.temperature)  # fmt: skip
    bridged = words @ drawings.T
    figures = {}
    for name, similarity in (
        ("heads", heads),
        ("bridge", bridged),
        ("heads + bridge", (1 - args.weight) * heads + args.weight * bridged),
    ):
        t2i, i2t = precision_at_1(similarity, plausible)
        figures |= {f"{name}: t2i P@1": t2i, f"{name}: i2t P@1": i2t}
    return figures | rejection(heads, bridged, plausible, args.weight)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--models", type=Path, nargs="+", required=True, help="a dir per seed")
    parser.add_argument("--image-backbone", default="efficientnet-lite0")
    parser.add_argument("--text-backbone", default="all-minilm-l6-v2")
    parser.add_argument("--k", type=int, default=50, help="nearest training drawings")
    parser.add_argument("--temperature", type=float, default=0.02)
    parser.add_argument("--weight", type=float, default=0.5, help="the bridge's share")
    parser.add_argument("--out", type=Path, default=Path("/dev/stdout"))
    args = parser.parse_args()
    started, load = time.perf_counter(), os.getloadavg()
    torch.set_num_threads(1)
    dataset = load_dataset(args.data)
    bridge = Bridge.of_training(dataset, args.image_backbone, args.text_backbone)
    seeds = [seed_figures(model, dataset, bridge, args) for model in args.models]
    lines = result_header("A caption bridge for drawings (clip-art val)", load, started)
    lines += [
        "",
        f"Models: {', '.join(str(m) for m in args.models)}; k {args.k}, temperature "
        f"{args.temperature}, bridge weight {args.weight}. Mean ± sd over the models (seeds).",
        "",
        "| figure | " + " | ".join(m.name for m in args.models) + " | mean ± sd |",
        "| --- | " + " | ".join("---" for _ in args.models) + " | --- |",
    ]
    for name in seeds[0]:
        values = [figures[name] for figures in seeds]
        digits = 3 if "reject" in name else 1
        lines.append(f"| {name} | " + " | ".join(f"{v:.{digits}f}" for v in values)
                     + f" | {cell(values, digits)} |")  # fmt: skip
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
