"""`reindex --engine ray` on a real local Ray runtime: it publishes the version --engine local
publishes (ids, arrays, search results, manifest, bad-data report), survives SIGKILL at a random
point and resumes, and without Ray installed says which extra to install."""

import dataclasses
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import ray
from typer.testing import CliRunner

from indexer.cli import app
from indexer.manifest import read_manifest
from indexer.publish import ReindexJob, run_reindex
from indexer.ray_engine import ActorPool, RayOptions, plan_pool
from indexer.registry import ActiveRegistry
from indexer.store import open_version
from models.datasets.records import load_dataset
from tests.indexer.synthetic import publish_synthetic

REPO = Path(__file__).resolve().parents[2]
OLD = "20000101T000000000Z-old"
runner = CliRunner()


RAY_CLI = Path(sys.executable).parent / "ray"


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory: pytest.TempPathFactory):
    """One local Ray cluster for the in-process runs (reindex uses a runtime already started).

    The head starts in a `ray start` process of its own, not by ray.init in this one: the test
    process holds other libraries' gRPC threads (pymilvus), and a raylet forked from it hung
    until Ray's 30 s start-up limit in one full-suite run."""
    port = free_port()
    head = [str(RAY_CLI), "start", "--head", f"--port={port}", "--num-cpus=2",
            "--include-dashboard=false", "--disable-usage-stats"]  # fmt: skip
    # A throwaway cluster on 127.0.0.1 for this test process only: no token to hand around.
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    subprocess.run(head, check=True, capture_output=True, timeout=120, env=env)
    try:
        ray.init(address=f"127.0.0.1:{port}", log_to_driver=False, logging_level="warning")
        yield
    finally:
        ray.shutdown()
        subprocess.run([str(RAY_CLI), "stop", "--force"], capture_output=True, timeout=120)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_both(tmp_path: Path, ray_options: RayOptions | None = None, **fields) -> tuple[Path, Path]:
    """Publish one gallery with each engine into its own index root; the two version dirs."""
    local = ReindexJob(index_root=tmp_path / "local", progress=False, **fields)
    on_ray = dataclasses.replace(
        local, index_root=tmp_path / "ray", engine="ray", ray=ray_options or RayOptions(workers=2)
    )
    return tuple(run_reindex(job).path for job in (local, on_ray))  # type: ignore[return-value]


def comparable_manifest(path: Path) -> dict:
    manifest = dataclasses.asdict(read_manifest(path))
    for field in ("version", "created_at", "engine"):
        manifest.pop(field)
    return manifest


def test_ray_publishes_the_version_local_publishes(
    tmp_path, small_shapes, random_model, local_ray
) -> None:
    local_dir, ray_dir = run_both(
        tmp_path, modality="image", source=small_shapes, model_dir=random_model,
        metrics=("w2", "kl"), index_type="flat", chunk_items=32, batch_size=16,
    )  # fmt: skip
    assert read_manifest(ray_dir).engine == "ray" and read_manifest(local_dir).engine == "local"
    assert comparable_manifest(ray_dir) == comparable_manifest(local_dir)
    local, on_ray = open_version(local_dir, verify=True), open_version(ray_dir, verify=True)
    count = local.manifest.count
    assert count == len(load_dataset(small_shapes).images) == on_ray.manifest.count
    assert on_ray.metadata(range(count)) == local.metadata(range(count))
    np.testing.assert_allclose(on_ray.mu, local.mu, rtol=0, atol=1e-6)
    np.testing.assert_allclose(on_ray.logvar, local.logvar, rtol=0, atol=1e-6)
    queries = np.arange(0, count, 7)
    for metric in ("w2", "kl"):
        mu_q, logvar_q = np.asarray(local.mu[queries]), np.asarray(local.logvar[queries])
        want = local.shortlist(metric, mu_q, logvar_q, 10)
        got = on_ray.shortlist(metric, mu_q, logvar_q, 10)
        np.testing.assert_array_equal(got, want)
    local.close()
    on_ray.close()


def test_an_actor_with_two_cpus_embeds_as_local_does(
    tmp_path, small_shapes, random_model, local_ray
) -> None:
    local_dir, ray_dir = run_both(
        tmp_path, RayOptions(workers=1, threads=2), modality="image", source=small_shapes,
        model_dir=random_model, index_type="flat", chunk_items=64, batch_size=16,
    )  # fmt: skip
    local, on_ray = open_version(local_dir), open_version(ray_dir)
    np.testing.assert_allclose(on_ray.mu, local.mu, rtol=0, atol=1e-6)
    assert on_ray.metadata(range(local.manifest.count)) == local.metadata(
        range(local.manifest.count)
    )
    local.close()
    on_ray.close()


