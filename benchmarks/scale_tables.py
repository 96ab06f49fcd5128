"""Markdown tables of the 1B plan (benchmarks/scale_plan.py): inputs with their provenance,
assumptions, index memory at 1B, cluster layouts and reindex time."""

from __future__ import annotations

from typing import TYPE_CHECKING

import scale_plan as sp

if TYPE_CHECKING:
    from scale_inputs import Inputs, Source

INDEX_NAMES = {"flat": "Flat", "ivf": "IVF-Flat", "ivfsq": "IVF-SQ8", "hnsw": "HNSW",
               "ivfpq": "IVF-PQ"}  # fmt: skip


def _source(source: Source) -> str:
    return f"{source.file}: `{source.command}`; {source.machine}; load {source.load}"


def inputs_table(inputs: Inputs) -> list[str]:
    lines = ["| measured input | value | recorded run (file: command; machine; load average) |",
             "| --- | ---: | --- |"]  # fmt: skip
    for s in inputs.shards:
        lines.append(
            f"| w2 {INDEX_NAMES.get(s.index, s.index)} shard of {s.items / 1e6:g}M, one core:"
            f" p50 / p95 ms, bytes/item | {s.p50_ms:.2f} / {s.p95_ms:.2f}, {s.bytes_per_item:.0f}"
            f" | {_source(s.source)} |"
        )
    first, last = inputs.shards[0], inputs.shards[-1]
    lines.append(
        f"| p50 growth {first.items / 1e6:g}M -> {last.items / 1e6:g}M (model: sqrt ="
        f" {(last.items / first.items) ** 0.5:.2f}) | {last.p50_ms / first.p50_ms:.2f} | as above |"
    )
    for device in ("cpu", "gpu"):
        lines.append(
            f"| {device.upper()} exact re-rank of 100 + uncertainty scores, ms per query (w2)"
            f" | {inputs.rerank_ms[device]:.2f} + {inputs.scores_ms[device]:.3f}"
            f" | {_source(inputs.gpu_source)} |"
        )
    api = inputs.api
    lines.append(
        f"| API pod ({api.cores} cores): text, 16 draws, cache miss, c={api.concurrency}: QPS,"
        f" p99 ms | {api.qps:.1f}, {api.p99_ms:.2f} | {_source(api.source)} |"
    )
    lines.append(
        f"| Ray reindex, images/s per encoder actor (1 thread) | {inputs.ray_items_per_s:.0f}"
        f" | {_source(inputs.ray_source)} |"
    )
    return lines


def assumptions_table() -> list[str]:
    cpu, gpu = sp.CPU_NODE, sp.GPU_NODE
    rows = [
        ("CPU node", f"{cpu.servers} cores (one shard server each), {cpu.memory_gb:g} GB RAM"),
        ("GPU node", f"1 GPU with {gpu.memory_gb:g} GB (an H100, as in gpu_check.md's machine)"),
        ("GPU shard search vs one CPU core", "as much faster as gpu_check.md's batched scores"
         " (CPU ms / CUDA ms, measured there; a different kernel: FAISS GPU search was"
         " measured at 100k items only, gpu_faiss_check.md)"),
        ("GPU batching window", f"{gpu.wait_ms:g} ms added to every shard search"),
        ("GPU shard cost", "the largest measured CPU shard scaled by sqrt(items), then / speedup"),
        ("memory for shard indexes", f"{sp.MEMORY_FRACTION:.0%} of the node's"),
        ("shard server utilisation", f"at most {sp.UTILISATION:.0%} (queueing off the tail)"),
        ("replicas", f"at least {sp.MIN_REPLICAS}, whatever the QPS needs (availability)"),
        ("merge + network", f"{sp.MERGE_NETWORK_MS:g} ms per query"),
        ("API pod p99", "added whole to the shards' (an upper bound); its operating point is the"
         " busiest measured cell with p99 <= half the target"),
        ("shard latency tail", "exponential through the measured p50 and p95; shards independent"),
    ]  # fmt: skip
    return ["| assumed | value |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in rows]


def memory_table(inputs: Inputs, items: int) -> list[str]:
    lines = ["| metric | index | bytes/item (1M run) | index GB for 1B, one copy |",
             "| --- | --- | ---: | ---: |"]  # fmt: skip
    for (metric, index), (size, _) in sorted(inputs.bytes_per_item.items()):
        if index in INDEX_NAMES:
            lines.append(
                f"| {metric} | {INDEX_NAMES[index]} | {size:.0f} | {size * items / sp.GB:,.0f} |"
            )
    arrays_gb = 1024 * items / sp.GB
    lines.append(
        f"| (re-rank arrays) | mu + logvar, D=128 float32 | 1024 | {arrays_gb:,.0f}"
        " (on the shared volume, memory-mapped) |"
    )
    return lines


def plan_table(rows: list[sp.PlanRow], target: sp.Target) -> list[str]:
    lines = [
        f"| hardware | shard items | shards S | replicas R | shards/node | nodes | index GB/node"
        f" | QPS capacity | p99 ms | meets {target.qps:g} QPS, p99 <= {target.p99_ms:g} ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.hardware} | {r.shard_items / 1e6:g}M | {r.shards} | {r.replicas}"
            f" | {r.shards_per_node} | {r.nodes} | {r.index_gb_per_node:.1f}"
            f" | {r.replica_qps:,.0f} | {r.p99_ms:.1f} | {'yes' if r.meets else 'no'} |"
        )
    return lines


def api_table(inputs: Inputs, target: sp.Target) -> list[str]:
    pods = sp.api_pods(inputs, target)
    return [
        "| API pods | cores each | QPS each (measured) | QPS capacity |",
        "| ---: | ---: | ---: | ---: |",
        f"| {pods} | {inputs.api.cores} | {inputs.api.qps:.1f} | {pods * inputs.api.qps:,.0f} |",
    ]


def reindex_table(inputs: Inputs, items: int) -> list[str]:
    lines = ["| encoder actors | items/s | hours for 1B |", "| ---: | ---: | ---: |"]
    for workers in sp.RAY_WORKERS:
        hours = sp.reindex_hours(items, workers, inputs.ray_items_per_s)
        lines.append(f"| {workers} | {workers * inputs.ray_items_per_s:,.0f} | {hours:.1f} |")
    return lines


def render_tables(inputs: Inputs, target: sp.Target, rows: list[sp.PlanRow]) -> str:
    parts = [
        "_Generated by `python benchmarks/scale_plan.py` from benchmarks/results/; do not edit._",
        "", "### Measured inputs", "", *inputs_table(inputs),
        "", "### Assumptions", "", *assumptions_table(),
        "", "### Index memory at 1B", "", *memory_table(inputs, target.items),
        "", f"### Layouts for {target.items / 1e9:g}B items at {target.qps:g} QPS", "",
        *plan_table(rows, target),
        "", f"GPU shard search speedup over one core (assumed, from gpu_check.md's scores):"
        f" {sp.gpu_speedup(inputs):.1f}x.",
        "", "### API tier (both layouts: encoders on CPU)", "", *api_table(inputs, target),
        "", "### Reindex on Ray", "", *reindex_table(inputs, target.items),
    ]  # fmt: skip
    return "\n".join(parts)
