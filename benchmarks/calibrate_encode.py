"""Seconds for `probsearch calibrate` to encode a demo build's held-out queries (16 MC draws)
with one-thread ONNX Runtime pools, one chunk at a time against `concurrent_batches` chunks at
once (OnnxEncoder's workers), and whether the embeddings are identical. Writes a Markdown
table to --out.

    python benchmarks/calibrate_encode.py --demo-dir .cache/demo

The two settings alternate within each round, in one process, so a drift of the shared
machine reaches both alike.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from result_header import (
    ROOT,
    alternated_rounds,
    result_header,
    settings_rows,
    write_results,
)

from indexer.calibration import encode_queries
from models.datasets.records import load_dataset
from models.onnx.encoder_runtime import Embeddings, OnnxEncoder
from models.threads import ThreadBudget, concurrent_batches

FIELDS = ("mu", "logvar", "mc_mu", "mc_logvar", "novelty")


def same(a: Embeddings, b: Embeddings) -> bool:
    return all(
        np.array_equal(getattr(a, f), getattr(b, f))
        for f in FIELDS
        if getattr(a, f) is not None or getattr(b, f) is not None
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-dir", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/calibrate_encode.md")
    args = parser.parse_args()
    started, load = time.perf_counter(), os.getloadavg()
    val = load_dataset(args.demo_dir / "data").split("val")
    queries = {"image": val.images, "text": val.captions}
    budget = ThreadBudget(1)
    settings = (1, concurrent_batches(budget))
    encoders = {
        (w, kind): OnnxEncoder(args.demo_dir / "model", kind, "cpu", threads=budget, workers=w)
        for w in settings
        for kind in queries
    }

    def encoded(workers: int, kind: str) -> tuple[float, Embeddings]:
        start = time.perf_counter()
        out = encode_queries(encoders[workers, kind], queries[kind], 16, 0)
        return time.perf_counter() - start, out

    seconds, outputs = alternated_rounds(args.rounds, settings, list(queries), encoded)
    identical = all(same(outputs[settings[0], k], outputs[settings[1], k]) for k in queries)
    title = "Calibration's query encoding: one chunk at a time against chunks at once"
    lines = [
        *result_header(title, load, started),
        "",
        f"The val split of `{args.demo_dir}` ({len(val.images)} images, {len(val.captions)} "
        f"captions) through OnnxEncoder with 16 MC draws, one-thread pools, chunks of 32; "
        f"seconds per round. Embeddings identical between the settings: {identical}.",
        "",
        "| chunks at once | val images (s) | val captions (s) |",
        "| ---: | --- | --- |",
    ]
    lines += settings_rows(settings, list(queries), seconds)
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
