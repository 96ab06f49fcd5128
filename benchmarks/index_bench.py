"""Index benchmark: build and query N synthetic Gaussians with each index type, per family.

Reports build time, index bytes per item, single-query latency and recall@10 against the
exact top-10 (models.gaussian.pairwise_distance), both straight from the index and after an
exact re-rank of a 100-item shortlist (what the service returns). Writes a markdown table with
machine info and the exact command to benchmarks/results/index_bench.md.

    .venv/bin/python benchmarks/index_bench.py                 # 1M x D=128 (the reference run)
    .venv/bin/python benchmarks/index_bench.py --n 100000      # quick run
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import faiss
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from indexer.build import (
    FamilyIndex,
    build_family_index,
    default_memory_budget,
    plan_index,
)
from indexer.tuning import tune_search_params
from models.gaussian import elementwise_distance, pairwise_distance

K = 10
SHORTLIST = 100


@dataclass
class Row:
    family: str
    index_type: str
    params: str
    build_s: float
    bytes_per_item: float
    p50_ms: float
    p95_ms: float
    recall_index: float
    recall_reranked: float


def clustered_gaussians(n: int, dim: int, seed: int, clusters: int) -> tuple[np.ndarray, ...]:
    """mu, logvar (n, dim) float32 around `clusters` centres (trained embeddings cluster;
    i.i.d. Gaussians have no near neighbours worth the name and defeat every ANN method)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    centre_logvar = rng.normal(-0.5, 0.4, (clusters, dim)).astype(np.float32)
    mu = np.empty((n, dim), np.float32)
    logvar = np.empty((n, dim), np.float32)
    for start in range(0, n, 100_000):  # in blocks: no (n, dim) float64 temporaries
        stop = min(start + 100_000, n)
        labels = rng.integers(0, clusters, stop - start)
        noise = rng.standard_normal((2, stop - start, dim), dtype=np.float32)
        mu[start:stop] = centres[labels] + 0.3 * noise[0]
        logvar[start:stop] = centre_logvar[labels] + 0.2 * noise[1]
    np.clip(logvar, np.log(0.1), np.log(10.0), out=logvar)
    return mu, logvar


def queries_near(mu: np.ndarray, logvar: np.ndarray, num: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, len(mu), num)
    mu_q = mu[rows] + 0.3 * rng.standard_normal((num, mu.shape[1]), dtype=np.float32)
    return mu_q.astype(np.float32), logvar[rng.integers(0, len(mu), num)]


def exact_top(metric: str, mu_q, logvar_q, mu, logvar, k: int) -> np.ndarray:
    """Exact top-k rows (Q, k) by brute force over gallery blocks."""
    best_d = np.full((len(mu_q), 0), np.inf, np.float32)
    best_i = np.zeros((len(mu_q), 0), np.int64)
    q = (torch.from_numpy(mu_q), torch.from_numpy(logvar_q))
    for start in range(0, len(mu), 50_000):
        block = (
            torch.from_numpy(mu[start : start + 50_000]),
            torch.from_numpy(logvar[start : start + 50_000]),
        )
        d = pairwise_distance(metric, *q, *block).numpy()  # (Q, B)
        best_d = np.concatenate([best_d, d], axis=1)
        best_i = np.concatenate(
            [best_i, np.arange(start, start + d.shape[1])[None].repeat(len(d), 0)], 1
        )
        order = np.argsort(best_d, axis=1)[:, :k]
        best_d, best_i = np.take_along_axis(best_d, order, 1), np.take_along_axis(best_i, order, 1)
    return best_i


def rerank(metric: str, mu_q, logvar_q, mu, logvar, rows: np.ndarray, k: int) -> np.ndarray:
    """Exact re-rank of each query's shortlist rows (Q, S) -> top-k rows (Q, k)."""
    out = np.empty((len(rows), k), np.int64)
    for q, candidates in enumerate(rows):
        candidates = candidates[candidates >= 0]
        g = (torch.from_numpy(mu[candidates]), torch.from_numpy(logvar[candidates]))
        rep = [torch.from_numpy(a[q : q + 1]).expand_as(g[0]) for a in (mu_q, logvar_q)]
        d = elementwise_distance(metric, *rep, *g).numpy()
        out[q] = candidates[np.argsort(d)[:k]]
    return out


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(
        np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)])
    )


