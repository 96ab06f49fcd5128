"""The clip-art demo's model with its text backbone served as float32 and as int8 weights
(ModelConfig.text_backbone_int8, models.onnx.quantize): retrieval and rejection on val and
test over training seeds, and the text graph's time per call.

Per seed, the demo's recipe (probsearch.demo.clipart_model) is trained once; its checkpoint is
exported twice, float and int8, and both are read by `probsearch eval`'s evaluation (16 MC
draws). The heads and everything but the text backbone's weights are the same in both, so a
difference is the int8 weights'. The time per call is the whole text graph (backbone, then
heads with 16 draws) through the service's encoder, the two settings alternated per call.

    .venv/bin/python benchmarks/text_int8.py --data .cache/demo/data \\
        --out benchmarks/results/text_int8.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
from result_header import ROOT, result_header

from models.datasets.records import load_dataset
from models.evaluation.evaluate import EvalConfig, evaluate_model
from models.networks.model_config import ModelConfig
from models.onnx.encoder_runtime import OnnxEncoder
from models.onnx.export import export_model_dir
from models.onnx.quantize import row_cosines
from models.threads import ThreadBudget
from models.training.train import train
from probsearch.demo import CLIPART_PLAN, clipart_model

SETTINGS = ("float", "int8")
SPLITS = ("val", "test")
# (label, direction, path into the direction's report): the figures compared.
FIGURES = (
    ("P@1", "t2i", ("retrieval", "P@1")),
    ("R-P", "t2i", ("retrieval", "r_precision")),
    ("P@1", "i2t", ("retrieval", "P@1")),
    ("R-P", "i2t", ("retrieval", "r_precision")),
    ("nAUPRC top_mahalanobis", "t2i", ("rejection", "top_mahalanobis", "normalized_auprc")),
    ("nAUPRC top-1 dist.", "t2i", ("rejection", "top1_distance", "normalized_auprc")),
    ("nAUPRC top_mahalanobis", "i2t", ("rejection", "top_mahalanobis", "normalized_auprc")),
    ("Spearman log-det", "t2i", ("ambiguity_spearman", "log_det")),
)
PERCENT = {"P@1", "R-P"}


def model_dirs(data: Path, work: Path, seed: int) -> dict[str, Path]:
    """The seed's demo model trained once (reused when its checkpoint exists), exported float
    and int8."""
    dirs = {setting: work / f"seed{seed}" / setting for setting in SETTINGS}
    if not (dirs["float"] / "checkpoint.pt").is_file():
        model, training = clipart_model(dataclasses.replace(CLIPART_PLAN, seed=seed))
        model = model.replace(text_backbone_int8=False)
        train(data, dirs["float"], model, training, progress=False, log=lambda _: None)
    if not (dirs["int8"] / "text_encoder.onnx").is_file():
        shutil.rmtree(dirs["int8"], ignore_errors=True)
        shutil.copytree(dirs["float"], dirs["int8"])
        ModelConfig.load(dirs["int8"]).replace(text_backbone_int8=True).save(dirs["int8"])
        export_model_dir(dirs["int8"])
    return dirs


def figures(model_dir: Path, data: Path, split: str) -> dict[str, float]:
    report = evaluate_model(model_dir, data, split, EvalConfig(mc_samples=16))
    metric = report["default_metrics"]["t2i"]
    out = {}
    for label, direction, path in FIGURES:
        value = report["metrics"][metric][direction]
        for key in path:
            value = value[key]
        out[f"{direction} {label}"] = value  # the report's retrieval figures are in %
    return out


def mean_cosines(dirs: dict[str, Path], data: Path, split: str) -> tuple[float, float]:
    """(mean, min) over the split's captions of the cosine between the float and the int8
    graph's caption means (the deterministic pass)."""
    captions = [c.text for c in load_dataset(data, split).captions]
    mu = {
        s: OnnxEncoder(d, "text", device="cpu").encode_texts(captions).mu for s, d in dirs.items()
    }
    cosines = row_cosines(mu["float"], mu["int8"])
    return float(cosines.mean()), float(cosines.min())


