"""Model comparison: train vse, gcie (w2, kl, min_kl), gce and gie on one shapes dataset and
write docs/results.md (every metric of `probsearch eval`, test split) and docs/img/rejection.png.

    .venv/bin/python benchmarks/model_comparison.py                  # the documented run
    .venv/bin/python benchmarks/model_comparison.py --images 300 --epochs 1 --work-dir /tmp/mc

Dataset and trained models are kept in --work-dir and reused when their settings match, so a
rerun re-evaluates and re-renders only. Everything is seeded: training (models.train), MC draws
and tie-breaking (models.evaluate). The MI temperature is picked per model and direction on the
val split (best R@1 AUPRC) and applied to the test split, as `probsearch calibrate` does.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.datasets.shapes import generate_shapes
from models.evaluate import EvalConfig, evaluate_model
from models.evaluation_report import write_report
from models.model_config import ModelConfig, TrainConfig
from models.train import HISTORY_FILE, train

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ".venv/bin/python benchmarks/model_comparison.py"
DIRECTIONS = ("i2t", "t2i")
UNCERTAINTIES = ("mi", "log_det", "feature_uncertainty")  # "mi" = MI at the val-chosen T
LABELS = {"mi": "MI", "log_det": "log-det", "feature_uncertainty": "feat.", "random": "random"}
RETRIEVAL = {"R@1": "R@1", "R@5": "R@5", "R@10": "R@10", "rsum": "rsum", "median_rank": "med r"}
RETRIEVAL |= {"r_precision": "R-P", "pmrp": "PMRP"}


@dataclass(frozen=True)
class Run:
    """One trained model: type, training similarity, the metric it is ranked with, and other
    metrics it is also ranked with (reported separately)."""

    name: str
    model_type: str
    train_metric: str
    metric: str
    extra: tuple[str, ...] = ()


RUNS: tuple[Run, ...] = (
    Run("vse", "vse", "cosine", "w2"),  # w2 on unit points with one constant variance = cosine
    Run("gcie-w2", "gcie", "w2", "w2", ("kl", "min_kl")),  # the demo's model and metrics
    Run("gcie-kl", "gcie", "kl", "kl", ("kl_reverse",)),  # kl_reverse: see "How to read this"
    Run("gcie-min_kl", "gcie", "min_kl", "min_kl"),
    Run("gce", "gce", "mahalanobis", "mahalanobis"),
    Run("gie", "gie", "mahalanobis", "mahalanobis"),
)
BASELINE, PLOT_RUN = "vse", "gcie-w2"


def prepare_data(work: Path, images: int, seed: int, timings: dict) -> Path:
    """The shapes dataset in work/data, generated unless one with these settings is there."""
    data, started = work / "data", time.perf_counter()
    meta = data / "dataset.json"
    if meta.is_file():
        saved = json.loads(meta.read_text())
        if saved.get("num_images") == images and saved.get("seed") == seed:
            return data
    shutil.rmtree(work / "models", ignore_errors=True)  # trained on other data
    generate_shapes(data, images, seed, overwrite=True, progress=True)
    timings.clear()
    timings["data"] = time.perf_counter() - started
    return data


def train_run(run: Run, data: Path, work: Path, epochs: int, seed: int, timings: dict) -> Path:
    """Train one model into work/models/<name>, or reuse a finished run with the same budget."""
    out, started = work / "models" / run.name, time.perf_counter()
    history = out / HISTORY_FILE
    if history.is_file() and (out / "text_encoder.onnx").is_file():
        training = ModelConfig.load(out).training
        done = len(json.loads(history.read_text())) == epochs
        if done and training.get("seed") == seed and training.get("data") == str(data):
            return out
    shutil.rmtree(out, ignore_errors=True)
    model = ModelConfig(model_type=run.model_type, metric=run.train_metric)
    train(data, out, model, TrainConfig(epochs=epochs, seed=seed), progress=False, log=print)
    timings[run.name] = time.perf_counter() - started
    return out


def evaluate_run(run: Run, model_dir: Path, data: Path, work: Path, seed: int) -> dict:
    """Test-split report of one model; report["mi"][direction] names the MI method whose
    temperature had the best R@1 AUPRC on val. The full report goes to work/reports/<name>."""
    config = EvalConfig(metrics=(run.metric, *run.extra), seed=seed)
    val = evaluate_model(model_dir, data, "val", config)["metrics"][run.metric]
    report = evaluate_model(model_dir, data, "test", config)
    write_report(report, work / "reports" / run.name)
    mi = {d: [m for m in val[d]["rejection"] if m.startswith("mi_")] for d in DIRECTIONS}
    auprc = {d: {m: val[d]["rejection"][m]["R@1"]["auprc"] for m in mi[d]} for d in DIRECTIONS}
    report["mi"] = {d: max(mi[d], key=auprc[d].__getitem__) for d in DIRECTIONS}
    return report


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or value != value else f"{value:.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return [*lines, *("| " + " | ".join(row) + " |" for row in rows), ""]


def rejection_of(report: dict, metric: str, d: str, method: str) -> dict:
    """The rejection entry of one uncertainty method ("mi" = the val-chosen temperature)."""
    name = report["mi"][d] if method == "mi" else method
    return report["metrics"][metric][d]["rejection"][name]


def retrieval_rows(reports: dict[str, dict], extra: bool) -> list[list[str]]:
    rows = []
    for run in RUNS:
        for metric in run.extra if extra else (run.metric,):
            result = reports[run.name]["metrics"][metric]
            cells = [run.name, "w2 (= cosine)" if run.name == BASELINE else metric]
            for key in RETRIEVAL:
                cells += [fmt(result[d]["retrieval"][key]) for d in DIRECTIONS]
            rows.append(cells)
    return rows


def rejection_rows(reports: dict[str, dict]) -> list[list[str]]:
    rows = []
    for run, d in ((run, d) for run in RUNS for d in DIRECTIONS):
        report = reports[run.name]
        cells = [run.name, d, report["mi"][d].removeprefix("mi_T")]
        for at in ("R@1", "R@10"):
            cells += [
                fmt(rejection_of(report, run.metric, d, m)[at]["auprc"], 3)
                for m in ("random", *UNCERTAINTIES)
            ]
        for method in UNCERTAINTIES:
            accuracy = rejection_of(report, run.metric, d, method)["deciles"]["accuracy"]
            cells += [fmt(100 * accuracy[0]), fmt(100 * accuracy[-1])]
        rows.append(cells)
    return rows


def crop_rows(reports: dict[str, dict]) -> list[list[str]]:
    rows = []
    for run in RUNS:
        crop, gallery = reports[run.name]["crop"], reports[run.name]["log_det"]
        accuracy, log_det = crop["metrics"][run.metric], crop["mean_log_det"]
        cells = [run.name, str(crop["tuples"])]
        cells += [fmt(accuracy[d][part]) for d in DIRECTIONS for part in ("part_a", "union")]
        cells += [fmt(log_det[m][p], 2) for m in ("image", "text") for p in ("part_a", "union")]
        cells += [f"{fmt(gallery[m]['mean'], 2)} ± {fmt(gallery[m]['std'], 2)}" for m in log_det]
        rows.append(cells)
    return rows


def findings(reports: dict[str, dict]) -> list[str]:
    """Where each Gaussian model is below the point baseline, read off the numbers."""
    base = reports[BASELINE]["metrics"]["w2"]
    winners = [
        r.name for r in RUNS[1:] if reports[r.name]["metrics"][r.metric]["rsum"] > base["rsum"]
    ]
    lines = [
        f"- In short: {len(winners)} of {len(RUNS) - 1} Gaussian models beat the point baseline "
        f"on total rsum ({', '.join(winners) or 'none'}); the others do not."
    ]
    for run in RUNS[1:]:
        result = reports[run.name]["metrics"][run.metric]
        below = [
            f"{RETRIEVAL[key]} {d} {fmt(result[d]['retrieval'][key])} vs "
            f"{fmt(base[d]['retrieval'][key])}"
            for key in ("R@1", "rsum", "r_precision", "pmrp")
            for d in DIRECTIONS
            if result[d]["retrieval"][key] < base[d]["retrieval"][key]
        ]
        verdict = "does NOT beat" if result["rsum"] <= base["rsum"] else "beats"
        tail = f" Below vse on: {', '.join(below)}." if below else " Not below vse anywhere."
        lines.append(
            f"- {run.name} {verdict} vse on total rsum ({fmt(result['rsum'])} vs "
            f"{fmt(base['rsum'])}).{tail}"
        )
    for run in (run for run in RUNS if run.extra):
        own = reports[run.name]["metrics"][run.metric]
        for metric in run.extra:
            other = reports[run.name]["metrics"][metric]
            rsums = ", ".join(
                f"{d} {fmt(other[d]['retrieval']['rsum'])} vs {fmt(own[d]['retrieval']['rsum'])}"
                for d in DIRECTIONS
            )
            lines.append(
                f"- {run.name} ranked with {metric} instead of {run.metric}: rsum {rsums}."
            )
    return lines + uncertainty_findings(reports)


def uncertainty_findings(reports: dict[str, dict]) -> list[str]:
    """Rejection against random (R@1 and R@10 AUPRC), crop log-det, spread of the log-det."""
    lines = [rejection_finding(reports, m, at) for m in UNCERTAINTIES for at in ("R@1", "R@10")]
    text = {r.name: reports[r.name]["crop"]["mean_log_det"]["text"] for r in RUNS[1:]}
    gaps = {name: v["part_a"] - v["union"] for name, v in text.items() if v["part_a"] != 0}
    lines.append(
        '- Crop: the less specific caption "A" gets a larger log-det than "A and B" in: '
        + (", ".join(f"{n} ({g:+.2f})" for n, g in gaps.items() if g > 0) or "none")
        + "; not in: "
        + (", ".join(f"{n} ({g:+.2f})" for n, g in gaps.items() if g <= 0) or "none")
        + "."
    )
    spreads = [
        f"{run.name} {modality} {fmt(reports[run.name]['log_det'][modality]['std'], 2)}"
        for run in RUNS[1:]
        for modality in ("image", "text")
        if reports[run.name]["log_det"][modality]["std"] > 0
    ]
    lines.append(
        f"- Spread (std) of the learned log-det over the test items: {', '.join(spreads)}."
    )
    return lines


def rejection_finding(reports: dict[str, dict], method: str, at: str) -> str:
    """How often rejecting by `method` beats random on the AUPRC of `at`; the ties and losses."""
    gains = {}
    for run, d in ((run, d) for run in RUNS for d in DIRECTIONS):
        chance = reports[run.name]["metrics"][run.metric][d]["rejection"]["random"]
        auprc = rejection_of(reports[run.name], run.metric, d, method)[at]["auprc"]
        gains[f"{run.name} {d}"] = auprc - chance[at]["auprc"]
    ties = [name for name, gain in gains.items() if abs(gain) < 1e-9]
    losses = [f"{name} ({gain:+.3f})" for name, gain in gains.items() if gain <= -1e-9]
    wins = len(gains) - len(ties) - len(losses)
    return (
        f"- Rejecting by {LABELS[method]} beats random on {at} AUPRC in {wins} of {len(gains)} "
        f"model-directions; worse in: {', '.join(losses) or 'none'}"
        + (f"; equal in: {', '.join(ties)}." if ties else ".")
    )


def plot_rejection(reports: dict[str, dict], path: Path) -> None:
    """Precision of R@1 and R@10 against the fraction of queries kept (test split): PLOT_RUN
    with every uncertainty (solid), vse with MI (dotted), each with its random level."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for (row, at), (col, d) in itertools.product(enumerate(("R@1", "R@10")), enumerate(DIRECTIONS)):
        ax = axes[row, col]
        for name, style, methods in (
            (PLOT_RUN, "-", (*UNCERTAINTIES, "random")),
            (BASELINE, ":", ("mi", "random")),
        ):
            report = reports[name]
            metric = next(run.metric for run in RUNS if run.name == name)
            for method in methods:
                curve = rejection_of(report, metric, d, method)[at]
                label = LABELS[method] + (f" T={report['mi'][d][4:]}" if method == "mi" else "")
                label = f"{name} {label} (AUPRC {curve['auprc']:.3f})"
                ax.plot(curve["coverage"], curve["precision"], style, label=label)
        ax.set(title=f"{d}: precision of {at}", xlabel="fraction of queries kept")
        ax.set(ylabel="precision")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def setup_lines(args: argparse.Namespace, reports: dict[str, dict], timings: dict) -> list[str]:
    """Data, budget, evaluation settings, machine and wall time."""
    meta = json.loads((args.work_dir / "data" / "dataset.json").read_text())
    test, settings = reports[BASELINE]["data"], reports[BASELINE]["settings"]
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":")[1].strip() for ln in cpuinfo if ln.startswith("model name")), "?")
    train_min = {run.name: timings.get(run.name, float("nan")) / 60 for run in RUNS}
    total_min = (timings.get("data", float("nan")) + timings["eval"]) / 60 + sum(train_min.values())
    return [
        f"- data: shapes, {args.images} images, seed {args.seed}, splits {meta['splits']}; "
        f"scored on the test split ({test['images']} images, {test['captions']} captions).",
        f"- budget, the same for every model: {args.epochs} epochs; ModelConfig and TrainConfig "
        f"defaults otherwise (D=32, batch 32, lr 2e-3, sum-of-hinges loss, seed {args.seed}); "
        "checkpoint of the epoch with the best val rsum.",
        f"- evaluation: models.evaluate, {settings['mc_samples']} MC-dropout draws, MI over the "
        f"top {settings['shortlist_size']}, T in {settings['temperatures']} chosen on val.",
        f"- machine: 2-core {cpu}, CPU only, 1 torch thread, torch {torch.__version__}, "
        "shared with other jobs (timings are indicative).",
        f"- wall time from scratch: {fmt(total_min)} min; training (min): "
        + ", ".join(f"{k} {fmt(v)}" for k, v in train_min.items())
        + f"; evaluation {fmt(timings['eval'] / 60)}. A rerun reuses data and models.",
    ]


