"""Seconds per training epoch of the demo's recipe for each torch thread count and OpenMP wait
policy, on an idle machine and beside a busy process: the measurement behind the batch rule
of models/threads.py. Writes a Markdown table to --out.

    python benchmarks/train_threads.py --data runs/demo/data          # a shapes dataset
    python benchmarks/train_threads.py --data D --threads 1 --policies default --out /tmp/t.md

Each cell is a fresh process (the wait policy is read when OpenMP starts) that trains the demo's
model for --epochs epochs on --data; the table gives the last epoch's seconds (the first pays
for one-off set-up). "busy": one pure-Python busy loop per --busy runs beside it, as another
user's job would.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICIES = {  # name -> environment of the cell
    "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "ACTIVE": {"OMP_WAIT_POLICY": "ACTIVE"},
    "default": {},
}
CELL = """
import sys, tempfile, torch
from dataclasses import replace
from pathlib import Path
from models.training.train import train
from probsearch.demo import DemoPlan, demo_model
torch.set_num_threads(int(sys.argv[2]))
model, training = demo_model(DemoPlan())
training = replace(training, epochs=int(sys.argv[3]), patience=0)
with tempfile.TemporaryDirectory() as out:
    train(Path(sys.argv[1]), Path(out) / "m", model, training, progress=False, export=False,
          log=lambda line: print(line, flush=True))
"""
SECONDS = re.compile(r"\(([0-9.]+)s\)\s*$")


def epoch_seconds(data: Path, threads: int, policy: str, epochs: int) -> float:
    """The last epoch's seconds of one fresh training process."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    env |= POLICIES[policy] | {"PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", CELL, str(data), str(threads), str(epochs)]
    lines = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    seconds = [float(m.group(1)) for line in lines.splitlines() if (m := SECONDS.search(line))]
    return seconds[-1]


def busy_loops(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a shapes dataset directory")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--policies", default="PASSIVE,ACTIVE,default")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--busy", type=int, default=1, help="busy loops beside a 'busy' cell")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/train_threads.md")
    args = parser.parse_args()
    started, load = time.perf_counter(), os.getloadavg()
    threads = [int(t) for t in args.threads.split(",")]
    policies = args.policies.split(",")
    rows = []
    for load_name in ("idle", "busy"):
        loops = busy_loops(args.busy) if load_name == "busy" else []
        try:
            for t in threads:
                cells = [f"{epoch_seconds(args.data, t, p, args.epochs):.1f}" for p in policies]
                rows.append(f"| {load_name} | {t} | " + " | ".join(cells) + " |")
                print(rows[-1], flush=True)
        finally:
            for loop in loops:
                loop.kill()
    command = " ".join(["python benchmarks/train_threads.py", *sys.argv[1:]])
    lines = [
        "# Training threads and OpenMP wait policy: seconds per epoch of the demo's recipe",
        "",
        f"- command: `{command}`",
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
        f"load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}, at end "
        f"{os.getloadavg()[0]:.2f}; wall time {(time.perf_counter() - started) / 60:.1f} min",
        f"- data: {args.data}; each cell a fresh process, epoch {args.epochs} of {args.epochs} "
        f"(seconds, lower is better); busy: {args.busy} busy loop(s) beside it",
        "",
        "| machine | torch threads | " + " | ".join(policies) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in policies) + " |",
        *rows,
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