def call_times(dirs: dict[str, Path], captions: list[str], batch: int, calls: int) -> dict:
    """Median ms per encode_texts call of `batch` captions with 16 draws, one ONNX Runtime
    thread, the two graphs alternated call by call."""
    encoders = {
        s: OnnxEncoder(d, "text", device="cpu", threads=ThreadBudget(1)) for s, d in dirs.items()
    }
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {s: [] for s in SETTINGS}
    for call in range(calls + 5):
        chosen = [captions[i] for i in rng.choice(len(captions), batch)]
        for setting in SETTINGS if call % 2 == 0 else SETTINGS[::-1]:
            started = time.perf_counter()
            encoders[setting].encode_texts(chosen, mc_samples=16, seed=list(range(batch)))
            if call >= 5:
                times[setting].append(1e3 * (time.perf_counter() - started))
    return {s: statistics.median(t) for s, t in times.items()}


def cell(values: list[float], digits: int) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"


def write(
    out: Path, header: list[str], seeds: list[int], results: dict, cosines: dict, times: dict
) -> None:
    names = [f"{direction} {label}" for label, direction, _ in FIGURES]
    lines = [
        *header,
        "",
        f"Training seeds {seeds}; mean ± sd over them. Retrieval in %, metric w2 (the demo's);",
        "nAUPRC of rejecting the most uncertain queries first; Spearman of the caption log-det",
        "with ln(#plausible drawings). Both columns of a seed share its trained heads.",
    ]
    for split in SPLITS:
        lines += ["", f"## {split}", "", "| figure | float | int8 | int8 - float |",
                  "| --- | --- | --- | --- |"]  # fmt: skip
        for name in names:
            digits = 1 if name.split()[1] in PERCENT else 3
            per = {s: [results[seed, s, split][name] for seed in seeds] for s in SETTINGS}
            gaps = [b - a for a, b in zip(per["float"], per["int8"], strict=True)]
            lines.append(
                f"| {name} | {cell(per['float'], digits)} | {cell(per['int8'], digits)} | "
                f"{cell(gaps, digits)} |"
            )
    lines += [
        "",
        "## Caption means, int8 against float (val, deterministic pass)",
        "",
        "| seed | mean cosine | min cosine |",
        "| --- | --- | --- |",
        *(f"| {seed} | {mean:.4f} | {low:.4f} |" for seed, (mean, low) in cosines.items()),
    ]
    lines += [
        "",
        "## Time per call (ms, median; whole text graph, 16 draws, 1 thread)",
        "",
        "| captions per call | float | int8 | float / int8 |",
        "| --- | --- | --- | --- |",
    ]
    for batch, medians in times.items():
        ratio = medians["float"] / medians["int8"]
        lines.append(f"| {batch} | {medians['float']:.2f} | {medians['int8']:.2f} | {ratio:.2f} |")
    out.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the clip-art dataset dir")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--calls", type=int, default=200, help="timed calls per batch size")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "text_int8")
    parser.add_argument("--out", type=Path, default=Path("/dev/stdout"))
    args = parser.parse_args()
    load, started = os.getloadavg(), time.perf_counter()
    seeds = [int(s) for s in args.seeds.split(",")]
    results, cosines, dirs = {}, {}, {}
    for seed in seeds:
        dirs = model_dirs(args.data, args.work_dir, seed)
        cosines[seed] = mean_cosines(dirs, args.data, "val")
        for setting in SETTINGS:
            for split in SPLITS:
                results[seed, setting, split] = figures(dirs[setting], args.data, split)
                print(seed, setting, split, json.dumps(results[seed, setting, split]), flush=True)
    lines = (args.data / "captions.jsonl").read_text().splitlines()
    captions = [json.loads(line)["text"] for line in lines]
    times = {batch: call_times(dirs, captions, batch, args.calls) for batch in (1, 8)}
    header = result_header("The demo's text backbone as float32 and as int8 weights", load, started)
    write(args.out, header, seeds, results, cosines, times)


if __name__ == "__main__":
    main()
