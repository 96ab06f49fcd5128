"""Index benchmark: build and query N synthetic Gaussians with each index type, per metric.

Reports build time, index bytes per item, single-query latency and recall@10 against the
exact top-10 (models.distance.gaussian.pairwise_distance), both straight from the index and after an
exact re-rank of a 100-item shortlist (what the service returns). Writes a markdown table with
machine info, load average and the exact command to benchmarks/results/index_bench.md.

    .venv/bin/python benchmarks/index_bench.py                 # 1M x D=128 (the reference run)
    .venv/bin/python benchmarks/index_bench.py --n 100000      # quick run
    .venv/bin/python benchmarks/index_bench.py --types auto --metrics w2,csd,kl,kl_reverse,js,\
        mahalanobis,min_kl --memory-budget-gb 4               # what reindex picks under 4 GiB
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

from indexer.build import IndexPlan, build_family_index, default_memory_budget, plan_index
from indexer.read_index import FamilyIndex, to_device
from indexer.tuning import tune_search_params
from models.distance.augmented import candidate_families
from models.distance.gaussian import elementwise_distance, pairwise_distance

K = 10
SHORTLIST = 100


@dataclass
class Row:
    metric: str
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
    out = np.full((len(rows), k), -1, np.int64)
    for q, candidates in enumerate(rows):
        candidates = np.unique(candidates[candidates >= 0])
        g = (torch.from_numpy(mu[candidates]), torch.from_numpy(logvar[candidates]))
        rep = [torch.from_numpy(a[q : q + 1]).expand_as(g[0]) for a in (mu_q, logvar_q)]
        d = elementwise_distance(metric, *rep, *g).numpy()
        best = candidates[np.argsort(d, kind="stable")[:k]]
        out[q, : len(best)] = best
    return out


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(
        np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)])
    )


@dataclass
class Built:
    """One family's built index with its build time and size."""

    index: FamilyIndex
    build_s: float
    size: int
    shown: dict


def build_one(family: str, plan: IndexPlan, mu, logvar, seed: int) -> Built:
    """Build and tune one family's index as reindex does (indexer.build, indexer.tuning)."""
    started = time.perf_counter()
    index, params = build_family_index(family, mu, logvar, plan, seed=seed)
    tuned, _ = tune_search_params(
        FamilyIndex(family, index, params, {}), mu, logvar, plan, seed=seed
    )
    build_s = time.perf_counter() - started
    size = len(faiss.serialize_index(index))
    shown = {
        k: v for k, v in {**params, **tuned}.items() if k not in ("dim", "faiss_metric", "vectors")
    }
    searched = to_device(index, "auto", family)  # a GPU when FAISS sees one, as the service
    return Built(FamilyIndex(family, searched, params, tuned), build_s, size, shown)


def shortlist(metric: str, built: list[Built], mu_q, logvar_q, mu, logvar, size: int):
    """Rows (Q, size) as the service's shortlist gives them: one family's search, or (min_kl)
    the union of each family's top `size`, ranked exactly (indexer.store.IndexVersion)."""
    if len(built) == 1:
        return built[0].index.search(mu_q, logvar_q, size)[1]
    rows = np.concatenate([b.index.search(mu_q, logvar_q, size)[1] for b in built], axis=1)
    return rerank(metric, mu_q, logvar_q, mu, logvar, rows, size)