def bench_one(family, index_type, mu, logvar, mu_q, logvar_q, truth, seed) -> Row:
    plan = plan_index(index_type, len(mu), mu.shape[1], (family,), default_memory_budget())
    started = time.perf_counter()
    index, params = build_family_index(family, mu, logvar, plan, seed=seed)
    tuned, _ = tune_search_params(
        FamilyIndex(family, index, params, {}), mu, logvar, plan, seed=seed
    )
    build_s = time.perf_counter() - started
    family_index = FamilyIndex(family, index, params, tuned)
    size = len(faiss.serialize_index(index))
    latencies = []
    for q in range(len(mu_q)):
        t = time.perf_counter()
        family_index.search(mu_q[q : q + 1], logvar_q[q : q + 1], K)
        latencies.append((time.perf_counter() - t) * 1e3)
    _, rows10 = family_index.search(mu_q, logvar_q, K)
    _, rows100 = family_index.search(mu_q, logvar_q, SHORTLIST)
    reranked = rerank(family, mu_q, logvar_q, mu, logvar, rows100, K)
    shown = {
        k: v for k, v in {**params, **tuned}.items() if k not in ("dim", "faiss_metric", "vectors")
    }
    return Row(
        family,
        index_type,
        ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()),
        build_s,
        size / len(mu),
        float(np.percentile(latencies, 50)),
        float(np.percentile(latencies, 95)),
        recall(rows10, truth),
        recall(reranked, truth),
    )


def machine_info() -> str:
    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").is_file():
        names = [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{cpu}; {os.cpu_count()} logical CPUs (faiss threads {faiss.omp_get_max_threads()});"
        f" {ram:.0f} GiB RAM; faiss {faiss.__version__}, GPUs seen by faiss"
        f" {faiss.get_num_gpus()}; torch {torch.__version__}; Python {platform.python_version()}"
    )


def write_markdown(path: Path, rows: list[Row], args: argparse.Namespace, command: str) -> None:
    lines = [
        "# Index benchmark",
        "",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"- command: `{command}`",
        f"- machine: {machine_info()}",
        f"- data: {args.n} synthetic Gaussians, D={args.dim}, {args.clusters} clusters; "
        f"{args.queries} queries near random items; seed {args.seed}",
        "- build: train + add + tuning of nprobe/efSearch (target recall@10 0.98 on sampled"
        " queries; IVF-PQ: exact top-10 inside its top-100)",
        "- latency: one query per call, k=10, CPU, includes building the augmented query",
        "- recall@10 index: the index's top-10 vs exact;"
        f" reranked: exact re-rank of its top-{SHORTLIST}",
        "",
        "| family | index | params | build s | bytes/item | p50 ms | p95 ms | recall@10 index"
        " | recall@10 reranked |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r.family} | {r.index_type} | {r.params} | {r.build_s:.1f} | {r.bytes_per_item:.0f} |"
        f" {r.p50_ms:.2f} | {r.p95_ms:.2f} | {r.recall_index:.3f} | {r.recall_reranked:.3f} |"
        for r in rows
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--types", default="flat,ivf,hnsw,ivfpq")
    parser.add_argument("--families", default="w2,kl")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "index_bench.md"
    )
    args = parser.parse_args()
    command = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    mu, logvar = clustered_gaussians(args.n, args.dim, args.seed, args.clusters)
    mu_q, logvar_q = queries_near(mu, logvar, args.queries, args.seed + 1)
    rows = []
    for family in args.families.split(","):
        truth = exact_top(family, mu_q, logvar_q, mu, logvar, K)
        for index_type in args.types.split(","):
            row = bench_one(family, index_type, mu, logvar, mu_q, logvar_q, truth, args.seed)
            print(row, flush=True)
            rows.append(row)
            write_markdown(args.out, rows, args, command)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
