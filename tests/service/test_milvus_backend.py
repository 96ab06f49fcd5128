"""The service with PROBSEARCH_SHORTLIST_BACKEND=milvus against a real Milvus Lite server:
the same answers as the FAISS backend, and 503 + /readyz false while Milvus is down."""

import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from indexer.cli import app as indexer_app
from indexer.registry import ActiveRegistry
from tests.service.conftest import (
    METRICS,
    Artifacts,
    ServerThread,
    brute_force,
    copy_index_root,
    make_settings,
)
from tests.service.milvus_lite import MilvusLiteServer

QUERIES = ("a red circle", "two blue squares", "a small green triangle")
EXACT_METRICS = ("w2", "kl", "csd", "min_kl")  # the end-to-end exactness set
K = 10


def reindex_into_milvus(artifacts: Artifacts, root: Path, uri: str) -> str:
    """`probsearch reindex --activate` of the image gallery with the milvus backend at `uri`."""
    env = {"PROBSEARCH_SHORTLIST_BACKEND": "milvus", "PROBSEARCH_MILVUS_URI": uri}
    args = ["reindex", "--modality", "image", "--source", str(artifacts.shapes), "--model",
            str(artifacts.model), "--index-root", str(root), "--metrics", f"{METRICS},csd",
            "--index-type", "flat", "--activate"]  # fmt: skip
    result = CliRunner().invoke(indexer_app, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    version = ActiveRegistry(root, None).active_version("image")
    assert version not in (None, artifacts.image_v1)
    return version


@pytest.fixture(scope="module")
def index_root(tmp_path_factory, artifacts: Artifacts, milvus: MilvusLiteServer) -> Path:
    """The session's indexes plus a new image version built and activated with milvus."""
    root = copy_index_root(artifacts, tmp_path_factory.mktemp("milvus-indexes") / "indexes")
    reindex_into_milvus(artifacts, root, milvus.uri)
    return root


def exact_search(client: httpx.Client, text: str, metric: str) -> dict:
    """A search whose shortlist = k: no slack, only an exact metric-native shortlist passes."""
    request = {"text": text, "k": K, "metric": metric, "shortlist": K, "return_embedding": True}
    response = client.post("/search/text", json=request)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["metric"] == metric
    return body


def assert_brute_force(root: Path, version: str, metric: str, body: dict) -> None:
    query = body["query"]
    ids, distances = brute_force(root / "image" / version, metric, query["mu"], query["logvar"], K)
    assert [hit["id"] for hit in body["results"]] == ids, metric
    np.testing.assert_allclose(
        [hit["distance"] for hit in body["results"]], distances, rtol=1e-4, atol=1e-5
    )


def search(client: httpx.Client, text: str, metric: str) -> httpx.Response:
    return client.post("/search/text", json={"text": text, "k": K, "metric": metric})


def test_milvus_backend_ranks_exactly_like_faiss_and_brute_force(
    artifacts, index_root, milvus
) -> None:
    version = ActiveRegistry(index_root, None).active_version("image")
    faiss_settings = make_settings(artifacts, index_root, galleries=["image"])
    milvus_settings = faiss_settings.model_copy(
        update={"shortlist_backend": "milvus", "milvus_uri": milvus.uri}
    )
    answers = {}
    for name, settings in (("faiss", faiss_settings), ("milvus", milvus_settings)):
        with ServerThread(settings) as server, httpx.Client(base_url=server.url) as client:
            assert client.get("/readyz").status_code == 200
            for text in QUERIES:
                for metric in EXACT_METRICS:
                    answers[name, text, metric] = body = exact_search(client, text, metric)
                    assert body["index_version"] == version
    for text in QUERIES:
        for metric in EXACT_METRICS:
            got = answers["milvus", text, metric]
            assert_brute_force(index_root, version, metric, got)
            assert got["results"] == answers["faiss", text, metric]["results"]


def test_a_milvus_lite_file_runs_reindex_activate_serve_search(artifacts, tmp_path) -> None:
    root = copy_index_root(artifacts, tmp_path / "indexes")
    uri = str(tmp_path / "milvus.db")
    version = reindex_into_milvus(artifacts, root, uri)
    settings = make_settings(
        artifacts, root, galleries=["image"], shortlist_backend="milvus", milvus_uri=uri
    )
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/readyz").status_code == 200
        for metric in EXACT_METRICS:
            body = exact_search(client, QUERIES[1], metric)
            assert body["index_version"] == version
            assert_brute_force(root, version, metric, body)


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