def bench_metric(metric, built: list[Built], type_label, mu, logvar, mu_q, logvar_q, truth) -> Row:
    latencies = []
    for q in range(len(mu_q)):
        t = time.perf_counter()
        shortlist(metric, built, mu_q[q : q + 1], logvar_q[q : q + 1], mu, logvar, K)
        latencies.append((time.perf_counter() - t) * 1e3)
    rows10 = shortlist(metric, built, mu_q, logvar_q, mu, logvar, K)
    rows100 = shortlist(metric, built, mu_q, logvar_q, mu, logvar, SHORTLIST)
    reranked = rerank(metric, mu_q, logvar_q, mu, logvar, rows100, K)
    params = "; ".join(
        (f"{b.index.family}: " if len(built) > 1 else "")
        + ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in b.shown.items()
        )
        for b in built
    )
    return Row(
        metric,
        type_label,
        params,
        sum(b.build_s for b in built),
        sum(b.size for b in built) / len(mu),
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


def gpu_note() -> str:
    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if gpus == 0:
        return "no GPU was available: every build and search ran on the CPU"
    return f"{gpus} GPU(s) seen by faiss; searched where read_index.to_device puts them"


def write_markdown(path: Path, rows: list[Row], run: dict[str, str], append: bool) -> None:
    """Write (or, with `append`, add below what `path` holds) one run's section and table."""
    lines = [f"- {key}: {value}" for key, value in run.items() if key != "date"] + [
        "- build: train + add + tuning of nprobe/efSearch (target recall@10 0.98 on sampled"
        " queries; IVF-SQ and IVF-PQ: exact top-10 inside their top-100)",
        "- latency: one query per call, k=10, includes building the augmented query"
        " (min_kl: both families' searches and the exact ranking of their union)",
        "- recall@10 index: the index's top-10 vs exact;"
        f" reranked: exact re-rank of its top-{SHORTLIST} (min_kl: of each family's)",
        "",
        "| metric | index | params | build s | bytes/item | p50 ms | p95 ms | recall@10 index"
        " | recall@10 reranked |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r.metric} | {r.index_type} | {r.params} | {r.build_s:.1f} | {r.bytes_per_item:.0f} |"
        f" {r.p50_ms:.2f} | {r.p95_ms:.2f} | {r.recall_index:.3f} | {r.recall_reranked:.3f} |"
        for r in rows
    ]
    head = "# Index benchmark\n\n"
    if append and path.is_file():
        kept = path.read_text(encoding="utf-8").split(RUN_MARK + run["date"])[0]
        head = kept.rstrip("\n") + "\n\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = head + RUN_MARK + run["date"] + "\n\n" + "\n".join(lines) + "\n"
    path.write_text(text, encoding="utf-8")


RUN_MARK = "## Run "


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--types", default="flat,ivf,ivfsq,hnsw,ivfpq", help="index types; auto: as reindex picks"
    )
    parser.add_argument("--metrics", default="w2,kl", help="metrics with an index form")
    parser.add_argument(
        "--memory-budget-gb", type=float, default=None, help="auto's budget (default: half RAM)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--append", action="store_true", help="add this run below --out's runs")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "index_bench.md"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    command = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    metrics = args.metrics.split(",")
    families = tuple(sorted({f for m in metrics for f in candidate_families(m)}))
    budget = (
        int(args.memory_budget_gb * 2**30) if args.memory_budget_gb else default_memory_budget()
    )
    run = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": f"`{command}`",
        "machine": machine_info(),
        "load average at start (1/5/15 min)": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "GPU": gpu_note(),
        "data": f"{args.n} synthetic Gaussians, D={args.dim}, {args.clusters} clusters;"
        f" {args.queries} queries near random items; seed {args.seed}",
        "index memory budget": f"{budget / 2**30:.1f} GiB for the families {', '.join(families)}",
    }
    mu, logvar = clustered_gaussians(args.n, args.dim, args.seed, args.clusters)
    mu_q, logvar_q = queries_near(mu, logvar, args.queries, args.seed + 1)
    truth = {m: exact_top(m, mu_q, logvar_q, mu, logvar, K) for m in metrics}
    rows = []
    for index_type in args.types.split(","):
        plan = plan_index(
            index_type, args.n, args.dim, families, budget
        )  # all families: as reindex
        label = f"auto: {plan.index_type}" if index_type == "auto" else index_type
        built: dict[str, Built] = {}
        for position, metric in enumerate(metrics):
            needed = candidate_families(metric)
            for family in needed:
                if family not in built:
                    built[family] = build_one(family, plan, mu, logvar, args.seed)
            row = bench_metric(
                metric, [built[f] for f in needed], label, mu, logvar, mu_q, logvar_q, truth[metric]
            )
            print(row, flush=True)
            rows.append(row)
            later = {f for m in metrics[position + 1 :] for f in candidate_families(m)}
            built = {f: b for f, b in built.items() if f in later}  # free what no metric needs
            run["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
            write_markdown(args.out, rows, run, args.append)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
