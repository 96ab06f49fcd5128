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

With --evaluate, also the split's retrieval and rejection figures (models.evaluation.evaluate,
at --metric, MC seed = the training seed; cached in the model dir), and mean +- sd over the
seeds of each variance objective (variance_objective "gallery_spread" fits the whole-gallery
target in training, "plausible_count" a target set by the caption's number of plausible
training images instead: models.training.gallery_spread).

    python benchmarks/spread_target.py --data D --model-dir M [--model-dir M2 ...] --out F \
        [--evaluate]
"""

from __future__ import annotations

import argparse
import json
import math
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
from models.evaluation.evaluate import DESCRIPTIVE_SCORES, EvalConfig, embed_split, evaluate_model
from models.networks.model_config import CHECKPOINT_FILE, ModelConfig
from models.objectives.regularizers import SPREAD_FLOOR, spread_target
from models.scoring.baseline_scores import BASELINE_NAMES


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


SPEARMAN_COLUMNS = (
    "learned log-det",
    "same, each text once",
    "whole-gallery spread target",
    "trace of that spread",
    "learned log-det vs target",
)
DIRECTIONS = ("t2i", "i2t")
# The training-free top-1 baselines: what the reject score is judged against, never it.
BASELINES = BASELINE_NAMES
EVAL_COLUMNS = tuple(
    f"{d} {name}"
    for d in DIRECTIONS
    for name in ("P@1", "R-P", "log-det nAUPRC", "reject nAUPRC", "best baseline nAUPRC")
)


def spearman_cells(model_dir: Path, dataset, plausible: np.ndarray, first: np.ndarray) -> list:
    """The model's Spearman figures against ln(#plausible), in SPEARMAN_COLUMNS order."""
    split = embed_split(model_dir, dataset, EvalConfig(mc_samples=0))
    ambiguity = np.log(np.maximum(plausible.sum(axis=1), 1))
    learned = split.captions.logvar.sum(axis=1)
    target, trace = gallery_targets(split.images.mu, plausible)
    return [
        rank_correlation(learned, ambiguity),
        rank_correlation(learned[first], ambiguity[first]),
        rank_correlation(target, ambiguity),
        rank_correlation(trace, ambiguity),
        rank_correlation(learned, target),
    ]


def evaluation(model_dir: Path, data: Path, split: str, metric: str) -> dict:
    """models.evaluation.evaluate's report of the split, cached in the model dir for the
    checkpoint it was made from."""
    seed = int(ModelConfig.load(model_dir).training.get("seed", 0))
    key = [split, metric, seed, str(data), (model_dir / CHECKPOINT_FILE).stat().st_mtime_ns]
    cache = model_dir / f"evaluation_{split}.json"
    if cache.is_file() and (saved := json.loads(cache.read_text()))["key"] == key:
        return saved["report"]
    report = evaluate_model(model_dir, data, split, EvalConfig(metrics=(metric,), seed=seed))
    cache.write_text(json.dumps({"key": key, "report": report}, allow_nan=True))
    return report


def eval_cells(report: dict, metric: str) -> list[float]:
    """P@1 and R-Precision (%), the log-det's normalised AUPRC and that of the reject score
    (the learned score with the best normalised AUPRC on this same split, as the comparison
    chooses it on val), per direction, in EVAL_COLUMNS order."""
    cells = []
    for d in DIRECTIONS:
        section = report["metrics"][metric][d]
        rejection = {
            n: r["normalized_auprc"]
            for n, r in section["rejection"].items()
            if n not in ("random", "oracle")
        }
        learned = [v for n, v in rejection.items() if n not in (*BASELINES, *DESCRIPTIVE_SCORES)]
        baseline = [rejection.get(n, math.nan) for n in BASELINES]
        cells += [
            section["retrieval"]["P@1"],
            section["retrieval"]["r_precision"],
            rejection.get("log_det", math.nan),
            max((v for v in learned if not math.isnan(v)), default=math.nan),
            max((v for v in baseline if not math.isnan(v)), default=math.nan),
        ]
    return cells


def objective_of(model_dir: Path) -> str:
    """The run's variance objective, as its model.json records it, and whether its variance
    head reads the backbone vector (variance_reads_backbone)."""
    config = ModelConfig.load(model_dir)
    objective = config.training.get("variance_objective") or "none"
    return objective + ", reads the backbone" * config.variance_reads_backbone


def mean_sd(values: list[float], signed: bool) -> str:
    finite = np.array([v for v in values if not math.isnan(v)])
    if not finite.size:
        return "n/a"
    sd = f" ± {finite.std(ddof=1):.2f}" if finite.size > 1 else ""
    return f"{finite.mean():{'+' if signed else ''}.2f}{sd}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a clip-art dataset dir")
    parser.add_argument("--model-dir", type=Path, action="append", required=True)
    parser.add_argument("--split", default="val")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/spread_target.md"))
    parser.add_argument("--evaluate", action="store_true", help="retrieval and rejection too")
    parser.add_argument("--metric", default="w2", help="the evaluation's ranking metric")
    args = parser.parse_args()
    torch.set_num_threads(1)
    started, load = time.perf_counter(), os.getloadavg()[0]
    dataset = load_dataset(args.data, args.split)
    plausible = plausible_match_matrix(dataset.captions, dataset.images)  # (C, I)
    texts = [c.text for c in dataset.captions]
    first = np.unique(texts, return_index=True)[1]
    header = ["model", *SPEARMAN_COLUMNS]
    cells = {m: spearman_cells(m, dataset, plausible, first) for m in args.model_dir}
    if args.evaluate:
        header += [*EVAL_COLUMNS]
        for m in args.model_dir:
            report = evaluation(m, args.data, args.split, args.metric)
            cells[m] += eval_cells(report, args.metric)
    signed = [True] * len(SPEARMAN_COLUMNS) + [False] * len(EVAL_COLUMNS)
    rows = [
        [str(m), *(f"{c:{'+' if s else ''}.2f}" for c, s in zip(cells[m], signed, strict=False))]
        for m in args.model_dir
    ]
    groups: dict[str, list[Path]] = {}
    for m in args.model_dir:
        groups.setdefault(objective_of(m), []).append(m)
    summary = [
        [f"{name} ({len(dirs)} runs)"]
        + [
            mean_sd([cells[m][i] for m in dirs], s)
            for i, s in zip(range(len(header) - 1), signed, strict=False)
        ]
        for name, dirs in groups.items()
    ]
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
        *(
            [
                f"Evaluation (--evaluate): models.evaluation.evaluate on {args.split}, metric "
                f"{args.metric}, MC seed = training seed; P@1 and R-P (R-Precision) in %, "
                "plausible matches; nAUPRC: normalised AUPRC of rejecting wrong top-1 "
                "answers; reject: the best learned score (every score but the training-free "
                "top-1 baselines, each at its best temperature) on this split; best baseline: "
                "the best of those baselines.",
            ]
            if args.evaluate
            else []
        ),
        "",
        "Mean ± sd (ddof 1) over the runs of each variance objective:",
        "",
        *table(["variance objective", *header[1:]], summary),
        "",
        "Each run:",
        "",
        *table(header, rows),
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
