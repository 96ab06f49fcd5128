"""Does the model's uncertainty add to the top-1 distance? A reject score fitted on val from
every learned score, with and without the top-1 distance, read on test.

Issue 39 asks for a shipped reject score above the best training-free baseline. On clip art
with the demo's heads, the top-1 distance alone does about as well as the learned score the
calibration picks (docs/results-clipart-variance.md). If the learned scores carried
information the distance lacks, a combination of them would beat it. For each model dir
(one training seed each): both directions of val and test are scored as models.evaluation
scores them (the direction's default metric, 10 MC draws, the top 100); a logistic regression
of "the first result is a plausible match" on the standardised scores is fitted on val (L2,
C = 1, torch LBFGS) and its negated logit is the reject score on test. Writes, mean ± sd over
the models: test nAUPRC of the top-1 distance, of the val-chosen learned score, and of each
fitted combination. Where the evaluation reports the top-1 distance of the means alone
(models.scoring.baseline_scores.top1_mean_distance, which reads no variance), that distance and
the learned scores fitted with it are read too, and on val itself, with the combinations
cross-fitted on halves of val, so that a gain can be seen before the test split is read.

    python benchmarks/reject_combination.py --data runs/mc-count/data \\
        --models runs/mc-count/models/gcie-count-nce/seed0,...
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.datasets.records import load_dataset
from models.evaluation.evaluate import (
    DESCRIPTIVE_SCORES,
    EvalConfig,
    default_metrics,
    direction_scores,
    direction_setup,
    distance_chunks,
    embed_split,
)
from models.evaluation.rejection_metrics import (
    normalized_auprc,
    oracle_rejection,
    precision_coverage,
    random_rejection,
)
from models.evaluation.retrieval_metrics import rank_queries
from models.networks.model_config import ModelConfig
from models.scoring.baseline_scores import BASELINE_NAMES

DIRECTIONS = ("i2t", "t2i")
VAL_SPLITS = 5  # random halvings of val for the cross-fitted rows
ROOT = Path(__file__).resolve().parents[1]


def nauprc(score: np.ndarray, correct: np.ndarray) -> float:
    chance, best = random_rejection(correct).auprc, oracle_rejection(correct).auprc
    return normalized_auprc(precision_coverage(score, correct).auprc, chance, best)


def scored(
    model_dir: Path, data: Path, split: str, seed: int
) -> dict[str, tuple[dict, np.ndarray]]:
    """direction -> (score name -> (Q,) values, (Q,) whether the top-1 is plausible)."""
    config = EvalConfig(mc_samples=10, seed=seed)
    embedded = embed_split(model_dir, load_dataset(data).split(split), config)
    metrics = default_metrics(ModelConfig.load(model_dir))
    out = {}
    for direction in DIRECTIONS:
        queries, gallery, positives, sets = direction_setup(embedded, direction)
        relevance = {"r_precision": sets["r_precision"]}
        chunks = distance_chunks(
            metrics[direction], queries, gallery, config.chunk_size, torch.device("cpu"), seed
        )
        ranked = rank_queries(chunks, queries.mu.shape[0], positives, relevance, 100)
        scores = direction_scores(
            metrics[direction], queries, gallery, ranked.shortlist, config,
            caption_query=direction == "t2i",
        )  # fmt: skip
        out[direction] = (scores, ranked.top1_hit["r_precision"])
    return out


def fitted_logit(train: np.ndarray, correct: np.ndarray) -> torch.nn.Linear:
    """Logistic regression of `correct` on the rows of `train` (standardised), L2 with C = 1."""
    x = torch.from_numpy(train).double()
    y = torch.from_numpy(correct.astype(np.float64))
    model = torch.nn.Linear(x.shape[1], 1).double()
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=500, line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        value = torch.nn.functional.binary_cross_entropy_with_logits(model(x)[:, 0], y)
        value = value + 0.5 * model.weight.pow(2).sum() / len(y)
        value.backward()
        return value

    optimizer.step(loss)
    return model


def combination(
    names: list[str], val: dict[str, np.ndarray], val_correct: np.ndarray, test: dict
) -> np.ndarray:
    """The fitted reject score (minus the logit of a right answer) of the test queries."""
    train = np.stack([val[n] for n in names], axis=1)
    centre, scale = train.mean(axis=0), train.std(axis=0) + 1e-12
    model = fitted_logit((train - centre) / scale, val_correct)
    rows = (np.stack([test[n] for n in names], axis=1) - centre) / scale
    with torch.no_grad():
        return -model(torch.from_numpy(rows).double())[:, 0].numpy()


def cross_fitted(names: list[str], scores: dict, correct: np.ndarray, seed: int) -> float:
    """nAUPRC on val of a combination fitted on one half of val and read on the other, both
    ways, averaged over VAL_SPLITS random halvings: what a fitted score is worth before the
    test split is read."""
    values = []
    for repeat in range(VAL_SPLITS):
        order = np.random.default_rng([seed, repeat]).permutation(len(correct))
        halves = (order[: len(order) // 2], order[len(order) // 2 :])
        fitted = np.empty(len(correct))
        for fit, read in (halves, halves[::-1]):
            part = {n: scores[n][fit] for n in names}
            fitted[read] = combination(
                names, part, correct[fit], {n: scores[n][read] for n in names}
            )
        values.append(nauprc(fitted, correct))
    return float(np.mean(values))


def val_rows(learned: list[str], v: dict, v_ok: np.ndarray, seed: int) -> dict[str, float]:
    """Val nAUPRC of the top-1 distance of the means and of the cross-fitted combinations."""
    if "top1_mean_distance" not in v:
        return {}
    return {
        "val: top-1 distance of the means": nauprc(v["top1_mean_distance"], v_ok),
        "val, cross-fitted: learned scores": cross_fitted(learned, v, v_ok, seed),
        "val, cross-fitted: learned scores + top-1 distance of the means": cross_fitted(
            [*learned, "top1_mean_distance"], v, v_ok, seed
        ),
    }


def one_model(model_dir: Path, data: Path, seed: int) -> dict[str, dict[str, float]]:
    """direction -> candidate -> test nAUPRC (and val nAUPRC for the rows named "val")."""
    val, test = scored(model_dir, data, "val", seed), scored(model_dir, data, "test", seed)
    result = {}
    for direction in DIRECTIONS:
        (v, v_ok), (t, t_ok) = val[direction], test[direction]
        usable = [n for n in v if np.isfinite(v[n]).all() and np.ptp(v[n]) > 1e-9]
        learned = [n for n in usable if n not in (*BASELINE_NAMES, *DESCRIPTIVE_SCORES)]
        chosen = max(learned, key=lambda n: nauprc(v[n], v_ok))
        result[direction] = {
            "top-1 distance": nauprc(t["top1_distance"], t_ok),
            f"val-chosen learned score ({chosen})": nauprc(t[chosen], t_ok),
            "fitted: learned scores": nauprc(combination(learned, v, v_ok, t), t_ok),
            "fitted: learned scores + top-1 distance": nauprc(
                combination([*learned, "top1_distance"], v, v_ok, t), t_ok
            ),
        }
        if "top1_mean_distance" in usable:
            result[direction] |= {
                "top-1 distance of the means": nauprc(t["top1_mean_distance"], t_ok),
                "fitted: learned scores + top-1 distance of the means": nauprc(
                    combination([*learned, "top1_mean_distance"], v, v_ok, t), t_ok
                ),
            }
        result[direction] |= val_rows(learned, v, v_ok, seed)
    return result


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def run_line(args: argparse.Namespace, seconds: float) -> str:
    """The command, machine, load, wall time, models and data of a run, for its results file."""
    return (
        f"Command: `{args.command}`; machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, load (1 min) {os.getloadavg()[0]:.1f}; wall time "
        f"{seconds / 60:.1f} min; models: {', '.join(args.models)}; data: {args.data}"
    )


def render(args: argparse.Namespace, runs: list[dict], seconds: float) -> str:
    lines = [
        "# Reject scores fitted on val: does the model's uncertainty add to the top-1 distance?",
        "",
        f"{run_line(args, seconds)}.",
        "",
        "Test nAUPRC (0 chance, 1 oracle) of each reject score, mean ± sd over the models (one "
        "training seed each); every fitted weight and every choice was made on val. The rows "
        "named val are read on val: the combinations there are fitted on one half of val and "
        f"read on the other, both ways, averaged over {VAL_SPLITS} random halvings.",
    ]
    for direction in DIRECTIONS:
        lines += ["", f"## {direction}", "", "| reject score | test nAUPRC |", "| --- | --- |"]
        names: dict[str, list[float]] = {}
        for run in runs:
            for name, value in run[direction].items():
                key = name.split(" (")[0] if name.startswith("val-chosen") else name
                names.setdefault(key, []).append(value)
        lines += [f"| {name} | {mean_sd(values)} |" for name, values in names.items()]
        chosen = [n for run in runs for n in run[direction] if n.startswith("val-chosen")]
        lines += [
            "",
            "Val-chosen learned scores: " + ", ".join(c.split("(")[1][:-1] for c in chosen) + ".",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help="comma-separated model dirs")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/reject_combination.md"
    )
    args = parser.parse_args()
    run_models(args, "reject_combination.py", lambda model, seed: one_model(model, args.data, seed),
               render)  # fmt: skip


def run_models(
    args: argparse.Namespace,
    script: str,
    one: Callable[[Path, int], dict],
    render_runs: Callable[[argparse.Namespace, list[dict], float], str],
) -> None:
    """Each of --models (comma-separated; the k-th is seed k) through `one`, on one torch
    thread, then the rendered results written to --out and printed."""
    args.models = args.models.split(",")
    args.command = " ".join([f"python benchmarks/{script}", *sys.argv[1:]])
    torch.set_num_threads(1)
    started = time.perf_counter()
    runs = [one(Path(m), seed) for seed, m in enumerate(args.models)]
    args.out.write_text(render_runs(args, runs, time.perf_counter() - started))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
