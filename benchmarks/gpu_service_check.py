"""GPU service check: the same app answers the same queries with its re-rank on CUDA (device
auto on a GPU machine) and on CPU; the results must agree. Builds the demo's small plan
(no Redis) in --work-dir, sends text and image queries in-process (httpx ASGI transport),
and writes agreement and per-device latency to --out.

    python benchmarks/gpu_service_check.py --out benchmarks/results/gpu_service_check.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.settings import Settings
from probsearch.demo import SMALL_PLAN, build_demo
from service.http.main import create_app

TEXTS = [f"{n} {c} {s}" for n in ("a", "two") for c in ("red", "blue", "green", "purple")
         for s in ("circles", "squares", "stars")]  # fmt: skip
MC_SAMPLES = 16


async def answers(settings: Settings, images: list[bytes]) -> tuple[list[dict], list[float]]:
    """Responses to every text and image query, and their client latencies in ms."""
    app = create_app(settings)
    bodies, latencies = [], []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gpu-check") as client:
            for i in range(5):  # warm-up (CUDA context, kernels)
                await client.post("/search/text", json={"text": f"warm {i}"})
            for text in TEXTS:
                start = time.perf_counter()
                response = await client.post(
                    "/search/text", json={"text": text, "k": 10, "mc_samples": MC_SAMPLES}
                )
                latencies.append(1000 * (time.perf_counter() - start))
                bodies.append(response.raise_for_status().json())
            for data in images:
                files = {"image": ("q.png", data, "image/png")}
                response = await client.post("/search/image", files=files, data={"k": "10"})
                bodies.append(response.raise_for_status().json())
    return bodies, latencies


def agreement(cpu: list[dict], gpu: list[dict]) -> tuple[int, float, float]:
    """(queries with identical result ids in order, max |distance gap|, max |MI gap|)."""
    same, distance_gap, mi_gap = 0, 0.0, 0.0
    for a, b in zip(cpu, gpu, strict=True):
        same += [h["id"] for h in a["results"]] == [h["id"] for h in b["results"]]
        for ha, hb in zip(a["results"], b["results"], strict=False):
            distance_gap = max(distance_gap, abs(ha["distance"] - hb["distance"]))
        mi = a["query"]["mutual_information"], b["query"]["mutual_information"]
        if None not in mi:
            mi_gap = max(mi_gap, abs(mi[0] - mi[1]))
    return same, distance_gap, mi_gap


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=Path("runs/gpu_service_check"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="run without a GPU (auto = CPU)")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.smoke:
        sys.exit("no CUDA device: this check needs a GPU")
    paths = build_demo(args.work_dir.resolve(), SMALL_PLAN, None)
    images = [p.read_bytes() for p in sorted((paths.data / "images").glob("*.png"))[:20]]
    base = Settings(index_root=paths.index_root, model=paths.model, redis_url=None)
    cpu, cpu_ms = asyncio.run(answers(base.model_copy(update={"device": "cpu"}), images))
    gpu, gpu_ms = asyncio.run(answers(base.model_copy(update={"device": "auto"}), images))
    same, distance_gap, mi_gap = agreement(cpu, gpu)
    lines = [
        "# GPU service check: the service's re-rank on CUDA against CPU",
        "",
        f"Command: `python benchmarks/gpu_service_check.py --out {args.out}`; machine: "
        f"{platform.machine()}, {os.cpu_count()} CPUs, {device_name()}, "
        f"torch {torch.__version__}; load (1 min) {os.getloadavg()[0]:.1f}.",
        f"Demo small plan (no Redis), {len(TEXTS)} text queries with {MC_SAMPLES} MC draws and "
        f"{len(images)} image queries, k=10, in-process ASGI client; encoders on ONNX Runtime "
        "(CPU provider: this machine's onnxruntime has no CUDA provider), re-rank and "
        "uncertainty on the device named.",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| queries with the same top-10 ids in the same order | {same} of {len(cpu)} |",
        f"| max distance gap over the top-10 | {distance_gap:.2e} |",
        f"| max MI gap | {mi_gap:.2e} |",
        f"| text p50 ms, re-rank on CPU | {statistics.median(cpu_ms):.2f} |",
        f"| text p50 ms, re-rank on CUDA | {statistics.median(gpu_ms):.2f} |",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out.read_text())


if __name__ == "__main__":
    main()
