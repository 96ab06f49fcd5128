"""The first lines of a benchmark's results file (its title, then the command, the machine,
the load average at start and end, and the wall time), a cell of per-round seconds, and the
file's writing."""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path


def result_header(title: str, load_at_start: tuple[float, ...], started: float) -> list[str]:
    """`started`: time.perf_counter() when the run began; `load_at_start`: os.getloadavg()."""
    command = " ".join([Path(sys.executable).name, *sys.argv])
    one, five, fifteen = load_at_start
    return [
        f"# {title}",
        "",
        f"Command: `{command}`; machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs; load (1/5/15 min) at start {one:.2f} / {five:.2f} / "
        f"{fifteen:.2f}, at end {os.getloadavg()[0]:.2f}; wall time "
        f"{(time.perf_counter() - started) / 60:.1f} min.",
    ]


def rounds_cell(seconds: list[float]) -> str:
    """One table cell: the seconds of each round, in order."""
    return ", ".join(f"{s:.1f}" for s in seconds)


def write_results(out: Path, lines: list[str]) -> None:
    """Write the results file and print it."""
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
