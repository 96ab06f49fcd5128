"""What the A/B benchmarks share: the first lines of a results file (its title, then the
command, the machine, the load average at start and end, and the wall time), the settings run
in alternated rounds, their table rows, and the file's writing.

Imported before the project: it puts this checkout first on sys.path and keeps OpenMP's idle
threads from spinning (OMP_WAIT_POLICY=PASSIVE) before torch or ONNX Runtime load, since the
benchmarks share 2 cores with whatever else runs."""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


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


def alternated_rounds(
    rounds: int,
    settings: Sequence[Hashable],
    kinds: Sequence[str],
    run: Callable[[Any, str], tuple[float, Any]],
) -> tuple[dict[tuple, list[float]], dict[tuple, Any]]:
    """`run(setting, kind)` -> (figure, output) for every kind under every setting, `rounds`
    times, the settings' order reversed every other round, so that a drift of the shared
    machine reaches them alike. Returns (setting, kind) -> the figure of each round, and
    (setting, kind) -> the last round's output."""
    figures: dict[tuple, list[float]] = {}
    outputs: dict[tuple, Any] = {}
    for round_ in range(rounds):
        for setting in settings if round_ % 2 == 0 else settings[::-1]:
            for kind in kinds:
                figure, outputs[setting, kind] = run(setting, kind)
                figures.setdefault((setting, kind), []).append(figure)
                print(round_, setting, kind, f"{figure:.1f}", flush=True)
    return figures, outputs


def settings_rows(
    settings: Sequence[Hashable],
    kinds: Sequence[str],
    figures: dict[tuple, list[float]],
    label: Callable[[Any], str] = str,
) -> list[str]:
    """One table row per setting: `label(setting)`, then per kind its figure of each round."""
    return [
        f"| {label(setting)} | "
        + " | ".join(", ".join(f"{f:.1f}" for f in figures[setting, kind]) for kind in kinds)
        + " |"
        for setting in settings
    ]


def write_results(out: Path, lines: list[str]) -> None:
    """Write the results file and print it."""
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
