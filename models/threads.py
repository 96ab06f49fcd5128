"""How many threads the numeric libraries of one process may use.

Two cores are easily oversubscribed: torch's intra-op pool, ONNX Runtime's and FAISS's
OpenMP pool each start one thread per host core, and when another process also wants the
cores, spinning OpenMP threads made training 30x slower. The rule here is sized from the CPUs
this process may really use (its affinity mask and cgroup quota, not the host's count).
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

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


def configure_torch_threads(threads: int | None = None) -> int:
    """Size torch's intra-op pool (default: available_cpus()) and its inter-op pool (1);
    returns the intra-op thread count."""
    count = max(1, threads or available_cpus())
    torch.set_num_threads(count)
    # Only allowed before the first parallel region; later calls keep what is set.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    return count
