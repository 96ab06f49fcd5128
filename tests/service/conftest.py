"""Session fixtures of the service tests: a tiny trained model, real indexes, real servers.

Everything costly is built once per session: a shapes dataset, a model trained for one epoch
by `probsearch train`, and an index root where
`probsearch reindex` built the image and caption galleries (version 1 of each, active) plus a
second image version that is built but not active (for the hot-swap tests).
"""

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from pytest_redis import factories
from pytest_redis.executor.process import RedisExecutor

from indexer.registry import ActiveRegistry
from indexer.store import open_version
from models.datasets.shapes import generate_shapes
from models.distance.gaussian import pairwise_distance
from models.settings import Settings
from probsearch.background_server import BackgroundServer
from tests.service.milvus_lite import MilvusLiteServer

PROBSEARCH = Path(sys.executable).parent / "probsearch"
METRICS = "w2,kl,min_kl"
ADMIN_KEY = "test-admin-key-0123456789"


def probsearch(*args: str | Path, env: dict[str, str] | None = None) -> str:
    """Run the `probsearch` console script; fail the test with its stderr if it fails."""
    command = [str(PROBSEARCH), *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


@dataclass(frozen=True)
class Artifacts:
    """The session's model dir, dataset and index root."""

    shapes: Path
    model: Path
    index_root: Path
    image_v1: str
    image_v2: str
    text_v1: str


def reindex(artifacts_root: Path, shapes: Path, model: Path, modality: str, activate: bool) -> str:
    """Build one version with `probsearch reindex`; returns its name."""
    index_root = artifacts_root / "indexes"
    before = set(ActiveRegistry(index_root, None).versions(modality))
    args = ["reindex", "--modality", modality, "--source", shapes, "--model", model,
            "--index-root", index_root, "--metrics", METRICS, "--index-type", "flat"]  # fmt: skip
    probsearch(*args, *(["--activate"] if activate else []))
    (new,) = set(ActiveRegistry(index_root, None).versions(modality)) - before
    return new


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    """Dataset, model and indexes, built once for the whole session (~30 s on 2 cores)."""
    root = tmp_path_factory.mktemp("service-artifacts")
    shapes, model = root / "shapes", root / "model"
    generate_shapes(shapes, num_images=240, seed=0, workers=1, progress=False)
    probsearch("train", "--data", shapes, "--out", model, "--epochs", "1", "--no-progress")
    image_v1 = reindex(root, shapes, model, "image", activate=True)
    text_v1 = reindex(root, shapes, model, "text", activate=True)
    image_v2 = reindex(root, shapes, model, "image", activate=False)
    return Artifacts(shapes, model, root / "indexes", image_v1, image_v2, text_v1)


def copy_index_root(artifacts: Artifacts, destination: Path) -> Path:
    """A private copy of the index root, for tests that change the active versions."""
    shutil.copytree(artifacts.index_root, destination, ignore=shutil.ignore_patterns(".*"))
    return destination


def brute_force(version_dir, metric: str, mu: list[float], logvar: list[float], k: int):
    """Exact top-k of the whole gallery: (ids, distances), ties broken by the smaller row."""
    version = open_version(version_dir)
    try:
        distances = pairwise_distance(
            metric,
            torch.tensor([mu], dtype=torch.float32),
            torch.tensor([logvar], dtype=torch.float32),
            torch.from_numpy(np.array(version.mu, dtype=np.float32)),  # (N, D)
            torch.from_numpy(np.array(version.logvar, dtype=np.float32)),
        )[0].numpy()  # (N,)
        rows = np.argsort(distances, kind="stable")[:k]
        ids = [record["id"] for record in version.metadata(rows.tolist())]
        return ids, distances[rows]
    finally:
        version.close()


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def milvus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MilvusLiteServer]:
    """A Milvus Lite server (its own process, stoppable) for the milvus backend's tests."""
    server = MilvusLiteServer(tmp_path_factory.mktemp("milvus") / "data")
    server.start()
    yield server
    server.stop()


class ServerThread(BackgroundServer):
    """A real uvicorn server running create_app(settings) in a thread, on a free port."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings.model_copy(update={"host": "127.0.0.1", "port": 0}))


def make_settings(artifacts: Artifacts, index_root: Path | None = None, **overrides) -> Settings:
    """Settings of a test server: small limits so the limit tests stay cheap."""
    values = {
        "index_root": index_root or artifacts.index_root,
        "model": artifacts.model,
        "api_keys": [ADMIN_KEY],
        "max_image_bytes": 200_000,
        "max_text_chars": 500,
        "mc_samples": 8,
        "poll_interval_s": 0.3,
        "redis_backoff_max_s": 0.5,
        "device": "cpu",
        **overrides,
    }
    return Settings(**values)


# A redis-server of the service tests' own: the other packages' tests flush and activate on the
# shared one, and pub/sub activation events reach every database of a server.
service_redis = factories.redis_proc(port=None)


def redis_url_of(redis_server: RedisExecutor, db: int = 0) -> str:
    """URL of a database of the session's redis-server."""
    return f"redis://{redis_server.host}:{redis_server.port}/{db}"


@pytest.fixture(scope="session")
def server(artifacts: Artifacts, service_redis: RedisExecutor) -> Iterator[ServerThread]:
    """The shared server: session indexes, Redis database 0 of the service tests' redis-server."""
    settings = make_settings(artifacts, redis_url=redis_url_of(service_redis, 0))
    with ServerThread(settings) as running:
        yield running


@pytest.fixture
def client(server: ServerThread) -> Iterator[httpx.Client]:
    """An HTTP client of the shared server."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        yield http
