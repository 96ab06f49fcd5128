"""GPU encoder check: the demo's pretrained encoders on ONNX Runtime's CUDA provider against its
CPU provider. The service's rule (`device="auto"`) must pick CUDA when ONNX Runtime offers it;
both devices must give the same embeddings and MC draws; and the check times the two paths
that encode: a reindex (indexer.embed.embed_gallery, as `probsearch index build` embeds) and a
query (one caption or one drawing with 16 MC draws, as the service encodes a lone query).
Writes a Markdown file to --out.

    python benchmarks/gpu_encoder_check.py --model .cache/demo/model \
        --images DIR_OF_PNGS --captions CAPTIONS.jsonl --out gpu_encoder_check.md

Run it where ONNX Runtime has a CUDA provider (onnxruntime-gpu); elsewhere it says so and
times the CPU alone.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from pathlib import Path

import numpy as np
from result_header import result_header, write_results
from timed_embedding import timed_embedding

from indexer.sources import open_source
from models.onnx import ENCODE_BATCH
from models.onnx.encoder_runtime import OnnxEncoder
from models.threads import ThreadBudget, configure_torch_threads

MC_SAMPLES = 16
QUERY_REPEATS = 40


def reindex(
    encoder: OnnxEncoder, source: Path, modality: str, count: int, decode_threads: int
) -> tuple[float, dict]:
    """Items a second through embed_gallery, after one unmeasured batch (the CUDA provider
    picks its convolution algorithms on its first call), and the embeddings of the run."""
    items = list(itertools.islice(open_source(source, modality).items(), count))
    timed_embedding(items[:ENCODE_BATCH], encoder, modality, ENCODE_BATCH)
    return timed_embedding(items, encoder, modality, len(items), decode_threads=decode_threads)


def lone_query(encoder: OnnxEncoder, query, modality: str) -> tuple[float, dict]:
    """Median ms of one query's encoding with its MC draws, and the last answer."""
    encode = encoder.encode_texts if modality == "text" else encoder.encode_images
    encode([query], mc_samples=MC_SAMPLES, seed=7)
    times = []
    for _ in range(QUERY_REPEATS):
        start = time.perf_counter()
        answer = encode([query], mc_samples=MC_SAMPLES, seed=7)
        times.append((time.perf_counter() - start) * 1e3)
    out = {"mu": answer.mu, "logvar": answer.logvar, "mc_mu": answer.mc_mu}
    return statistics.median(times), out


def largest_gap(a: dict, b: dict) -> float:
    """Largest |a - b| over the arrays both hold, relative to 1 + |a|."""
    return max(
        float((np.abs(a[k] - b[k]) / (1 + np.abs(a[k]))).max())
        for k in a
        if a[k] is not None and b.get(k) is not None
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--images", type=Path, required=True, help="a folder of drawings")
    parser.add_argument("--captions", type=Path, required=True, help="a captions .jsonl")
    parser.add_argument("--count", type=int, default=1024)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started, load = time.perf_counter(), os.getloadavg()
    import onnxruntime as ort
    import torch

    cpus = os.cpu_count() or 1
    configure_torch_threads(ThreadBudget(1))
    devices = {
        f"CPU, {cpus} threads": ("cpu", cpus, cpus),
        **({"CPU, 2 threads": ("cpu", 2, 2)} if cpus > 2 else {}),
        "auto": ("auto", cpus, cpus),
        "auto, drawings decoded in one thread": ("auto", cpus, 1),
    }
    sources = {"image": args.images, "text": args.captions}
    caption = next(iter(open_source(args.captions, "text").items())).text
    drawing = next(iter(open_source(args.images, "image").items())).path
    from PIL import Image

    queries = {"text": caption, "image": Image.open(drawing).convert("RGB")}
    rows, providers, outputs = [], {}, {}
    for label, (device, threads, decode_threads) in devices.items():
        cells = []
        for modality in ("image", "text"):
            encoder = OnnxEncoder(
                args.model,
                modality,
                device,
                ENCODE_BATCH,
                ThreadBudget(threads),  # type: ignore[arg-type]
            )
            providers[label, modality] = encoder.provider
            rate, embedded = reindex(
                encoder, sources[modality], modality, args.count, decode_threads
            )
            ms, answer = lone_query(encoder, queries[modality], modality)
            outputs[label, modality] = (embedded, answer)
            cells += [f"{rate:.0f}", f"{ms:.2f}"]
            print(label, modality, encoder.provider, f"{rate:.0f}/s", f"{ms:.2f} ms", flush=True)
        rows.append(f"| {label} ({providers[label, 'image']}) | " + " | ".join(cells) + " |")
    base = f"CPU, {cpus} threads"
    gaps = {
        modality: (
            largest_gap(outputs[base, modality][0], outputs["auto", modality][0]),
            largest_gap(outputs[base, modality][1], outputs["auto", modality][1]),
        )
        for modality in ("image", "text")
    }
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU seen by torch"
    lines = [
        *result_header("GPU encoder check: ONNX Runtime CUDA against CPU", load, started),
        "",
        f"GPU: {gpu}; onnxruntime {ort.__version__}, providers {ort.get_available_providers()}; "
        f"torch {torch.__version__}.",
        f"Model: `{args.model}` (image: {providers['auto', 'image']}, text: "
        f"{providers['auto', 'text']} under device auto).",
        "",
        f"Reindex: the first {args.count} drawings and captions through embed_gallery (batches "
        f"of {ENCODE_BATCH}, no draws, drawings decoded in as many threads as the row's CPU "
        f"threads unless it says otherwise), items a second, after one unmeasured batch. "
        f"Query: one item with {MC_SAMPLES} MC draws, median of {QUERY_REPEATS} ms.",
        "",
        "| device (provider) | reindex drawings/s | drawing query ms | reindex captions/s "
        "| caption query ms |",
        "| --- | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        "Largest gap between auto and the CPU, |a - b| / (1 + |a|), over mu, logvar and the "
        "draws' mu:",
        "",
        "| modality | reindex embeddings | query and its draws |",
        "| --- | --- | --- |",
        *(f"| {m} | {g[0]:.1e} | {g[1]:.1e} |" for m, g in gaps.items()),
    ]
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
