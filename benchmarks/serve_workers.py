"""`probsearch serve` with one worker process against two, in one run: service_bench.py's main
cells with `--setting workers=1` and `--setting workers=2`, taking turns (1, 2, 2, 1, ...), so
that the shared machine's drift reaches both alike. Each turn's own report is kept in the work
dir; this script writes, per cell, the median QPS and p50 of each setting over the rounds, with
their ranges, and the ratio.

    .venv/bin/python benchmarks/serve_workers.py --demo-dir .cache/demo --rounds 2 \\
        --out benchmarks/results/serve_workers.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

from result_header import ROOT, result_header, write_results

SETTINGS = (1, 2)
ENDPOINTS = ("text", "image", "embedding")


def bench(workers: int, round_: int, args: argparse.Namespace) -> dict[tuple, tuple]:
    """One service_bench.py run; (endpoint, draws, cache, c) -> (QPS, p50 ms, server CPU)."""
    report = args.work_dir / f"workers{workers}-round{round_}.md"
    command = [sys.executable, str(ROOT / "benchmarks/service_bench.py"), "--plan", "clipart",
               "--demo-dir", str(args.demo_dir), "--scenarios", "main", "--concurrency", "1,16",
               "--duration", str(args.duration), "--raw-iterations", "10",
               "--setting", f"workers={workers}", "--out", str(report)]  # fmt: skip
    if not report.exists():  # a report of an interrupted run is kept
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    rows = {}
    for line in report.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| default | off |") and cells[2] in ENDPOINTS and len(cells) == 16:
            endpoint, draws, cache, c = cells[2], cells[4], cells[5], cells[6]
            rows[endpoint, draws, cache, c] = (float(cells[13]), float(cells[10]), cells[15])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-dir", type=Path, default=Path(".cache/demo"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=5)
    parser.add_argument("--work-dir", type=Path, default=Path("runs/serve_workers"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    started, load = time.perf_counter(), os.getloadavg()
    runs: dict[int, list[dict]] = {w: [] for w in SETTINGS}
    for round_ in range(args.rounds):
        for workers in SETTINGS if round_ % 2 == 0 else SETTINGS[::-1]:
            runs[workers].append(bench(workers, round_, args))
            print(round_, workers, flush=True)
    lines = result_header("One worker process against two", load, started)
    lines += [
        "",
        f"Demo build {args.demo_dir}; each setting {args.rounds} service_bench.py runs "
        f"(`--scenarios main --concurrency 1,16 --duration {args.duration}`), alternated; "
        f"reports in {args.work_dir}. Figures: median over the rounds [min-max]; server CPU in "
        "cores (the server's processes together), last round.",
        "",
        "| endpoint | draws | cache | c | QPS, 1 worker | QPS, 2 workers | ratio | "
        "p50 ms, 1 | p50 ms, 2 | server CPU, 1 | server CPU, 2 |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key in sorted(runs[1][0]):
        qps = {w: [r[key][0] for r in runs[w]] for w in SETTINGS}
        p50 = {w: median(r[key][1] for r in runs[w]) for w in SETTINGS}
        span = {w: f"{median(qps[w]):.1f} [{min(qps[w]):.1f}-{max(qps[w]):.1f}]" for w in SETTINGS}
        lines.append(
            f"| {' | '.join(key)} | {span[1]} | {span[2]} | "
            f"{median(qps[2]) / median(qps[1]):.2f} | {p50[1]:.2f} | {p50[2]:.2f} | "
            f"{runs[1][-1][key][2]} | {runs[2][-1][key][2]} |"
        )
    write_results(args.out, lines)


if __name__ == "__main__":
    main()
