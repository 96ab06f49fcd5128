"""Milliseconds per caption for the served text encoder of a demo build (16 MC draws, one
ONNX Runtime thread) on batches of the test split's captions, the way the service's micro-batches
reach it: each batch in one call padded to its longest caption (the old rule), against the cut
of models.onnx.encoder_runtime.chunk_bounds; and how far the embeddings of the two differ.
Writes a Markdown table to --out.

    python benchmarks/text_chunks.py --demo-dir .cache/demo

Each caption carries a random suffix word, as the service benchmark's queries do. The two
rules alternate within each round, in one process, on the same batches, so a drift of the
shared machine reaches both alike.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import time
from pathlib import Path

import numpy as np
from result_header import ROOT, result_header

import models.onnx.encoder_runtime as runtime
from models.datasets.records import load_dataset
from models.onnx.encoder_runtime import CALL_COST_TOKENS, chunk_bounds
from models.threads import ThreadBudget

RULES = {
    "one call per batch (old)": functools.partial(chunk_bounds, call_cost=1e12),
    f"chunking, {CALL_COST_TOKENS:g} tokens a call (new)": chunk_bounds,
}


def batches_of(captions: list[str], size: int, count: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [
        [f"{c} q{rng.randint(0, 9999)}" for c in rng.sample(captions, size)] for _ in range(count)
    ]


def ms_per_caption(encoder, batches: list[list[str]], draws: int) -> tuple[float, list]:
    start, outs = time.perf_counter(), []
    for i, batch in enumerate(batches):
        outs.append(encoder.encode_texts(batch, draws, seed=i))
    return 1000 * (time.perf_counter() - start) / sum(map(len, batches)), outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-dir", type=Path, required=True)
    parser.add_argument("--sizes", default="1,4,16")
    parser.add_argument("--captions", type=int, default=640, help="captions per size and rule")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--draws", type=int, default=16)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/text_chunks.md")
    args = parser.parse_args()
    load, started = os.getloadavg(), time.perf_counter()
    captions = [c.text for c in load_dataset(args.demo_dir / "data").split("test").captions]
    encoder = runtime.OnnxEncoder(args.demo_dir / "model", "text", "cpu", threads=ThreadBudget(1))
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        batches = batches_of(captions, size, max(1, args.captions // size), seed=size)
        times: dict[str, list[float]] = {rule: [] for rule in RULES}
        outputs = {}
        for _ in range(args.rounds):
            for rule, bounds in RULES.items():
                runtime.chunk_bounds = bounds
                took, outputs[rule] = ms_per_caption(encoder, batches, args.draws)
                times[rule].append(took)
        old, new = (outputs[rule] for rule in RULES)
        worst = max(
            float(np.abs(getattr(a, f) - getattr(b, f)).max())
            for a, b in zip(old, new, strict=True)
            for f in ("mu", "logvar", "mc_mu", "mc_logvar")
        )
        medians = [float(np.median(t)) for t in times.values()]
        rows.append((size, times, medians, worst))
    lines = [
        *result_header("Caption batches cut into graph calls by length", load, started),
        "",
        f"Test captions of {args.demo_dir} with a random suffix word, {args.draws} MC draws, one "
        f"ONNX Runtime thread; ms per caption, median of {args.rounds} alternated rounds "
        "(each round in brackets); largest |difference| of any embedding value between the rules.",
        "",
        "| batch | " + " | ".join(RULES) + " | old / new | largest difference |",
        "| ---: | " + " | ".join("---" for _ in RULES) + " | ---: | ---: |",
    ]
    for size, times, medians, worst in rows:
        cells = [
            f"{m:.2f} ({', '.join(f'{t:.2f}' for t in ts)})"
            for m, ts in zip(medians, times.values(), strict=True)
        ]
        lines.append(
            f"| {size} | "
            + " | ".join(cells)
            + f" | {medians[0] / medians[1]:.2f}x | {worst:.1e} |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
