"""The service benchmark before and after a change, in one run: the same service_bench.py
command in a worktree of an earlier commit and in this tree, taking turns (before, after,
before, after, ...), so that the shared machine's drift reaches both alike. With
--before-demo-dir the before side serves another demo build (a change of model rather than of
code: --before HEAD then runs the same code on both).

    .venv/bin/python benchmarks/service_bench_compare.py --before 75df0fa --rounds 2 -- \\
        --scenarios main --concurrency 1,16 --duration 5 --warmup 1

Each turn writes service_bench.py's own report (kept under the work dir); this script reads the
rows of their `main` tables and the overhead ratio in rounds, and writes, per cell, the median
over the rounds of each side with its range, the after/before ratio, and whether the ranges
overlap (then the difference is inside the noise), to benchmarks/results/service_bench_compare.md
with the machine, load average and command.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
MAIN_ROW = re.compile(
    r"^\| default \| off \| (\w+) \| [^|]* \| (\d+) \| (\w+) \| (\d+) \| \d+ \| (\d+) \| [\d.]+ \| "
    r"([\d.]+) \| [\d.]+ \| ([\d.]+) \| ([\d.]+) \|",
    re.M,
)
RATIO_ROW = re.compile(r"^\| default \| off \| \d+ \| ([\d.]+) .*?\| ([\d.]+) \| [\d., ]+ \|", re.M)


def worktree(commit: str, work_dir: Path) -> Path:
    """A checkout of `commit` (made once, reused)."""
    path = work_dir / f"before-{commit}"
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), commit], cwd=ROOT,
                       check=True)  # fmt: skip
    return path


def run_once(tree: Path, bench_args: list[str], out: Path, demo_dir: Path) -> None:
    command = [sys.executable, "benchmarks/service_bench.py", *bench_args,
               "--demo-dir", str(demo_dir), "--out", str(out)]  # fmt: skip
    print(f"[{datetime.now(UTC):%H:%M:%S}] {tree.name}: {shlex.join(command)}", flush=True)
    subprocess.run(command, cwd=tree, check=True)


def cells(report: str) -> dict[str, dict[str, float]]:
    """(endpoint draws cache c) -> p50 ms, p99 ms, QPS of the default server's main rows."""
    found = {}
    main = report[report.index("\n## main:") :]
    main = main[: main.find("\n## ", 1)]
    for endpoint, draws, cache, c, errors, p50, p99, qps in MAIN_ROW.findall(main):
        if int(errors):
            raise SystemExit(f"{endpoint} {draws} draws {cache} c={c}: {errors} errors")
        found[f"{endpoint}, {draws} draws, {cache}, c={c}"] = {
            "p50 ms": float(p50), "p99 ms": float(p99), "QPS": float(qps)}  # fmt: skip
    ratio = RATIO_ROW.search(report)
    if ratio:
        found["overhead ratio (text 16 draws, c=1)"] = {"ratio": float(ratio.group(2))}
    return found


def summary(values: list[float]) -> str:
    return f"{median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def table(before: list[dict], after: list[dict]) -> list[str]:
    lines = ["| cell | figure | before | after | after / before | ranges overlap |",
             "| --- | --- | ---: | ---: | ---: | --- |"]  # fmt: skip
    for cell in before[0]:
        for figure in before[0][cell]:
            b = [run[cell][figure] for run in before if cell in run]
            a = [run[cell][figure] for run in after if cell in run]
            if not a:
                continue
            overlap = min(a) <= max(b) and min(b) <= max(a)
            ratio = median(a) / median(b)
            verdict = "yes" if overlap else "NO"
            lines.append(
                f"| {cell} | {figure} | {summary(b)} | {summary(a)} | {ratio:.3f} | {verdict} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=2, help="turns of each side")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "service_bench_compare")
    parser.add_argument("--demo-dir", type=Path, default=ROOT / ".cache" / "demo")
    parser.add_argument(
        "--before-demo-dir", type=Path, default=None,
        help="the before side's demo build, when it differs (default: --demo-dir)",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/service_bench_compare.md"
    )
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: service_bench.py's")
    args = parser.parse_args()
    bench_args = [a for a in args.bench_args if a != "--"]
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    trees = {"before": worktree(args.before, work), "after": ROOT}
    demo_dirs = {"before": args.before_demo_dir or args.demo_dir, "after": args.demo_dir}
    load_start, started = os.getloadavg(), time.perf_counter()
    reports: dict[str, list[dict]] = {"before": [], "after": []}
    for turn in range(args.rounds):
        for side, tree in trees.items():
            out = work / f"{side}-{turn}.md"
            run_once(tree, bench_args, out, demo_dirs[side].resolve())
            reports[side].append(cells(out.read_text()))
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True).stdout.strip()  # fmt: skip
    lines = [
        "# Service benchmark, before and after",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%dT%H:%M:%S}+00:00; before {args.before}, after {head} "
        "(the working tree)",
        f"- demo builds: before `{demo_dirs['before']}`, after `{demo_dirs['after']}`",
        f"- command: `{shlex.join([Path(sys.executable).name, *sys.argv])}`",
        f"- machine: {platform.processor() or platform.machine()}; {os.cpu_count()} logical CPUs; "
        f"{platform.platform()}",
        f"- load average (1/5/15 min) at start: {' / '.join(f'{x:.2f}' for x in load_start)}; "
        f"at end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}; wall time "
        f"{(time.perf_counter() - started) / 60:.1f} min",
        f"- {args.rounds} turns of each side, before first; each figure is the median over the "
        "turns (min-max); the full reports are in the work dir",
        "",
        *table(reports["before"], reports["after"]),
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
