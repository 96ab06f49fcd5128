"""Image-burst benchmark: memory and text-query latency while eight worst-case PNGs decode.

Starts `probsearch serve` (no Redis, so no cache) on 127.0.0.1, then, while one client sends
text queries back to back, sends ROUNDS bursts of eight concurrent uploads of the worst PNG
the limits allow: an all-zero RGBA image of the largest square within max_image_pixels (a few
KB on the wire, 16 MB decoded). The server's RSS is sampled every 10 ms. Writes
benchmarks/results/image_burst.md with the machine, load average and command.

    .venv/bin/python benchmarks/image_burst.py --model MODEL_DIR --index-root INDEX_ROOT
    .venv/bin/python benchmarks/image_burst.py --work-dir /tmp/burst   # builds a small model first

Targets (issue 14): peak RSS growth under 300 MB, p99 of concurrent text queries under 100 ms.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import platform
import shlex
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
import psutil
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.networks.model_config import ModelConfig  # noqa: E402
from service.image_decode import default_pixel_limit  # noqa: E402

PROBSEARCH = Path(sys.executable).parent / "probsearch"
CONCURRENT_IMAGES = 8
IDLE_S = 15.0  # text queries alone first: the machine's own latency tail, for comparison


def png(side: int, mode: str = "RGBA") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (side, side)).save(buffer, "PNG")
    return buffer.getvalue()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def build_artifacts(work_dir: Path) -> tuple[Path, Path]:
    """A small shapes model and both indexes, as the service tests build them."""
    model, index_root, shapes = work_dir / "model", work_dir / "indexes", work_dir / "shapes"
    if (model / "model.json").is_file() and index_root.is_dir():
        return model, index_root

    def run(*args: str | Path) -> None:
        subprocess.run([str(PROBSEARCH), *map(str, args)], check=True)

    run("data", "shapes", "--out", shapes, "--images", "240")
    run("train", "--data", shapes, "--out", model, "--epochs", "1", "--no-progress")
    for modality in ("image", "text"):
        run("reindex", "--modality", modality, "--source", shapes, "--model", model,
            "--index-root", index_root, "--index-type", "flat", "--activate")  # fmt: skip
    return model, index_root


class RssSampler(threading.Thread):
    """Samples a process's RSS every 10 ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.monotonic(), self.process.memory_info().rss))
            time.sleep(0.01)

    def between(self, start: float, end: float) -> list[int]:
        return [rss for t, rss in self.samples if start <= t <= end]


