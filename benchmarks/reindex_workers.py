"""Items a second that a local reindex embeds (indexer.embed.embed_gallery with OnnxEncoder,
as indexer.publish calls them) on a demo build's model and data, with the batch budget's
one-thread pools: one batch a call against `concurrent_batches` batches a call, which the
encoder runs at once; and how far the embeddings of the two differ. Writes a Markdown table to
--out.

    python benchmarks/reindex_workers.py --demo-dir .cache/demo

The two settings alternate within each round, in one process, so a drift of the shared
machine reaches both alike.
"""

from __future__ import annotations

import argparse
import itertools
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
from timed_embedding import timed_embedding

from indexer.sources import open_source
from indexer.threads import apply_thread_budget
from models.onnx import ENCODE_BATCH
from models.onnx.encoder_runtime import OnnxEncoder
from models.threads import ThreadBudget, concurrent_batches


def embed(demo_dir: Path, modality: str, count: int, workers: int) -> tuple[float, np.ndarray]:
    """Items a second over the first `count` items of the demo's data, and their mu."""
    threads = ThreadBudget(1)
    encoder = OnnxEncoder(
        demo_dir / "model", modality, "cpu", ENCODE_BATCH, threads, workers=workers
    )
    items = itertools.islice(open_source(demo_dir / "data", modality).items(), count)
    rate, arrays = timed_embedding(items, encoder, modality, count, ENCODE_BATCH * workers)
    return rate, arrays["mu"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-dir", type=Path, required=True)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--captions", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/reindex_workers.md")
    args = parser.parse_args()
    started, load = time.perf_counter(), os.getloadavg()
    apply_thread_budget(ThreadBudget(1))
    counts = {"image": args.images, "text": args.captions}
    settings = (1, concurrent_batches(ThreadBudget(1)))
    rates, mus = alternated_rounds(
        args.rounds, settings, list(counts),
        lambda workers, modality: embed(args.demo_dir, modality, counts[modality], workers),
    )  # fmt: skip
    worst = max(float(np.abs(mus[settings[0], m] - mus[settings[1], m]).max()) for m in counts)
    lines = [
        *result_header("Local reindex: one batch a call against batches at once", load, started),
        "",
        f"The first {args.images} drawings and {args.captions} captions of `{args.demo_dir}`'s "
        f"data through embed_gallery and OnnxEncoder (batches of {ENCODE_BATCH}, one-thread "
        f"pools, no MC draws); items a second per round. Largest |difference| of mu between "
        f"the settings: {worst:.1e}.",
        "",
        "| batches at once | drawings a second | captions a second |",
        "| ---: | --- | --- |",
    ]
    lines += settings_rows(settings, list(counts), rates)
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