TEMPLATE = """\
# Results: point vs Gaussian embeddings on the shapes data

Generated by `{generator}`; do not edit by hand.

**How to reproduce:** `{command}`

{setup}

## Retrieval (%, test split)

{retrieval}
R-P: R-Precision with the exact plausible matches; PMRP: mean over zeta 0, 1, 2 (Chun et al.);
med r: median rank; rsum per direction (their total is the rsum of the text below).

## Where the Gaussian models do and do not win

{findings}

## Rejection: AUPRC (precision vs fraction kept) and R@1 (%) per uncertainty decile

{rejection}
![precision of R@1 and R@10 against the fraction of queries kept](img/rejection.png)

## Crop experiment (selection accuracy %, mean log-det) and log-det of the test galleries

{crop}
## The same models ranked with other metrics

{extra}
## How to read this

- With the default settings, gcie-w2 is the model `probsearch demo` trains (3000 images,
  12 epochs, seed 0, default configs); the demo also serves it with kl and min_kl (and js,
  csd): the last table shows what kl and min_kl do with it.
- vse ranks with w2 on unit-norm points that all carry one constant variance, which orders
  results exactly as cosine does. Its log-det is constant, so log-det rejection of vse equals
  random exactly (a check of the rejection code, not a finding).
- kl is asymmetric. Training scores every pair by -KL(image || caption); evaluation, like the
  service, ranks by KL(query || gallery), which for t2i is KL(caption || image), the reverse
  of training. The kl_reverse row of gcie-kl has t2i ranked as trained (its i2t is reversed).
- mahalanobis uses the gallery item's variance. For gce t2i and gie i2t the gallery is the
  point modality (constant variance), so those directions rank by Euclidean distance of the
  means and the learned variance plays no part in their ranking.
- AUPRC is the mean precision over the fraction of queries kept; random rejection scores the
  plain accuracy (R@1 or R@10 as a fraction). Deciles: R@1 (%) of the most certain tenth (d1)
  and least certain tenth (d10) of the queries; a useful uncertainty has d1 > d10. MI T: the
  temperature of the MI column, chosen on the val split. R@1 AUPRC rests on few correct
  queries (R@1 x 300 for i2t), so gaps of about 0.01 there are noise; R@10 is steadier.
- Crop experiment (Pishdad et al. 4.6): is part A closer to its own caption "A" than to "A and
  B" (A column), and the union to "A and B" (A+B column); mean log-det of each view, and the
  log-det (mean ± std) over the whole test galleries. With D=32 and variances bounded to
  [0.1, 10], log-det lies in [-73.7, 73.7]; a point modality has 0.
- Small budget, one seed: one test image of R@1 i2t is 0.33 points and one caption of t2i
  0.07; differences of a point or two are within what another seed would move.
"""


