"""Variants of model_comparison's runs on the val split only: each variant is one of its runs
(PRETRAINED_RUNS, the heads of docs/results-clipart-backbones.md, or with --runs shapes the
RUNS of docs/results.md) with some settings changed, trained per seed with that run's budget
(--epochs: 60 for the heads, 30 on shapes), then `probsearch eval`'s figures on val by the
run's metric. Writes mean ± sd over the seeds of P@1
and R-Precision in both directions and of the training's best val score to --out; models and
per-seed figures are kept in --work-dir and reused. This is where a setting of those runs is
chosen; the test split is read only by model_comparison.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/heads_val_sweep.py \\
        --data runs/model_comparison_clipart_backbones/data --parallel 2 \\
        --variant pcmepp --variant vse \\
        --variant pcmepp-plausible=pcmepp,positives=plausible
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/heads_val_sweep.py --runs shapes \\
        --data runs/model_comparison/data --epochs 30 --variant pcme
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.model_comparison import PRETRAINED_RUNS, RUNS, Run, effective_configs
from models.evaluation.evaluate import EvalConfig, evaluate_model
from models.networks.model_config import ModelConfig, TrainConfig
from models.training.train import train

ROOT = Path(__file__).resolve().parents[1]
# t2i_log-det_rho, t2i_var-sum_rho: Spearman of the captions' log-det and of the sum of their
# variances (PCME++'s own uncertainty) with ln(#plausible drawings); NaN for a point model,
# whose variance is one constant.
FIGURES = ("i2t_P@1", "i2t_R-P", "t2i_P@1", "t2i_R-P", "val_score", "t2i_log-det_rho")
FIGURES += ("t2i_var-sum_rho",)
# Normalised AUPRC of refusing wrong first answers on val: two learned scores (top_mahalanobis,
# what calibration picks for the demo's heads, and the log-det) and the distance of the means
# alone, the training-free yardstick no variance enters (models.scoring.baseline_scores).
REJECTION = {"top_mahalanobis": "top-maha", "log_det": "log-det", "top1_mean_distance": "means"}
FIGURES += tuple(f"{d}_{label}_nauprc" for d in ("i2t", "t2i") for label in REJECTION.values())
MODEL_FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}
TRAIN_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}


def parse_value(text: str) -> object:
    """A setting's value: JSON where it parses (numbers, true/false), else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_variant(spec: str, base_runs: tuple[Run, ...]) -> Run:
    """`name` (a run of `base_runs` as it is) or `name=base,key=value,...`: the base run with
    each key set in its ModelConfig or TrainConfig overrides."""
    runs = {run.name: run for run in base_runs}
    name, _, rest = spec.partition("=")
    base_name, *settings = rest.split(",") if rest else [name]
    if base_name not in runs:
        raise SystemExit(f"--variant {spec!r}: no run {base_name!r} among {sorted(runs)}")
    base = runs[base_name]
    model, training = dict(base.model), dict(base.training)
    for setting in settings:
        key, _, value = setting.partition("=")
        if key in MODEL_FIELDS:
            model[key] = parse_value(value)
        elif key in TRAIN_FIELDS:
            training[key] = parse_value(value)
        else:
            raise SystemExit(f"--variant {spec!r}: {key!r} is no ModelConfig or TrainConfig field")
    return dataclasses.replace(base, name=name, model=model, training=training)