def start_server(model: Path, index_root: Path, port: int, env: dict) -> subprocess.Popen:
    command = [str(PROBSEARCH), "serve", "--model", str(model), "--index-root", str(index_root),
               "--port", str(port), "--log-level", "warning"]  # fmt: skip
    process = subprocess.Popen(command, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    process.terminate()
    raise RuntimeError("the server did not become ready in 120 s")


def text_load(url: str, stop: threading.Event, log: list[tuple[float, float, int]]) -> None:
    """Text queries back to back (each text unique: no cache anyway); (start, ms, status)."""
    with httpx.Client(base_url=url, timeout=30) as http:
        i = 0
        while not stop.is_set():
            started = time.monotonic()
            status = http.post(
                "/search/text", json={"text": f"a red circle {i}", "k": 5}
            ).status_code
            log.append((started, 1000 * (time.monotonic() - started), status))
            i += 1


def upload(url: str, data: bytes) -> tuple[int, float]:
    started = time.monotonic()
    response = httpx.post(f"{url}/search/image", files={"image": ("w.png", data, "image/png")},
                          data={"k": "5"}, timeout=60)  # fmt: skip
    return response.status_code, 1000 * (time.monotonic() - started)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--index-root", type=Path)
    parser.add_argument("--work-dir", type=Path, default=Path("runs/image_burst"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="A service setting for the server, e.g. max_concurrent_decodes=1.",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/image_burst.md")
    args = parser.parse_args()
    model, index_root = args.model, args.index_root
    if model is None or index_root is None:
        model, index_root = build_artifacts(args.work_dir)
    configured = dict(setting.partition("=")[::2] for setting in args.setting)
    limit = int(configured.get("max_image_pixels") or default_pixel_limit(
        ModelConfig.load(model).image_size))  # fmt: skip
    side = math.isqrt(limit)
    worst, bomb = png(side), png(6000, "L")
    load_before = os.getloadavg()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBSEARCH_")}
    env["PROBSEARCH_DEVICE"] = "cpu"
    for setting in args.setting:
        name, _, value = setting.partition("=")
        env[f"PROBSEARCH_{name.upper()}"] = value
    server = start_server(model, index_root, port, env)
    url = f"http://127.0.0.1:{port}"
    sampler = RssSampler(server.pid)
    try:
        results = run_bursts(url, sampler, worst, bomb, args.rounds)
    finally:
        sampler.stop.set()
        server.terminate()
        server.wait(timeout=30)
    write_report(args.out, results, side, len(worst), len(bomb), limit, load_before, args.setting)


def run_bursts(url: str, sampler: RssSampler, worst: bytes, bomb: bytes, rounds: int) -> dict:
    for i in range(20):  # warm-up: encoders, allocator, thread pools
        httpx.post(f"{url}/search/text", json={"text": f"warm {i}"}, timeout=30)
    for _ in range(2):
        upload(url, worst)
    sampler.start()
    stop, texts = threading.Event(), []
    loader = threading.Thread(target=text_load, args=(url, stop, texts), daemon=True)
    loader.start()
    time.sleep(IDLE_S)
    idle_end = time.monotonic()
    windows, images = [], []
    with ThreadPoolExecutor(CONCURRENT_IMAGES) as pool:
        for _ in range(rounds):
            start = time.monotonic()
            images += list(pool.map(lambda _: upload(url, worst), range(CONCURRENT_IMAGES)))
            windows.append((start, time.monotonic()))
            time.sleep(0.5)
    bomb_status, bomb_ms = upload(url, bomb)
    time.sleep(3.0)
    stop.set()
    loader.join(timeout=30)
    settle_end = time.monotonic()
    first = sampler.samples[0][0]
    in_burst = [ms for t, ms, _ in texts if any(a <= t <= b for a, b in windows)]
    return {
        "rss_idle": np.median(sampler.between(first, idle_end)),
        "rss_peak": max(sampler.between(idle_end, settle_end)),
        "rss_after": np.median(sampler.between(settle_end - 1.0, settle_end)),
        "text_idle": [ms for t, ms, _ in texts if t < idle_end],
        "text_burst": in_burst,
        "text_errors": sum(status != 200 for _, _, status in texts),
        "images": images,
        "bomb": (bomb_status, bomb_ms),
    }


def write_report(out: Path, r: dict, side: int, worst_bytes: int, bomb_bytes: int, limit: int,
                 load_before: tuple[float, float, float], settings: list[str]) -> None:  # fmt: skip
    mib = 2**20
    growth = (r["rss_peak"] - r["rss_idle"]) / mib
    image_ms = [ms for status, ms in r["images"] if status == 200]
    lines = [
        "# Image-burst benchmark",
        "",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"- command: `python {shlex.join(sys.argv)}`",
        f"- machine: {cpu_model()}; {os.cpu_count()} logical CPUs (shared with other jobs);"
        f" {psutil.virtual_memory().total / 2**30:.0f} GiB RAM; Python {platform.python_version()}",
        f"- load average before (1/5/15 min): {' / '.join(f'{x:.2f}' for x in load_before)};"
        f" after: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"- server: `probsearch serve`, pixel limit {limit} = {side}x{side}, settings"
        f" {', '.join(settings) or 'all default'}; no Redis (no cache), CPU",
        f"- worst case: all-zero RGBA PNG {side}x{side}, {worst_bytes} bytes, 8 concurrent"
        f" uploads x {len(r['images']) // CONCURRENT_IMAGES} rounds; one client sends text"
        " queries back to back throughout",
        "",
        "| measure | value | target |",
        "| --- | ---: | ---: |",
        f"| server RSS idle (MiB) | {r['rss_idle'] / mib:.0f} | |",
        f"| server RSS peak during bursts (MiB) | {r['rss_peak'] / mib:.0f} | |",
        f"| peak RSS growth (MiB) | {growth:.0f} | < 300 |",
        f"| server RSS 3 s after the last burst (MiB) | {r['rss_after'] / mib:.0f} | |",
        f"| text query p50 / p99 before the bursts, {IDLE_S:.0f} s (ms) |"
        f" {percentile(r['text_idle'], 50):.1f} / {percentile(r['text_idle'], 99):.1f} | |",
        f"| text query p50 / p99 during bursts (ms) | {percentile(r['text_burst'], 50):.1f} /"
        f" {percentile(r['text_burst'], 99):.1f} | p99 < 100 |",
        f"| text queries during bursts / failed overall | {len(r['text_burst'])} /"
        f" {r['text_errors']} | |",
        f"| image request p50 / p99 (ms), 200s of {len(r['images'])} | "
        f"{percentile(image_ms, 50):.0f} / {percentile(image_ms, 99):.0f}, {len(image_ms)} | |",
        f"| 6000x6000 all-zero PNG ({bomb_bytes} bytes): status, ms | {r['bomb'][0]},"
        f" {r['bomb'][1]:.0f} | 413 |",
        "",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
