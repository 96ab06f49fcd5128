"""Would an ensemble of independently trained heads retrieve better? Measured on val, before
anything is built for it.

Each model of --models is one training seed of the same run (heads_val_sweep's work dir, say).
An ensemble of K of them is one diagonal Gaussian with K * D dimensions: each member's mean and
variance side by side. Its query_mahalanobis is then the sum of the members' distances, and its
log-det the sum of theirs, so every exact index and score of the project applies unchanged.
The models are cut, in the order given, into disjoint ensembles of --members each; the table
gives the single models' figures and the ensembles', mean ± sd, by the run's metric.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/ensemble_val.py --data .cache/demo/data \\
        --models runs/ens/base/seed{0..8} --members 3 --out benchmarks/results/ensemble_val.md
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.datasets.records import load_dataset
from models.evaluation.evaluate import (
    EvalConfig,
    SplitEmbeddings,
    embed_split,
    evaluate_direction,
)
from models.onnx.encoder_runtime import Embeddings

FIGURES = ("i2t_P@1", "i2t_R-P", "t2i_P@1", "t2i_R-P", "t2i_log-det_rho")


def side_by_side(parts: list[Embeddings]) -> Embeddings:
    """The members' means and log-variances concatenated along the dimensions."""
    return Embeddings(
        mu=np.concatenate([p.mu for p in parts], axis=1),
        logvar=np.concatenate([p.logvar for p in parts], axis=1),
    )


def ensemble(members: list[SplitEmbeddings]) -> SplitEmbeddings:
    first = members[0]
    return SplitEmbeddings(
        first.dataset,
        side_by_side([m.images for m in members]),
        side_by_side([m.captions for m in members]),
        first.caption_image,
        first.image_labels,
    )


def figures(split: SplitEmbeddings, metric: str, config: EvalConfig) -> dict[str, float]:
    result = {}
    for direction in ("i2t", "t2i"):
        section, _ = evaluate_direction(split, metric, direction, config)
        result[f"{direction}_P@1"] = section["retrieval"]["P@1"]
        result[f"{direction}_R-P"] = section["retrieval"]["r_precision"]
        if direction == "t2i":
            result["t2i_log-det_rho"] = section["ambiguity_spearman"].get("log_det", math.nan)
    return result


def cell(values: list[float], name: str) -> str:
    digits = 2 if name.endswith("rho") else 1
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--models", type=Path, nargs="+", required=True)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--metric", default="query_mahalanobis")
    parser.add_argument("--out", type=Path, default=Path("/dev/stdout"))
    args = parser.parse_args()
    if args.members < 2 or len(args.models) < args.members:
        raise SystemExit("need --members >= 2 and at least that many --models")
    config = EvalConfig(metrics=(args.metric,), mc_samples=0)
    dataset = load_dataset(args.data, "val")
    splits = [embed_split(model, dataset, config) for model in args.models]
    singles = [figures(s, args.metric, config) for s in splits]
    starts = range(0, len(splits) - args.members + 1, args.members)
    ensembles = [
        figures(ensemble(splits[i : i + args.members]), args.metric, config) for i in starts
    ]
    command = " ".join([".venv/bin/python benchmarks/ensemble_val.py", *sys.argv[1:]])
    lines = [
        "# Ensembles of independently trained heads on the val split",
        "",
        f"Command: `{command}`; machine: {platform.machine()}, {os.cpu_count()} CPUs, load "
        f"(1 min) {os.getloadavg()[0]:.1f} at the end; metric {args.metric}.",
        "",
        f"Val figures (%), mean ± sd: over the {len(singles)} single models, and over the "
        f"{len(ensembles)} disjoint ensembles of {args.members} of them (in the order given).",
        "",
        "| models | " + " | ".join(FIGURES) + " |",
        "| --- | " + " | ".join("---" for _ in FIGURES) + " |",
        "| single | " + " | ".join(cell([s[f] for s in singles], f) for f in FIGURES) + " |",
        f"| ensemble of {args.members} | "
        + " | ".join(cell([e[f] for e in ensembles], f) for f in FIGURES)
        + " |",
        "",
        "Per model (t2i P@1): " + ", ".join(f"{s['t2i_P@1']:.1f}" for s in singles) + ".",
        "Per ensemble (t2i P@1): " + ", ".join(f"{e['t2i_P@1']:.1f}" for e in ensembles) + ".",
    ]
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