def render(args: argparse.Namespace, reports: dict[str, dict], timings: dict) -> str:
    """The whole of docs/results.md."""
    retrieval = ["model", "metric", *(f"{k} {d}" for k in RETRIEVAL.values() for d in DIRECTIONS)]
    methods = [LABELS[m] for m in ("random", *UNCERTAINTIES)]
    reject = [f"{m} {at}" for at in ("R@1", "R@10") for m in methods]
    reject += [f"{LABELS[m]} {b}" for m in UNCERTAINTIES for b in ("d1", "d10")]
    crop = [f"{d} {p}" for d in DIRECTIONS for p in ("A", "A+B")]
    crop += [f"log-det {m} {p}" for m in ("img", "txt") for p in ("A", "A+B")]
    crop += ["log-det test images", "log-det test captions"]
    tables = {
        "retrieval": table(retrieval, retrieval_rows(reports, extra=False)),
        "rejection": table(["model", "dir", "MI T", *reject], rejection_rows(reports)),
        "crop": table(["model", "tuples", *crop], crop_rows(reports)),
        "extra": table(retrieval, retrieval_rows(reports, extra=True)),
        "setup": setup_lines(args, reports, timings),
        "findings": findings(reports),
    }
    texts = {name: "\n".join(lines) for name, lines in tables.items()}
    return TEMPLATE.format(generator=COMMAND, command=args.command, **texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=3000, help="shapes images to generate")
    parser.add_argument("--epochs", type=int, default=12, help="training epochs of every model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "model_comparison")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "results.md")
    parser.add_argument("--img-dir", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    args.command = " ".join([COMMAND, *sys.argv[1:]])
    # One torch thread: results then do not depend on the core count (two threads change the
    # float reduction order), and on a shared 2-core machine two threads ran 5-10x slower.
    torch.set_num_threads(1)
    timings_path = args.work_dir / "timings.json"
    timings = json.loads(timings_path.read_text()) if timings_path.is_file() else {}
    data = prepare_data(args.work_dir, args.images, args.seed, timings)
    models = {
        r.name: train_run(r, data, args.work_dir, args.epochs, args.seed, timings) for r in RUNS
    }
    timings_path.write_text(json.dumps(timings, indent=1) + "\n")
    started = time.perf_counter()
    reports = {
        r.name: evaluate_run(r, models[r.name], data, args.work_dir, args.seed) for r in RUNS
    }
    timings["eval"] = time.perf_counter() - started
    plot_rejection(reports, args.img_dir / "rejection.png")
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text(render(args, reports, timings))
    print(f"wrote {args.doc} and {args.img_dir / 'rejection.png'}")


if __name__ == "__main__":
    main()