@pytest.mark.parametrize(
    ("cpus", "gpus", "threads", "want"),
    [
        (16, 2, 1, ActorPool(2, 1, 1, "auto")),
        (16, 2, 4, ActorPool(2, 4, 1, "auto")),  # a GPU actor's CPUs decode its images
        (16, 0, 4, ActorPool(4, 4, 0, "cpu")),
    ],
)
def test_actor_pools_reserve_the_threads_asked_for(cpus, gpus, threads, want) -> None:
    resources = {"CPU": float(cpus), "GPU": float(gpus)}
    assert plan_pool(resources, RayOptions(threads=threads), "auto", 100) == want


def test_bad_items_and_duplicates_across_chunks_count_as_locally(
    tmp_path, small_shapes, random_model, local_ray
) -> None:
    captions = load_dataset(small_shapes).captions[:40]
    lines = [json.dumps({"id": c.id, "text": c.text}) for c in captions]
    lines[5] = "{not json"
    lines[11] = json.dumps({"id": "blank", "text": "   "})
    lines[17] = json.dumps({"id": captions[2].id, "text": "same id, a later chunk"})
    lines[19] = json.dumps({"id": captions[16].id, "text": "same id, the same chunk"})
    source = tmp_path / "captions.jsonl"
    source.write_text("\n".join(lines) + "\n")
    local_dir, ray_dir = run_both(
        tmp_path, modality="text", source=source, model_dir=random_model,
        index_type="flat", chunk_items=8, batch_size=4, max_bad_fraction=0.5,
    )  # fmt: skip
    report = json.loads((ray_dir / "report.json").read_text())
    assert report == json.loads((local_dir / "report.json").read_text())
    assert report["by_reason"] == {"duplicate_id": 2, "empty_caption": 1, "malformed_record": 1}
    assert comparable_manifest(ray_dir) == comparable_manifest(local_dir)


def chunk_files(root: Path) -> list[Path]:
    return list((root / "image" / ".work").glob("*/chunk-*.npz"))


def settled_chunk_count(root: Path, quiet_s: float = 2.0, limit_s: float = 30.0) -> int:
    """The chunks on disk once none has appeared for `quiet_s`: a Ray worker of the killed
    driver may still finish the chunk it was writing before the cluster reaps it."""
    deadline = time.monotonic() + limit_s
    count, since = len(chunk_files(root)), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.1)
        now = len(chunk_files(root))
        if now != count:
            count, since = now, time.monotonic()
    return count


def test_sigkill_at_a_random_point_leaves_the_active_version_and_a_rerun_resumes(
    tmp_path, small_shapes, random_model, local_ray
) -> None:
    root = tmp_path / "index"
    registry = ActiveRegistry(root, None)
    publish_synthetic(registry, "image", OLD)
    registry.activate("image", OLD)
    args = ["reindex", "--modality", "image", "--source", str(small_shapes),
            "--model", str(random_model), "--index-root", str(root), "--index-type", "flat",
            "--activate", "--engine", "ray", "--ray-workers", "1",
            "--chunk-items", "4", "--batch-size", "4"]  # fmt: skip
    seed = random.SystemRandom().randrange(2**32)
    wait_for = random.Random(seed).randrange(0, 30)  # chunks written before the kill, of 30
    job = subprocess.Popen(
        [sys.executable, "-c", "from indexer.cli import app; app()", *args],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(chunk_files(root)) < wait_for:
        assert job.poll() is None, f"reindex ended before the kill (seed {seed})"
        time.sleep(0.01)
    job.send_signal(signal.SIGKILL)
    job.wait()
    done = settled_chunk_count(root)
    assert registry.active_version("image") == OLD, f"seed {seed}"
    assert registry.versions("image") == [OLD], f"seed {seed}"
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    reused = int(result.output.split(" chunks reused")[0].rsplit(" ", 1)[1])
    assert reused == done, f"seed {seed}: {done} chunks on disk after the kill, {reused} reused"
    assert "items/s, engine ray" in result.output
    new = registry.active_version("image")
    assert new != OLD and registry.versions("image") == [OLD, new]
    assert open_version(root / "image" / new, verify=True).manifest.count == 120


def test_without_ray_installed_the_error_names_the_extra(
    tmp_path, small_shapes, random_model, monkeypatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    args = ["reindex", "--modality", "text", "--source", str(small_shapes), "--model",
            str(random_model), "--index-root", str(tmp_path), "--engine", "ray"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: --engine ray needs Ray, which is not installed: pip install 'probsearch[ray]'"
        " (in a checkout: pip install -e '.[cpu,ray]'), or use --engine local"
    ]
    assert not ActiveRegistry(tmp_path, None).versions("text")
