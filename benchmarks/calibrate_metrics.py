"""Seconds for `probsearch calibrate` (indexer.calibration.run_calibration) on a demo build's
two galleries in three layouts: two-thread pools, one metric at a time (the clip-art demo's
build before it switched); the batch budget's one-thread pools, one metric at a time; and
one-thread pools with `concurrent_batches` metrics at once (each_metric); and whether
calibration.json comes out byte-identical. Writes a Markdown table to --out.

    python benchmarks/calibrate_metrics.py --demo-dir .cache/demo

Each run calibrates a fresh copy of the active version dirs. The two settings alternate within
each round, in one process, so a drift of the shared machine reaches both alike.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from result_header import (
    ROOT,
    alternated_rounds,
    result_header,
    settings_rows,
    write_results,
)

import indexer.calibration as calibration
from indexer.calibration import CalibrationJob, Target, run_calibration
from indexer.registry import ActiveRegistry
from indexer.threads import apply_thread_budget
from models.threads import ThreadBudget, concurrent_batches

TARGET = Target(coverage=0.8)  # the clip-art demo's
EACH_METRIC = calibration.each_metric


def calibrate(version_dir: Path, demo_dir: Path, threads: int, workers: int) -> tuple[float, bytes]:
    """Seconds to calibrate a copy of `version_dir` on pools of `threads` (torch, FAISS, ONNX
    Runtime) with `workers` metrics at once (the query encoding as shipped,
    concurrent_batches chunks at once), and the calibration.json it wrote."""
    apply_thread_budget(ThreadBudget(threads))
    calibration.each_metric = lambda calibrated, metrics, _: EACH_METRIC(
        calibrated, metrics, workers
    )
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / version_dir.name
        shutil.copytree(version_dir, copy)
        job = CalibrationJob(
            version_dir=copy, model_dir=demo_dir / "model", data_dir=demo_dir / "data",
            target=TARGET, mc_samples=16, threads=ThreadBudget(threads), device="cpu",
        )  # fmt: skip
        start = time.perf_counter()
        run_calibration(job)
        return time.perf_counter() - start, (copy / "calibration.json").read_bytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-dir", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/calibrate_metrics.md"
    )
    args = parser.parse_args()
    started, load = time.perf_counter(), os.getloadavg()
    registry = ActiveRegistry(args.demo_dir / "indexes", None)
    versions = {g: registry.version_path(g, registry.active_version(g)) for g in ("image", "text")}
    settings = ((2, 1), (1, 1), (1, concurrent_batches(ThreadBudget(1))))  # (threads, workers)
    seconds, written = alternated_rounds(
        args.rounds, settings, list(versions),
        lambda setting, gallery: calibrate(versions[gallery], args.demo_dir, *setting),
    )  # fmt: skip
    identical = all(written[s, g] == written[settings[0], g] for s in settings for g in versions)
    title = "Calibration's metrics: one at a time against several at once"
    lines = [
        *result_header(title, load, started),
        "",
        f"`run_calibration` on copies of the active versions of `{args.demo_dir}` (the val "
        "split, 16 MC draws, every metric the version serves), the query encoding included; "
        f"seconds per round. calibration.json byte-identical between the layouts: {identical}.",
        "",
        "| threads a pool | metrics at once | image gallery, caption queries (s) "
        "| text gallery, image queries (s) |",
        "| ---: | ---: | --- | --- |",
    ]
    lines += settings_rows(settings, list(versions), seconds, lambda s: f"{s[0]} | {s[1]}")
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