def run_seed(
    data: Path, out: Path, run: Run, seed: int, epochs: int, key: dict | None = None
) -> dict:
    """Train one variant and seed into `out` and read its val figures, cached beside it and
    reused only for the same effective configs (so a changed default retrains) and `key`
    (what else the caller changed about the training)."""
    cached = out / "val_figures.json"
    model, training, configs = effective_configs(run, seed, epochs)
    configs |= key or {}
    if cached.is_file():
        saved = json.loads(cached.read_text())
        if saved.get("configs") == configs and all(name in saved for name in FIGURES):
            return saved
    torch.set_num_threads(1)
    start = time.time()
    result = train(data, out, model, training, progress=False, log=lambda _: None)
    metric = run_metric(run)
    report = evaluate_model(out, data, "val", EvalConfig(metrics=(metric,), mc_samples=0))
    figures: dict = {"configs": configs, "best_epoch": result.best_epoch}
    figures |= {"epochs": len(result.history), "train_s": round(time.time() - start)}
    figures["val_score"] = max(epoch["score"] for epoch in result.history)
    for direction in ("i2t", "t2i"):
        retrieval = report["metrics"][metric][direction]["retrieval"]
        figures[f"{direction}_P@1"] = retrieval["P@1"]
        figures[f"{direction}_R-P"] = retrieval["r_precision"]
        rejection = report["metrics"][metric][direction]["rejection"]
        for name, label in REJECTION.items():
            value = rejection.get(name, {}).get("normalized_auprc")
            figures[f"{direction}_{label}_nauprc"] = math.nan if value is None else value
    ambiguity = report["metrics"][metric]["t2i"]["ambiguity_spearman"]
    figures["t2i_log-det_rho"] = ambiguity.get("log_det", math.nan)
    figures["t2i_var-sum_rho"] = ambiguity.get("total_variance", math.nan)
    cached.write_text(json.dumps(figures, indent=1) + "\n")
    return figures


def run_metric(run: Run) -> str:
    """The metric a variant is ranked with: the one its model searches with when the variant
    names one (search_with), else its run's."""
    return run.model.get("search_with") or run.metric


def cell(values: list[float], digits: int = 1) -> str:
    if any(math.isnan(v) for v in values):
        return "n/a"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"


def figure_digits(name: str) -> int:
    return 3 if name.endswith("nauprc") else 2 if name.endswith("rho") else 1


def write_table(out: Path, args: argparse.Namespace, runs: list[Run], results: dict) -> None:
    load = os.getloadavg()[0]
    lines = [
        f"# Variants of model_comparison's {args.runs} runs on the val split",
        "",
        f"Command: `{args.command}`; machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load (1 min) {load:.1f} at the end; seeds {args.seeds}; at most {args.epochs} epochs.",
        "",
        "Val figures (%), mean ± sd over the seeds, each variant by its run's metric (by its",
        "model's search_with where the variant sets one); the val",
        "score is the training's best (plausible t2i P@1, both R-Precisions, exact R@5).",
        "",
        "| variant | settings | " + " | ".join(FIGURES) + " | best epochs |",
        "| --- | --- | " + " | ".join("---" for _ in FIGURES) + " | --- |",
    ]
    for run in runs:
        seeds = [results[run.name, s] for s in args.seeds]
        settings = ", ".join(f"{k}={v}" for k, v in {**run.model, **run.training}.items())
        cells = [cell([r.get(f, math.nan) for r in seeds], figure_digits(f)) for f in FIGURES]
        epochs = ", ".join(str(r["best_epoch"]) for r in seeds)
        lines.append(f"| {run.name} | {settings} | " + " | ".join(cells) + f" | {epochs} |")
    out.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the runs' dataset dir")
    parser.add_argument("--runs", choices=("backbones", "shapes"), default="backbones")
    parser.add_argument("--variant", action="append", required=True, help="name[=base,k=v,...]")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--parallel", type=int, default=1, help="seeds trained at once")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "heads_val_sweep")
    parser.add_argument("--out", type=Path, default=Path("/dev/stdout"))
    args = parser.parse_args()
    args.command = " ".join([".venv/bin/python benchmarks/heads_val_sweep.py", *sys.argv[1:]])
    args.seeds = [int(s) for s in args.seeds.split(",")]
    base_runs = PRETRAINED_RUNS if args.runs == "backbones" else RUNS
    runs = [parse_variant(spec, base_runs) for spec in args.variant]
    jobs = [(run, seed) for run in runs for seed in args.seeds]
    with ProcessPoolExecutor(args.parallel) as pool:
        futures = {
            (run.name, seed): pool.submit(
                run_seed, args.data, args.work_dir / run.name / f"seed{seed}", run, seed,
                args.epochs,
            )
            for run, seed in jobs
        }  # fmt: skip
        results = {key: future.result() for key, future in futures.items()}
    write_table(args.out, args, runs, results)


if __name__ == "__main__":
    main()
