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

from models.scoring.query_scores import shortlist_distances, shortlist_scores
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
    noise = [0.3 * rng.standard_normal((DRAWS, QUERIES, DIM)).astype(np.float32) for _ in "ml"]
    scores, mc = {}, {}
    for name in ("cpu", "cuda"):
        device = torch.device(name)
        q = [torch.from_numpy(x[:QUERIES]).to(device) for x in (mu, logvar)]
        draws = [
            torch.from_numpy(x[:QUERIES] + e).to(device)
            for x, e in zip((mu, logvar), noise, strict=True)
        ]  # (L, Q, D): distinct draws around each query, as MC dropout gives
        cand = [torch.from_numpy(x[rows]).to(device).expand(QUERIES, -1, -1) for x in (mu, logvar)]
        mc[name] = shortlist_distances(metric, tuple(q), tuple(draws), tuple(cand))[1].cpu()
        scores[name], ms = timed(
            lambda q=q, d=draws, c=cand: shortlist_scores(metric, tuple(q), tuple(d), tuple(c), 1.0)
        )
        cells.append(f"{ms:.2f}")
    rel = ((mc["cpu"] - mc["cuda"]).abs() / (1 + mc["cpu"].abs())).max().item()
    info = scores["cpu"].mutual_information
    gap = np.abs(info - scores["cuda"].mutual_information).max()
    cells += [f"{rel:.1e}", f"{info.mean():.3f}", f"{gap:.1e}"]
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
        f"(shortlist_scores: distances, MI, entropies; each draw the query's mean and log-variance "
        f"plus N(0, 0.3^2) noise). Draw distance gap: largest |a - b| / (1 + |a|) of the draws' "
        f"distances (shortlist_distances). Median of {REPEATS} runs, ms.",
        "",
        "| metric | re-rank CPU ms | re-rank CUDA ms | same top-10 | max distance gap "
        "| scores CPU ms | scores CUDA ms | draw distance gap | mean MI | max MI gap |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *["| " + " | ".join(r) + " |" for r in rows],
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out.read_text())


if __name__ == "__main__":
    main()
