"""Render an evaluation report (models.evaluate) as JSON, Markdown and PNG plots (Agg backend)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

REPORT_JSON = "report.json"
REPORT_MARKDOWN = "report.md"


def _json_safe(value: Any) -> Any:
    """NaN and infinity become null (strict JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _mi_methods(rejection: dict) -> list[str]:
    return [m for m in rejection if m.startswith("mi_")]


def _best_mi(rejection: dict, at: str) -> str | None:
    methods = _mi_methods(rejection)
    return max(methods, key=lambda m: rejection[m][at]["auprc"]) if methods else None


def _retrieval_section(report: dict) -> list[str]:
    keys = [
        "R@1",
        "R@5",
        "R@10",
        "rsum",
        "median_rank",
        "r_precision",
        "pmrp_zeta0",
        "pmrp_zeta1",
        "pmrp_zeta2",
        "pmrp",
    ]
    rows = []
    for metric, result in report["metrics"].items():
        for direction in ("i2t", "t2i"):
            retrieval = result[direction]["retrieval"]
            rows.append([metric, direction, *(_fmt(retrieval.get(k)) for k in keys)])
    header = [
        "metric",
        "direction",
        "R@1",
        "R@5",
        "R@10",
        "rsum",
        "med r",
        "R-P",
        "PMRP ζ=0",
        "PMRP ζ=1",
        "PMRP ζ=2",
        "PMRP",
    ]
    total = ", ".join(f"{m}: {_fmt(r['rsum'])}" for m, r in report["metrics"].items())
    return [
        "## Retrieval (%)",
        "",
        *_table(header, rows),
        "",
        f"rsum over both directions: {total}.",
        "",
    ]


def _verdict(rejection: dict, method: str, at: str) -> str:
    mi, chance = rejection[method][at]["auprc"], rejection["random"][at]["auprc"]
    word = "beats" if mi > chance else "ties with" if mi == chance else "does NOT beat"
    return f"MI ({method}) {word} random on {at} AUPRC ({mi:.3f} vs {chance:.3f})"


def _rejection_section(report: dict) -> list[str]:
    rows, verdicts = [], []
    for metric, result in report["metrics"].items():
        for direction in ("i2t", "t2i"):
            rejection = result[direction]["rejection"]
            for method, entry in rejection.items():
                rows.append(
                    [
                        metric,
                        direction,
                        method,
                        _fmt(entry["R@1"]["auprc"], 3),
                        _fmt(entry["R@10"]["auprc"], 3),
                    ]
                )
            best = _best_mi(rejection, "R@1")
            if best is None:
                verdicts.append(f"- {metric} {direction}: no MI (needs --mc-samples >= 2).")
                continue
            verdicts.append(
                f"- {metric} {direction}: "
                + ", ".join(_verdict(rejection, best, at) for at in ("R@1", "R@10"))
            )
    header = ["metric", "direction", "reject by", "AUPRC R@1", "AUPRC R@10"]
    return [
        "## Rejection (precision vs fraction of queries kept)",
        "",
        "AUPRC is the mean precision over coverage; random rejection scores the accuracy.",
        "",
        *_table(header, rows),
        "",
        *verdicts,
        "",
    ]


def _decile_section(report: dict) -> list[str]:
    lines = ["## R@1 per uncertainty decile (decile 1 = most certain)", ""]
    for metric, result in report["metrics"].items():
        for direction in ("i2t", "t2i"):
            rejection = result[direction]["rejection"]
            methods = [m for m in rejection if "deciles" in rejection[m]]
            bins = len(rejection[methods[0]]["deciles"]["accuracy"]) if methods else 0
            header = ["reject by", *(str(b + 1) for b in range(bins))]
            rows = [
                [m, *(_fmt(100 * a, 1) for a in rejection[m]["deciles"]["accuracy"])]
                for m in methods
            ]
            lines += [f"{metric} {direction}:", "", *_table(header, rows), ""]
    return lines


def _crop_section(report: dict) -> list[str]:
    crop = report.get("crop") or {}
    if not crop.get("metrics"):
        return ["## Crop experiment", "", crop.get("note", "not run"), ""]
    rows = []
    for metric, result in crop["metrics"].items():
        for direction in ("i2t", "t2i"):
            acc = result[direction]
            rows.append(
                [metric, direction, _fmt(acc["part_a"]), _fmt(acc["union"]), _fmt(acc["overall"])]
            )
    log_det_rows = [
        [modality, _fmt(v["part_a"]), _fmt(v["union"])]
        for modality, v in crop["mean_log_det"].items()
    ]
    return [
        "## Crop experiment (part A vs union A+B)",
        "",
        f"{crop['tuples']} tuples; binary selection accuracy (%):",
        "",
        *_table(["metric", "direction", "part A", "union A+B", "overall"], rows),
        "",
        "Mean log-det:",
        "",
        *_table(["modality", "part A", "union A+B"], log_det_rows),
        "",
    ]


def markdown_report(report: dict, plots: list[str] | None = None) -> str:
    """The report as Markdown: retrieval, rejection, deciles, crop experiment, log-det, plots."""
    model, data = report["model"], report["data"]
    settings = report["settings"]
    lines = [
        f"# Evaluation of {model['name']} ({model['model_type']})",
        "",
        f"Model `{model['dir']}` on `{data['dir']}` split **{data['split']}** "
        f"({data['images']} images, {data['captions']} captions); "
        f"{settings['mc_samples']} MC draws, seed {settings['seed']}, "
        f"MI over the top {settings['shortlist_size']}.",
        "",
    ]
    lines += _retrieval_section(report) + _rejection_section(report)
    lines += _decile_section(report) + _crop_section(report)
    lines += [
        "## Log-det per modality",
        "",
        *_table(
            ["modality", "mean", "std"],
            [[m, _fmt(v["mean"]), _fmt(v["std"])] for m, v in report["log_det"].items()],
        ),
        "",
    ]
    if plots:
        lines += ["## Plots", "", *(f"![{p}]({p})" for p in plots), ""]
    return "\n".join(lines)


def _plot_precision_coverage(rejection: dict, title: str, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, at in zip(axes, ("R@1", "R@10"), strict=True):
        for method, entry in rejection.items():
            style = "--" if method == "random" else "-"
            label = f"{method} ({entry[at]['auprc']:.3f})"
            ax.plot(entry[at]["coverage"], entry[at]["precision"], style, label=label)
        ax.set(
            title=f"{title}: precision of {at}",
            xlabel="fraction of queries kept",
            ylabel="precision",
            xlim=(0, 1),
            ylim=(0, 1.02),
        )
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_deciles(rejection: dict, title: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, entry in rejection.items():
        if "deciles" in entry:
            accuracy = entry["deciles"]["accuracy"]
            ax.plot(range(1, len(accuracy) + 1), [100 * a for a in accuracy], "o-", label=method)
    ax.set(
        title=f"{title}: R@1 per uncertainty decile",
        xlabel="decile (1 = most certain)",
        ylabel="R@1 (%)",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_log_det(report: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for modality, summary in report["log_det"].items():
        edges, counts = summary["histogram"]["edges"], summary["histogram"]["counts"]
        ax.stairs(counts, edges, fill=True, alpha=0.5, label=modality)
    ax.set(title="log det(Σ) per item", xlabel="log-det", ylabel="items")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plots(report: dict, out_dir: Path) -> list[str]:
    """Precision-coverage curves and decile plots per metric and direction, log-det histograms;
    returns the file names written in out_dir."""
    names = []
    for metric, result in report["metrics"].items():
        for direction in ("i2t", "t2i"):
            rejection = result[direction]["rejection"]
            title = f"{metric} {direction}"
            name = f"precision_coverage_{metric}_{direction}.png"
            _plot_precision_coverage(rejection, title, out_dir / name)
            names.append(name)
            name = f"r1_by_decile_{metric}_{direction}.png"
            _plot_deciles(rejection, title, out_dir / name)
            names.append(name)
    _plot_log_det(report, out_dir / "log_det_histogram.png")
    return [*names, "log_det_histogram.png"]


def write_report(report: dict, out_dir: Path | str) -> list[Path]:
    """Write report.json, report.md and the PNG plots into out_dir (created if needed)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = write_plots(report, out_dir)
    json_path, markdown_path = out_dir / REPORT_JSON, out_dir / REPORT_MARKDOWN
    json_path.write_text(json.dumps(_json_safe(report), indent=1, allow_nan=False) + "\n")
    markdown_path.write_text(markdown_report(report, plots))
    return [json_path, markdown_path, *(out_dir / p for p in plots)]
