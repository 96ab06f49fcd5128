"""Processes and artifacts of benchmarks/service_bench.py: a throwaway redis-server, the
server under test, background CPU load, the demo build and the synthetic gallery."""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def redis_server(log_dir: Path) -> Iterator[str]:
    """A throwaway redis-server on a free port, no persistence; yields its base URL."""
    import redis

    port = free_port()
    log = (log_dir / "redis.log").open("w")
    command = [
        "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}"
    try:
        client = redis.Redis.from_url(url)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"redis-server did not answer; see {log_dir / 'redis.log'}")
        client.close()
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def provenance(command: str) -> str:
    """The sentence a results file opens with: the command, the commit (and whether the tree
    had uncommitted changes), the machine and its load when the run ended."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout

    dirty = " (with uncommitted changes)" if git("status", "--porcelain").strip() else ""
    return (
        f"Command: `{command}` at commit {git('rev-parse', '--short', 'HEAD').strip()}{dirty}; "
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; load "
        f"(1 min) {os.getloadavg()[0]:.1f}."
    )


SERVE = "import sys; from probsearch.cli import main; sys.argv[0] = 'probsearch'; main()"


@contextmanager
def server(
    env: dict[str, str],
    model: Path,
    index_root: Path,
    log_path: Path,
    fd_limit: int | None = None,
) -> Iterator[tuple]:
    """`probsearch serve` on a free port; yields (base URL, psutil.Process) once ready.
    `fd_limit`: the server's file-descriptor limit (soft and hard), e.g. 1024."""
    port = free_port()
    command = [
        sys.executable,
        "-c",
        SERVE,
        "serve",
        "--model",
        str(model),
        "--index-root",
        str(index_root),
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    log = log_path.open("w")

    def limit_fds() -> None:
        if fd_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    process = subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit_fds
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not become ready; log:\n{tail(log_path)}")
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield url, psutil.Process(process.pid)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def background_load(active: bool) -> Iterator[None]:
    """One busy-loop process per logical CPU while active."""
    spinners = []
    if active:
        spinners = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)
        ]
        time.sleep(0.5)
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.terminate()
        for spinner in spinners:
            spinner.wait(timeout=10)


@dataclass(frozen=True)
class Artifacts:
    """The demo's model and indexes, and what requests are built from."""

    model: Path
    index_root: Path
    captions: list[str]  # test-split captions
    images: list[bytes]  # test-split PNG files
    gallery_mu: np.ndarray  # rows of the image gallery, for embedding queries
    gallery_logvar: np.ndarray


def demo_artifacts(
    demo_dir: Path, quick: bool, plan_name: str = "shapes", image_backbone: str | None = None
) -> Artifacts:
    """Build (or reuse) the demo's data, model and calibrated indexes in demo_dir: the shapes
    lab (SMALL_PLAN when quick) or the clip-art demo on the pretrained backbones (its heads on
    `image_backbone` when one is named, as `probsearch demo --image-backbone` builds it)."""
    from indexer.registry import ActiveRegistry
    from models.threads import configure_torch_threads
    from probsearch.demo import (
        CLIPART_PLAN,
        SHAPES_PLAN,
        SMALL_PLAN,
        build_demo,
        with_image_backbone,
    )

    plan = CLIPART_PLAN if plan_name == "clipart" else SMALL_PLAN if quick else SHAPES_PLAN
    if image_backbone is not None:
        plan = with_image_backbone(plan, image_backbone)
    configure_torch_threads()  # as `probsearch demo` does
    paths = build_demo(demo_dir, plan, None, say=lambda line: print(line, flush=True))
    registry = ActiveRegistry(paths.index_root, None)
    version = registry.version_path("image", registry.active_version("image"))
    lines = (paths.data / "captions.jsonl").read_text().splitlines()
    captions = [c["text"] for c in map(json.loads, lines) if c["split"] == "test"]
    lines = (paths.data / "images.jsonl").read_text().splitlines()
    files = [im["file"] for im in map(json.loads, lines) if im["split"] == "test"][:64]
    rows = slice(0, 256)
    return Artifacts(
        paths.model,
        paths.index_root,
        captions,
        [(paths.data / name).read_bytes() for name in files],
        np.load(version / "mu.npy", mmap_mode="r")[rows].astype(np.float32),
        np.load(version / "logvar.npy", mmap_mode="r")[rows].astype(np.float32),
    )


def synthetic_gallery(work: Path, model: Path, count: int, metrics: tuple[str, ...]) -> Path:
    """An index root whose active image version holds `count` synthetic Gaussians of the
    model's dimension (clustered, as benchmarks/index_bench.py draws them), indexed as
    `probsearch reindex` would (index type auto); built once per size, metrics and model."""
    from index_bench import clustered_gaussians

    from indexer.build import default_memory_budget
    from indexer.manifest import Calibration, Manifest, checksum_dir, write_manifest
    from indexer.publish import verify_version
    from indexer.registry import ActiveRegistry
    from indexer.version_writer import (
        served_metrics,
        write_arrays_and_metadata,
        write_version_indexes,
    )
    from models.networks.model_config import ModelConfig, model_fingerprint

    dim = ModelConfig.load(model).embed_dim
    name, model_hash = model_fingerprint(model, "image")
    root = work / f"gallery-{count}-d{dim}-{'-'.join(metrics)}-{model_hash[:12]}"
    registry, version = ActiveRegistry(root, None), "synthetic"
    final = registry.version_path("image", version)
    if (final / "manifest.json").is_file():
        return root
    tmp = final.with_name(".tmp-synthetic")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    started = time.perf_counter()
    mu, logvar = clustered_gaussians(count, dim, seed=0, clusters=1000)
    block = 100_000
    parts = (
        (
            mu[s : s + block],
            logvar[s : s + block],
            [
                {"id": f"syn-{i}", "uri": f"synthetic://{i}"}
                for i in range(s, min(s + block, count))
            ],
        )
        for s in range(0, count, block)
    )
    write_arrays_and_metadata(tmp, parts, count, dim)
    del mu, logvar
    indexes = write_version_indexes(tmp, metrics, "auto", default_memory_budget())
    served = served_metrics(indexes.families)
    manifest = Manifest(
        version=version,
        modality="image",
        model_name=name,
        model_hash=model_hash,
        dim=dim,
        count=count,
        metrics=served,
        families=indexes.families,
        index_type=indexes.index_type,
        index_params=indexes.index_params,
        search_params=indexes.search_params,
        calibration={m: Calibration() for m in served},
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        source="synthetic",
    ).with_files(checksum_dir(tmp))
    write_manifest(tmp, manifest)
    verify_version(tmp)
    os.rename(tmp, final)
    registry.activate("image", version)
    print(
        f"built the synthetic gallery ({count} x {dim}, {indexes.index_type}) in "
        f"{time.perf_counter() - started:.0f} s: {root}",
        flush=True,
    )
    return root


def gallery_queries(index_root: Path) -> tuple[np.ndarray, np.ndarray]:
    """Query Gaussians near gallery items (moved by noise in request_maker)."""
    version = index_root / "image" / "synthetic"
    rows = np.random.default_rng(1).integers(
        0, len(np.load(version / "mu.npy", mmap_mode="r")), 256
    )
    rows.sort()
    mu = np.load(version / "mu.npy", mmap_mode="r")[rows].astype(np.float32)
    return mu, np.load(version / "logvar.npy", mmap_mode="r")[rows].astype(np.float32)
