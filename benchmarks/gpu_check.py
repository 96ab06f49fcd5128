"""GPU check: the exact re-rank and the uncertainty scores give the same answers on CUDA as
on CPU, and how long each takes, for every metric with an exact index; plus which ONNX
Runtime providers and FAISS GPU support the machine has. Needs a machine with a GPU.

    python benchmarks/gpu_check.py --out benchmarks/results/gpu_check.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.scoring.query_scores import shortlist_scores
from models.scoring.rerank import exact_rerank

METRICS = ("w2", "csd", "kl", "kl_reverse", "js", "mahalanobis", "min_kl")
GALLERY, DIM, SHORTLIST, DRAWS, QUERIES, REPEATS = 100_000, 32, 100, 16, 64, 20


def timed(fn, repeats: int = REPEATS) -> tuple[object, float]:
    """fn's result and its median wall time in ms (CUDA synchronised), after one warm-up."""
    result, times = fn(), []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return result, float(np.median(times))


def check_metric(metric: str, rng: np.random.Generator) -> list[str]:
    mu = rng.standard_normal((GALLERY, DIM)).astype(np.float32)
    logvar = rng.uniform(-4, 0, (GALLERY, DIM)).astype(np.float32)
    rows = rng.choice(GALLERY, SHORTLIST, replace=False)
    cells = [metric]
    ranked = {}
    for name in ("cpu", "cuda"):
        device = torch.device(name)
        ranked[name], ms = timed(
            lambda d=device: exact_rerank(metric, mu[0], logvar[0], mu, logvar, rows, 10, d)
        )
        cells.append(f"{ms:.2f}")
    same = np.array_equal(ranked["cpu"].rows, ranked["cuda"].rows)
    gap = (ranked["cpu"].distances - ranked["cuda"].distances.cpu()).abs().max().item()
    cells += [str(same), f"{gap:.1e}"]
    scores = {}
    for name in ("cpu", "cuda"):
        device = torch.device(name)
        q = [torch.from_numpy(x[:QUERIES]).to(device) for x in (mu, logvar)]
        draws = [
            torch.from_numpy(x[:QUERIES]).to(device).expand(DRAWS, -1, -1) for x in (mu, logvar)
        ]
        cand = [torch.from_numpy(x[rows]).to(device).expand(QUERIES, -1, -1) for x in (mu, logvar)]
        scores[name], ms = timed(
            lambda q=q, d=draws, c=cand: shortlist_scores(metric, tuple(q), tuple(d), tuple(c), 1.0)
        )
        cells.append(f"{ms:.2f}")
    gap = np.abs(scores["cpu"].mutual_information - scores["cuda"].mutual_information).max()
    cells.append(f"{gap:.1e}")
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: this check needs a GPU")
    torch.set_num_threads(1)
    import onnxruntime

    try:
        import faiss

        faiss_gpus = f"faiss {faiss.__version__}, GPUs seen: {faiss.get_num_gpus()}"
    except ImportError as exc:
        faiss_gpus = f"faiss not importable here ({exc})"
    rng = np.random.default_rng(0)
    rows = [check_metric(m, rng) for m in METRICS]
    lines = [
        "# GPU check: exact re-rank and uncertainty scores, CUDA against CPU",
        "",
        f"Command: `python benchmarks/gpu_check.py --out {args.out}`; machine: "
        f"{platform.machine()}, {os.cpu_count()} CPUs, {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__} (1 CPU thread); load (1 min) {os.getloadavg()[0]:.1f}.",
        f"ONNX Runtime {onnxruntime.__version__} providers: "
        f"{', '.join(onnxruntime.get_available_providers())}; {faiss_gpus}.",
        "",
        f"Re-rank: one query against a {SHORTLIST}-row shortlist of a {GALLERY:,}-row gallery, "
        f"D={DIM}, keep 10. Scores: {QUERIES} queries x {DRAWS} draws x {SHORTLIST} candidates "
        f"(shortlist_scores: distances, MI, entropies). Median of {REPEATS} runs, ms.",
        "",
        "| metric | re-rank CPU ms | re-rank CUDA ms | same top-10 | max distance gap "
        "| scores CPU ms | scores CUDA ms | max MI gap |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *["| " + " | ".join(r) + " |" for r in rows],
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out.read_text())


if __name__ == "__main__":
    main()
