"""The service with PROBSEARCH_SHORTLIST_BACKEND=milvus against a real Milvus Lite server:
the same answers as the FAISS backend, and 503 + /readyz false while Milvus is down."""

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from indexer.cli import app as indexer_app
from indexer.milvus_store import import_pymilvus
from indexer.registry import ActiveRegistry
from tests.service.conftest import METRICS, Artifacts, ServerThread, copy_index_root, make_settings

QUERIES = ("a red circle", "two blue squares", "a small green triangle")


class MilvusLiteServer:
    """`python -m milvus_lite server` on a fixed port, stoppable and restartable."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(self.data_dir)]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        pymilvus = import_pymilvus()
        while True:
            try:
                pymilvus.MilvusClient(self.uri, timeout=1).close()
                return
            except pymilvus.MilvusException as e:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    stderr = self.process.stderr.read()
                    raise RuntimeError(f"Milvus Lite did not start: {stderr}") from e
                time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture(scope="module")
def milvus(tmp_path_factory) -> Iterator[MilvusLiteServer]:
    server = MilvusLiteServer(tmp_path_factory.mktemp("milvus") / "data")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def index_root(tmp_path_factory, artifacts: Artifacts, milvus: MilvusLiteServer) -> Path:
    """The session's indexes plus a new image version built and activated with milvus."""
    root = copy_index_root(artifacts, tmp_path_factory.mktemp("milvus-indexes") / "indexes")
    env = {"PROBSEARCH_SHORTLIST_BACKEND": "milvus", "PROBSEARCH_MILVUS_URI": milvus.uri}
    args = ["reindex", "--modality", "image", "--source", str(artifacts.shapes), "--model",
            str(artifacts.model), "--index-root", str(root), "--metrics", METRICS,
            "--index-type", "flat", "--activate"]  # fmt: skip
    result = CliRunner().invoke(indexer_app, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert ActiveRegistry(root, None).active_version("image") not in (None, artifacts.image_v1)
    return root


def search(client: httpx.Client, text: str, metric: str) -> httpx.Response:
    return client.post("/search/text", json={"text": text, "k": 10, "metric": metric})


def test_milvus_backend_answers_like_faiss(artifacts, index_root, milvus) -> None:
    faiss_settings = make_settings(artifacts, index_root, galleries=["image"])
    milvus_settings = faiss_settings.model_copy(
        update={"shortlist_backend": "milvus", "milvus_uri": milvus.uri}
    )
    answers = {}
    for name, settings in (("faiss", faiss_settings), ("milvus", milvus_settings)):
        with ServerThread(settings) as server, httpx.Client(base_url=server.url) as client:
            assert client.get("/readyz").status_code == 200
            for text in QUERIES:
                for metric in ("w2", "kl", "min_kl"):
                    response = search(client, text, metric)
                    assert response.status_code == 200, response.text
                    body = response.json()
                    answers[name, text, metric] = [
                        (hit["id"], round(hit["distance"], 4)) for hit in body["results"]
                    ]
    for text in QUERIES:
        for metric in ("w2", "kl", "min_kl"):
            assert len(answers["milvus", text, metric]) == 10
            assert answers["milvus", text, metric] == answers["faiss", text, metric]


def test_milvus_down_is_503_and_not_ready_then_recovers(artifacts, index_root, milvus) -> None:
    settings = make_settings(
        artifacts, index_root, galleries=["image"], shortlist_backend="milvus"
    ).model_copy(update={"milvus_uri": milvus.uri})
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/readyz").status_code == 200
        assert search(client, QUERIES[0], "kl").status_code == 200
        milvus.stop()
        try:
            response = search(client, QUERIES[0], "kl")
            assert response.status_code == 503, response.text
            assert "Milvus" in response.text and "retry" in response.text
            ready = client.get("/readyz")
            assert ready.status_code == 503 and ready.json()["ready"] is False
            assert "Milvus" in ready.json()["detail"]
        finally:
            milvus.start()
        deadline = time.monotonic() + 20
        while search(client, QUERIES[0], "kl").status_code != 200:
            assert time.monotonic() < deadline, "no recovery after Milvus came back"
            time.sleep(0.3)
        assert client.get("/readyz").status_code == 200
