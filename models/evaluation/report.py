"""Render an evaluation report (models.evaluation.evaluate) as JSON, Markdown and PNG plots
(Agg backend)."""

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


def _retrieval_section(report: dict) -> list[str]:
    keys = ["P@1", "P@1_single_object", "r_precision", "pmrp", "R@1", "R@1_ceiling", "R@5"]
    keys += ["R@10", "median_rank"]
    header = ["metric", "direction", "P@1", "P@1 single object", "R-P", "PMRP", "R@1"]
    header += ["R@1 ceiling", "R@5", "R@10", "med r"]
    rows = [
        [metric, d, *(_fmt(result[d]["retrieval"].get(k)) for k in keys)]
        for metric, result in report["metrics"].items()
        for d in ("i2t", "t2i")
    ]
    return [
        "## Retrieval (%)",
        "",
        "P@1 and R-P (R-Precision) count a result as right when it is a plausible match (the "
        "caption names only objects the image holds); R@K counts only the exact pair, and its "
        "ceiling is what a model answering with a random plausible match would reach. "
        'P@1 single object: t2i queries naming one object by colour and shape ("a red disc").',
        "",
        *_table(header, rows),
        "",
    ]


def _score_names(section: dict) -> list[str]:
    return [name for name in section["rejection"] if name not in ("random", "oracle")]


def _rejection_section(report: dict) -> list[str]:
    rows = []
    for metric, result in report["metrics"].items():
        for direction in ("i2t", "t2i"):
            section = result[direction]
            rejection = section["rejection"]
            chance = rejection["random"]["auprc"]
            for name in _score_names(section):
                entry = rejection[name]
                rows.append(
                    [
                        metric,
                        direction,
                        name,
                        _fmt(entry["auprc"], 3),
                        _fmt(entry["normalized_auprc"], 3),
                        _fmt(chance, 3),
                        _fmt(section["ambiguity_spearman"].get(name), 2),
                    ]
                )
    header = ["metric", "direction", "score", "AUPRC", "normalised", "random", "Spearman amb."]
    return [
        "## Uncertainty scores: rejection and ambiguity",
        "",
        "AUPRC: mean precision (plausible P@1) of the kept queries over the fraction kept, "
        "rejecting the most uncertain first; normalised = (AUPRC - random) / (oracle - random). "
        "Spearman amb.: rank correlation of the score with ln(#plausible matches) of the query. "
        "top1_distance, top1_margin and top1_instability are training-free baselines ('Over the "
        "top-1', uCLIP): a learned score is worth shipping only where it beats them. "
        "top1_mean_distance is the first result's distance with the means alone: under a metric "
        "that reads the variances, top1_distance does too. "
        "total_variance (the sum of the variances, PCME++'s own uncertainty) is reported, "
        "not served.",
        "",
        *_table(header, rows),
        "",
    ]


def _ood_section(report: dict) -> list[str]:
    rows = [
        [metric, name, _fmt(value, 3), _fmt(100 * result["ood"]["rejected"][name], 1)]
        for metric, result in report["metrics"].items()
        if "ood" in result
        for name, value in result["ood"]["auroc"].items()
    ]
    if not rows:
        return []
    count = next(r["ood"]["images"] for r in report["metrics"].values() if "ood" in r)
    return [
        "## Dataset shift (image queries)",
        "",
        f"AUROC of each score for telling {count} out-of-distribution images from the split's "
        "own images (1 = every OOD image scores as more uncertain, 0.5 = chance), and the "
        "share of them rejected at the threshold that rejects 5% of the split's own images.",
        "",
        *_table(["metric", "score", "AUROC", "rejected %"], rows),
        "",
    ]


