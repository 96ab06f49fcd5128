"""How many threads the numeric libraries of one process may use: the thread budget.

Two cores are easily oversubscribed: torch's intra-op pool, ONNX Runtime's and FAISS's
OpenMP pool each start one thread per host core, and when another process also wants the
cores, spinning OpenMP threads made training 30x slower. The budget is sized from the CPUs
this process may really use (its affinity mask and cgroup quota, not the host's count), chosen
once at start, and handed to every pool (torch here, ONNX Runtime in encoder_runtime, FAISS in
indexer.store); PROBSEARCH_THREADS overrides it.

Two roles, two rules:
- batch (train, eval, reindex, calibrate, the demo's build): half the CPUs, at least one.
  The pools run one after another, but the machine is shared. Measured on 2 cores
  (benchmarks/results/train_threads.md, seconds per epoch of the demo's training): 1 thread
  took 11-12 s idle and beside a busy process; 2 threads with OpenMP's default waits 7.5 s
  idle but 28.6 s beside it (each op waits for the thread that lost its core), and 2 threads
  with OMP_WAIT_POLICY=PASSIVE, which the CLI sets, 11.7 s and 11.8 s: no gain over one.
  The same count on every 2-core machine also keeps training reproducible (a thread count
  changes the order of float reductions). The exception is work in batches that share
  nothing (batches only take turns on a busy core, where one batch's threads wait for each
  other): training's backbone features, one batch per CPU at once on one thread each, and
  calibrate's held-out queries, concurrent_batches chunks at once, then its metrics,
  concurrent_batches at once; a local reindex, concurrent_batches batches at once.
- serve: requests overlap, and the event loop, the micro-batchers' worker threads and the
  image decoders need CPU beside the numeric pools, whose per-request work (one query, tens
  of microseconds of arithmetic) gains nothing from splitting it across threads. Each pool
  gets half of this worker's share of the CPUs, at least one. Measured on 2 cores: text search
  p50 104 ms and 20 QPS at c=16 with the libraries' defaults, 21 ms and 104 QPS with one
  thread per pool (benchmarks/service_bench.py checks the rule).
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpus = cpus or 1
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cpus


Role = Literal["batch", "serve"]


@dataclass(frozen=True)
class ThreadBudget:
    """Threads per pool: `intra_op` for torch's intra-op pool, ONNX Runtime's intra-op pool
    and FAISS's OpenMP pool; `inter_op` for torch's and ONNX Runtime's inter-op pools."""

    intra_op: int
    inter_op: int = 1


def thread_budget(role: Role, override: int | None = None, workers: int = 1) -> ThreadBudget:
    """The budget of one process of `role` (see the module docstring); `override` (the
    PROBSEARCH_THREADS setting) wins when given."""
    if override is not None:
        return ThreadBudget(max(1, override))
    cpus = available_cpus()
    if role == "batch":
        return ThreadBudget(max(1, cpus // 2))
    if role == "serve":
        return ThreadBudget(max(1, cpus // (2 * max(1, workers))))
    raise ValueError(f"unknown role {role!r}; choose batch or serve")


def concurrent_batches(threads: ThreadBudget, workers: int = 1) -> int:
    """How many independent batches of one kind a process runs at once, each on pools of
    `threads`: enough to fill this worker's share of the CPUs, at least one. On 2 cores (one
    worker, one thread a pool) that is 2.

    A serving process runs that many micro-batches at once: a text search's encoder and its
    scoring run one after another in a batch, so one batch at a time kept the server at 1.0
    core. Training encodes its backbone features that many one-thread batches at once
    (models.training.feature_splits), and calibration its held-out queries that many chunks at
    once (benchmarks/results/calibrate_encode.md: 1.6x on 2 cores, the same embeddings) and
    then that many metrics at once (benchmarks/results/calibrate_metrics.md: about 1.4x on 2
    cores, calibration.json byte-identical); a local reindex embeds that many batches at once
    (benchmarks/results/reindex_workers.md: about 1.5x on 2 cores)."""
    return max(1, available_cpus() // (max(1, workers) * threads.intra_op))


def configure_torch_threads(threads: int | ThreadBudget | None = None) -> int:
    """Size torch's intra-op pool (an int, a budget's intra_op, or by default the batch rule)
    and its inter-op pool (1); returns the intra-op thread count."""
    if not isinstance(threads, ThreadBudget):
        threads = thread_budget("batch", threads)
    torch.set_num_threads(threads.intra_op)
    # Only allowed before the first parallel region; later calls keep what is set.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(threads.inter_op)
    return threads.intra_op
