"""An index swap under search load with the Milvus shortlist backend: `probsearch reindex
--activate` writes a new version's collections and moves the aliases while a real server
answers; no request is lost and every answer is the exact ranking of the version it names."""

import os
import threading
from pathlib import Path
from typing import Any

import httpx
import redis
from pytest_redis.executor.process import RedisExecutor

from indexer.manifest import read_manifest
from indexer.milvus_store import MilvusBackend, collection_name
from indexer.milvus_writer import write_version_dir
from indexer.registry import ActiveRegistry
from models.datasets.shapes import generate_shapes
from tests.service.conftest import (
    METRICS,
    Artifacts,
    ServerThread,
    brute_force,
    copy_index_root,
    make_settings,
    probsearch,
    redis_url_of,
    wait_for,
)
from tests.service.milvus_lite import MilvusLiteServer

K = 5
CYCLE = ("w2", "kl", "min_kl")
RESPONSE_KEYS = {"query", "results", "metric", "index_version", "model", "timings_ms"}
Answer = tuple[str, int, Any]  # (metric asked, status, body or text)


def client_loop(url: str, log: list[Answer], stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        i = 0
        while not stop.is_set():
            metric = CYCLE[i % len(CYCLE)]
            request = {"text": f"a circle {i % 5}", "k": K, "metric": metric,
                       "return_embedding": True}  # fmt: skip
            response = http.post("/search/text", json=request)
            is_json = response.headers.get("content-type", "").startswith("application/json")
            log.append(
                (metric, response.status_code, response.json() if is_json else response.text)
            )
            i += 1


def check_answer(root: Path, metric: str, status: int, body: Any, versions: set[str]) -> None:
    """200, well-formed, from a known version, and that version's exact top-k."""
    assert status == 200, body
    assert set(body) >= RESPONSE_KEYS and body["metric"] == metric
    assert body["index_version"] in versions
    assert [hit["rank"] for hit in body["results"]] == list(range(1, K + 1))
    query = body["query"]
    ids, _ = brute_force(
        root / "image" / body["index_version"], metric, query["mu"], query["logvar"], K
    )
    assert [hit["id"] for hit in body["results"]] == ids


def test_reindex_and_activate_under_load_loses_no_request(
    artifacts: Artifacts, service_redis: RedisExecutor, milvus: MilvusLiteServer, tmp_path: Path
) -> None:
    root = copy_index_root(artifacts, tmp_path / "indexes")
    url = redis_url_of(service_redis, 4)
    redis.Redis.from_url(url).flushdb()
    backend = MilvusBackend(milvus.uri)
    old = artifacts.image_v1
    write_version_dir(backend, root / "image" / old)
    ActiveRegistry(root, url, aliases=backend).activate("image", old)
    # a different gallery: rows of one version paired with the other's arrays would show
    gallery = generate_shapes(tmp_path / "shapes-new", num_images=80, seed=7, workers=1,
                              progress=False)  # fmt: skip
    settings = make_settings(
        artifacts, index_root=root, redis_url=url, poll_interval_s=60, galleries=["image"],
        shortlist_backend="milvus", milvus_uri=milvus.uri,
    )  # fmt: skip
    logs: list[list[Answer]] = [[] for _ in range(3)]
    stop = threading.Event()
    with ServerThread(settings) as server:
        threads = [
            threading.Thread(target=client_loop, args=(server.url, log, stop)) for log in logs
        ]
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: sum(map(len, logs)) >= 6, 30, "requests before the swap")
            env = {**os.environ, "PROBSEARCH_SHORTLIST_BACKEND": "milvus",
                   "PROBSEARCH_MILVUS_URI": milvus.uri}  # fmt: skip
            args = ["reindex", "--modality", "image", "--source", gallery, "--model",
                    artifacts.model, "--index-root", root, "--metrics", METRICS,
                    "--index-type", "flat", "--redis-url", url, "--activate"]  # fmt: skip
            probsearch(*args, env=env)
            new = ActiveRegistry(root, None).active_version("image")
            assert new not in (None, old, artifacts.image_v2)

            def new_answers() -> int:  # the fewest any client has had
                return min(sum(_version(body) == new for *_, body in log) for log in logs)

            wait_for(lambda: new_answers() >= 2, 30, "answers from the new version")
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
    for family in read_manifest(root / "image" / new).families:
        assert backend.active_collection("image", family) == collection_name("image", new, family)
    backend.connection.close()
    for log in logs:
        for metric, status, body in log:
            check_answer(root, metric, status, body, {old, new})
        versions = [body["index_version"] for *_, body in log]
        switch = versions.index(new)  # per client: the old version, then the new one, never back
        assert set(versions[:switch]) == {old} and set(versions[switch:]) == {new}


def _version(body: Any) -> str | None:
    return body.get("index_version") if isinstance(body, dict) else None
