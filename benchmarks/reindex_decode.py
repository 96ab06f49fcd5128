"""Drawings a second that a local reindex embeds (indexer.embed.embed_gallery with OnnxEncoder,
set up as indexer.publish sets it up) with the images decoded one at a time in the embedding
thread against `decode_threads` at a time, and whether the embeddings differ. Writes a
Markdown table to --out.

    python benchmarks/reindex_decode.py --demo-dir .cache/demo

The settings alternate within each round, in one process, so a drift of the shared machine
reaches both alike.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from pathlib import Path

import numpy as np
from result_header import ROOT, alternated_rounds, result_header, settings_rows, write_results
from timed_embedding import timed_embedding

from indexer.sources import open_source
from indexer.threads import apply_thread_budget
from models.onnx import ENCODE_BATCH
from models.onnx.encoder_runtime import OnnxEncoder
from models.threads import concurrent_batches, thread_budget


def embed(encoder: OnnxEncoder, items: list, workers: int, decode_threads: int) -> tuple:
    """Drawings a second over `items`, and their mu."""
    rate, arrays = timed_embedding(
        items, encoder, "image", len(items), ENCODE_BATCH * workers, decode_threads
    )
    return rate, arrays["mu"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-dir", type=Path, required=True)
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/reindex_decode.md")
    args = parser.parse_args()
    started, load = time.perf_counter(), os.getloadavg()
    threads = apply_thread_budget(thread_budget("batch"))
    workers = concurrent_batches(threads)
    encoder = OnnxEncoder(
        args.demo_dir / "model", "image", "cpu", ENCODE_BATCH, threads, workers=workers
    )
    source = open_source(args.demo_dir / "data", "image")
    items = list(itertools.islice(source.items(), args.images))
    embed(encoder, items[: ENCODE_BATCH * workers], workers, 1)
    settings = (1, workers * threads.intra_op)
    rates, mus = alternated_rounds(
        args.rounds, settings, ["image"],
        lambda decode_threads, _: embed(encoder, items, workers, decode_threads),
    )  # fmt: skip
    gap = float(np.abs(mus[settings[0], "image"] - mus[settings[1], "image"]).max())
    lines = [
        *result_header("Local reindex: images decoded one at a time or in threads", load, started),
        "",
        f"The first {args.images} drawings of `{args.demo_dir}`'s data through embed_gallery "
        f"and OnnxEncoder as indexer.publish runs them ({workers} batches of {ENCODE_BATCH} a "
        f"call, ONNX threads {threads.intra_op} each; one unmeasured call first); drawings a "
        f"second per round. Largest |difference| of mu between the settings: {gap:.1e}.",
        "",
        "| decode threads | drawings a second |",
        "| ---: | --- |",
        *settings_rows(settings, ["image"], rates),
    ]
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
