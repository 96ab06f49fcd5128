"""The 1B-item plan: cluster sizes for a QPS and p99 target from the measured shard costs.

Reads the recorded benchmark runs (benchmarks/scale_inputs.py) and writes the tables of
docs/scale.md between its `scale_plan` marker comments, so the plan follows the measurements:

    .venv/bin/python benchmarks/scale_plan.py            # regenerate docs/scale.md's tables
    .venv/bin/python benchmarks/scale_plan.py --check    # exit 1 if docs/scale.md is stale

Model (fan-out over S shards, R replicas of the whole index): every query visits one replica of
each shard; latency = the slowest of the S shard searches + merge and network + the API pod's
own p99 (encode, re-rank, scores; measured); QPS = R x the QPS of one replica (one shard
server's QPS, since all shards are alike). A shard server's latency tail is exponential through
its measured p50 and p95, so the slowest of S has the shard's 0.99^(1/S) quantile at the p99.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_inputs import Inputs, ShardCost, load_inputs

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- scale_plan:begin -->", "<!-- scale_plan:end -->"
GB = 1e9


@dataclass(frozen=True)
class Target:
    items: int = 1_000_000_000
    qps: float = 1000.0
    p99_ms: float = 100.0


@dataclass(frozen=True)
class Hardware:
    """A node kind. Everything here is ASSUMED (no such cluster was measured)."""

    name: str
    servers: int  # shard servers per node: one per CPU core, or one per GPU
    memory_gb: float  # for shard indexes: RAM (CPU) or GPU memory
    speedup: float  # query cost divisor against the measured single CPU core
    wait_ms: float  # added latency per shard search (GPU: the batching window)


CPU_NODE = Hardware("CPU node, 32 cores, 128 GB", 32, 128.0, 1.0, 0.0)
GPU_NODE = Hardware("GPU node, 1 x H100 80 GB", 1, 80.0, 1.0, 2.0)  # speedup: see plan()
MEMORY_FRACTION = 0.7  # of a node's memory for shard indexes (the rest: OS, service, cache)
UTILISATION = 0.5  # a shard server runs at most half busy, so queueing stays off the tail
MIN_REPLICAS = 2  # one replica may be down (a node lost, a rolling upgrade) at any time
MERGE_NETWORK_MS = 2.0  # per query: one network round trip to the shards and the k-way merge
RAY_WORKERS = (100, 1000)


def tail_ms(p50: float, p95: float, quantile: float) -> float:
    """Latency at `quantile` of an exponential tail through p50 and p95."""
    return p50 + (p95 - p50) * math.log(0.5 / (1.0 - quantile)) / math.log(10.0)


def slowest_of(p50: float, p95: float, shards: int, quantile: float = 0.99) -> float:
    """`quantile` of the slowest of `shards` independent shard searches."""
    return tail_ms(p50, p95, quantile ** (1.0 / shards))


def scaled(shard: ShardCost, items: int) -> tuple[float, float]:
    """(p50, p95) of an IVF shard of `items`, scaled from a measured one by sqrt(items):
    nlist grows as sqrt(N) (indexer.build.ivf_nlist) and nprobe stays, so a query scans
    lists of N / nlist ~ sqrt(N) vectors."""
    factor = math.sqrt(items / shard.items)
    return shard.p50_ms * factor, shard.p95_ms * factor


@dataclass(frozen=True)
class PlanRow:
    hardware: str
    shard_items: int
    shards: int
    replicas: int
    shards_per_node: int
    nodes: int
    index_gb_per_node: float
    replica_qps: float
    p99_ms: float
    meets: bool


def plan_row(
    hardware: Hardware,
    shard_items: int,
    p50_ms: float,
    p95_ms: float,
    bytes_per_item: float,
    fixed_ms: float,
    target: Target,
) -> PlanRow:
    """Size one layout: shards of `shard_items` whose single-core search costs p50/p95 ms."""
    p50, p95 = p50_ms / hardware.speedup, p95_ms / hardware.speedup
    shards = math.ceil(target.items / shard_items)
    replica_qps = 1000.0 / p50 * UTILISATION
    replicas = max(MIN_REPLICAS, math.ceil(target.qps / replica_qps))
    shard_gb = shard_items * bytes_per_item / GB
    per_node = min(hardware.servers, math.floor(hardware.memory_gb * MEMORY_FRACTION / shard_gb))
    nodes = math.ceil(shards * replicas / per_node) if per_node else 0
    p99 = slowest_of(p50, p95, shards) + hardware.wait_ms + MERGE_NETWORK_MS + fixed_ms
    return PlanRow(
        hardware.name, shard_items, shards, replicas, per_node, nodes,
        per_node * shard_gb, replica_qps * replicas, p99, bool(per_node) and p99 <= target.p99_ms,
    )  # fmt: skip


def gpu_shard_items(bytes_per_item: float, hardware: Hardware = GPU_NODE) -> int:
    """The largest shard (a multiple of 1M items) whose index fills a GPU's share."""
    items = hardware.memory_gb * MEMORY_FRACTION * GB / bytes_per_item
    return int(items // 1_000_000) * 1_000_000


def gpu_speedup(inputs: Inputs) -> float:
    """ASSUMED: a GPU shard search beats one CPU core as gpu_check.md's batched uncertainty
    scores did (measured CPU / CUDA); FAISS GPU search was measured at 100k items only
    (gpu_faiss_check.md), not at shard scale."""
    return inputs.scores_ms["cpu"] / inputs.scores_ms["gpu"]


def plan(inputs: Inputs, target: Target) -> list[PlanRow]:
    """CPU layouts at every measured shard size; a GPU layout with full-GPU shards. The API
    pods (CPU, measured) add their p99 to every layout."""
    rows = [
        plan_row(CPU_NODE, s.items, s.p50_ms, s.p95_ms, s.bytes_per_item, inputs.api.p99_ms, target)
        for s in inputs.shards
    ]
    largest = inputs.shards[-1]
    gpu = dataclasses.replace(GPU_NODE, speedup=gpu_speedup(inputs))
    items = gpu_shard_items(largest.bytes_per_item, gpu)
    p50, p95 = scaled(largest, items)
    rows.append(plan_row(gpu, items, p50, p95, largest.bytes_per_item, inputs.api.p99_ms, target))
    return rows


def api_pods(inputs: Inputs, target: Target) -> int:
    """API pods (each with the benchmark's cores) for the target QPS at the measured point."""
    return max(MIN_REPLICAS, math.ceil(target.qps / inputs.api.qps))


def reindex_hours(items: int, workers: int, items_per_s: float) -> float:
    """Wall hours to embed `items` with `workers` encoder actors at `items_per_s` each."""
    return items / (workers * items_per_s) / 3600.0


def render(inputs: Inputs, target: Target) -> str:
    """The generated part of docs/scale.md."""
    from scale_tables import render_tables

    return render_tables(inputs, target, plan(inputs, target))


def update(doc: Path, block: str) -> str:
    """doc's text with `block` between the markers (ValueError if they are missing)."""
    text = doc.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise ValueError(f"{doc} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{block.strip()}\n{END}{rest.split(END, 1)[1]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "scale.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if --doc is stale")
    args = parser.parse_args()
    try:
        new = update(args.doc, render(load_inputs(args.results), Target()))
    except ValueError as e:
        print(f"scale_plan: {e}", file=sys.stderr)
        return 2
    if args.check:
        stale = new != args.doc.read_text(encoding="utf-8")
        print(f"{args.doc}: {'stale, run benchmarks/scale_plan.py' if stale else 'up to date'}")
        return int(stale)
    args.doc.write_text(new, encoding="utf-8")
    print(f"wrote the plan's tables into {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