def _no_match_section(report: dict) -> list[str]:
    rows = [
        [metric, name, _fmt(value, 3), _fmt(100 * result["no_match"]["rejected"][name], 1)]
        for metric, result in report["metrics"].items()
        if result.get("no_match", {}).get("auroc")
        for name, value in result["no_match"]["auroc"].items()
    ]
    if not rows:
        return []
    first = next(r["no_match"] for r in report["metrics"].values() if r.get("no_match"))
    return [
        "## Nothing in the gallery matches (caption queries)",
        "",
        f"Half the split's images taken out of the gallery ({first['gallery_images']} kept) "
        f"leaves {first['no_match']} of {first['captions']} captions without any plausible "
        "match. AUROC of each score for telling them from the captions that still have one "
        "(1 = every caption without a match scores as more uncertain, 0.5 = chance), and the "
        "share of them rejected at the threshold that rejects 5% of the answerable captions.",
        "",
        *_table(["metric", "score", "AUROC", "rejected %"], rows),
        "",
    ]


def _decile_section(report: dict) -> list[str]:
    lines = ["## P@1 per uncertainty decile (decile 1 = most certain)", ""]
    for metric, result in report["metrics"].items():
        for direction in ("i2t", "t2i"):
            rejection = result[direction]["rejection"]
            methods = [m for m in rejection if "deciles" in rejection[m]]
            bins = len(rejection[methods[0]]["deciles"]["accuracy"]) if methods else 0
            header = ["score", *(str(b + 1) for b in range(bins))]
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
        [modality, _fmt(v["part_a"]), _fmt(v["union"]), _fmt(100 * v["a_larger"], 1)]
        for modality, v in crop["log_det"].items()
    ]
    return [
        "## Crop experiment (part A vs union A+B)",
        "",
        f"{crop['tuples']} tuples; binary selection accuracy (%):",
        "",
        *_table(["metric", "direction", "part A", "union A+B", "overall"], rows),
        "",
        "Log-det: means, and the share of tuples (%) where part A is vaguer than A+B:",
        "",
        *_table(["modality", "part A", "union A+B", "A > A+B (%)"], log_det_rows),
        "",
    ]


def markdown_report(report: dict, plots: list[str] | None = None) -> str:
    """The report as Markdown: retrieval, rejection and ambiguity, dataset shift, deciles, crop
    experiment, log-det, plots."""
    model, data = report["model"], report["data"]
    settings = report["settings"]
    lines = [
        f"# Evaluation of {model['name']} ({model['model_type']})",
        "",
        f"Model `{model['dir']}` on `{data['dir']}` split **{data['split']}** "
        f"({data['images']} images, {data['captions']} captions); "
        f"{settings['mc_samples']} MC draws, seed {settings['seed']}, "
        f"scores over the top {settings['shortlist_size']}.",
        "",
    ]
    defaults = report.get("default_metrics")
    if defaults:
        lines += [
            f"Default metrics (the service's): t2i {defaults['t2i']}, i2t {defaults['i2t']}.",
            "",
        ]
    lines += _retrieval_section(report) + _rejection_section(report) + _ood_section(report)
    lines += _no_match_section(report)
    lines += _decile_section(report) + _crop_section(report)
    rows = [
        [m, _fmt(v["mean"]), _fmt(v["std"]), _fmt(100 * v.get("at_bound", 0.0), 1)]
        for m, v in report["log_det"].items()
    ]
    lines += [
        "## Log-det per modality",
        "",
        *_table(["modality", "mean", "std", "items with a variance at a bound (%)"], rows),
        "",
    ]
    if plots:
        lines += ["## Plots", "", *(f"![{p}]({p})" for p in plots), ""]
    return "\n".join(lines)


def _plot_precision_coverage(rejection: dict, title: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, entry in rejection.items():
        style = "--" if method in ("random", "oracle") else "-"
        label = f"{method} ({entry['auprc']:.3f})"
        ax.plot(entry["coverage"], entry["precision"], style, label=label)
    ax.set(
        title=f"{title}: precision of plausible P@1",
        xlabel="fraction of queries kept",
        ylabel="precision",
        xlim=(0, 1),
        ylim=(0, 1.02),
    )
    ax.legend(fontsize=6)
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
        title=f"{title}: P@1 per uncertainty decile",
        xlabel="decile (1 = most certain)",
        ylabel="plausible P@1 (%)",
    )
    ax.legend(fontsize=6)
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
            name = f"p1_by_decile_{metric}_{direction}.png"
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
