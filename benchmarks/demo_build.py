"""Wall time of the demo's first build, stage by stage: `probsearch demo --no-serve` into an
empty cache dir, timed from its own progress lines. Issue 12 asks for 3 minutes on 2 idle
CPU cores. Writes a Markdown table to --out.

    python benchmarks/demo_build.py                       # the shipped plan (clip art)
    python benchmarks/demo_build.py --shapes              # the shapes lab (demo_build.md)
    python benchmarks/demo_build.py --small --out /tmp/d.md
    python benchmarks/demo_build.py --image-backbone efficientnet-lite0-style
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBSEARCH = ROOT / ".venv" / "bin" / "probsearch"
STAGES = ("[1/4]", "[2/4]", "[3/4]", "[4/4]", "activated")
NAMES = ("start-up", "data", "training", "indexes", "calibration")


def timed_build(cache: Path, flags: list[str]) -> tuple[list[tuple[str, float]], float]:
    """Run the build; the seconds from each stage's first line to the next, and the total."""
    command = [str(PROBSEARCH), "demo", "--no-serve", "--cache-dir", str(cache), *flags]
    # unset, as for a user: the demo keeps its active versions in Redis at 127.0.0.1:6379 when
    # one answers there
    env = {**os.environ, "PROBSEARCH_REDIS_URL": ""}
    started = time.perf_counter()
    marks = [started]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            stage = len(marks) - 1
            if stage < len(STAGES) and line.lstrip().startswith(STAGES[stage]):
                marks.append(time.perf_counter())
    if process.returncode != 0:
        raise SystemExit(f"the build failed with exit code {process.returncode}")
    total = time.perf_counter() - started
    return [(n, b - a) for n, a, b in zip(NAMES, marks, marks[1:], strict=False)], total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="the reduced plan (--small)")
    parser.add_argument("--shapes", action="store_true", help="the shapes lab (--shapes)")
    parser.add_argument(
        "--image-backbone", help="the clip-art demo on this image backbone (probsearch demo's flag)"
    )
    parser.add_argument("--out", type=Path, help="default: results/demo_build[_clipart].md")
    parser.add_argument(
        "--cache-dir", type=Path, help="an empty dir to build into and keep (default: a temp dir)"
    )
    args = parser.parse_args()
    flags = ["--small"] * args.small + ["--shapes"] * args.shapes
    name = "demo_build.md" if flags else "demo_build_clipart.md"
    if args.image_backbone:
        flags += ["--image-backbone", args.image_backbone]
        name = f"demo_build_clipart_{args.image_backbone}.md"
    args.out = args.out or ROOT / "benchmarks" / "results" / name
    command = " ".join([".venv/bin/python benchmarks/demo_build.py", *sys.argv[1:]])
    load = os.getloadavg()[0]
    if args.cache_dir is not None and args.cache_dir.exists() and any(args.cache_dir.iterdir()):
        parser.error(f"{args.cache_dir} is not empty: the first build needs an empty dir")
    cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="demo-build-"))
    try:
        stages, total = timed_build(cache, flags)
        epochs = json.loads((cache / "model" / "history.json").read_text())
    finally:
        if args.cache_dir is None:
            shutil.rmtree(cache, ignore_errors=True)
    seconds = [round(e["seconds"], 1) for e in epochs]
    lines = [
        "# The demo's first build",
        "",
        f"Command: `{command}`; machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs; load (1 min) before the build {load:.1f}, after "
        f"{os.getloadavg()[0]:.1f}.",
        "",
        "| stage | seconds |",
        "| --- | --- |",
        *(f"| {name} | {value:.1f} |" for name, value in stages),
        f"| **total** (process start to exit) | **{total:.1f}** |",
        "",
        f"Training: {len(seconds)} epochs, seconds each (validation included): {seconds}.",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
