"""Index swaps under load, Redis outages and recovery, freeing retired versions."""

import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
from pytest_redis.executor.process import RedisExecutor

from indexer.active_record import ActiveRecord, parse_record
from indexer.registry import ActiveRegistry, RedisUnreachableError, active_key, namespace_of
from models.settings import Settings
from service.index_holder import IndexHolder
from service.metrics import ServiceMetrics
from tests.service.conftest import (
    Artifacts,
    ServerThread,
    copy_index_root,
    make_settings,
    redis_url_of,
    wait_for,
)

DEFAULT_BACKOFF_MAX_S = Settings.model_fields["redis_backoff_max_s"].default


def test_activation_under_load_swaps_without_failures(
    artifacts: Artifacts, service_redis: RedisExecutor, tmp_path: Path
) -> None:
    root = copy_index_root(artifacts, tmp_path / "indexes")
    url = redis_url_of(service_redis, 1)  # a database of its own: other servers use db 0
    redis.Redis.from_url(url).flushdb()
    # A long poll interval: the swap must come from the pub/sub activation event.
    settings = make_settings(artifacts, index_root=root, redis_url=url, poll_interval_s=60)
    with ServerThread(settings) as server:
        seen: list[list[tuple[int, str | None]]] = [[] for _ in range(3)]
        stop = threading.Event()

        def client_loop(log: list[tuple[int, str | None]]) -> None:
            with httpx.Client(base_url=server.url, timeout=30) as http:
                for i in range(10_000):
                    if stop.is_set():
                        return
                    response = http.post("/search/text", json={"text": f"circle {i % 7}", "k": 3})
                    log.append((response.status_code, response.json().get("index_version")))

        threads = [threading.Thread(target=client_loop, args=(log,)) for log in seen]
        for thread in threads:
            thread.start()
        # every client answered from the old version first (a thread can start late)
        wait_for(lambda: all(len(log) >= 2 for log in seen), 30, "requests before the swap")
        ActiveRegistry(root, url).activate("image", artifacts.image_v2)
        wait_for(lambda: any(v == artifacts.image_v2 for log in seen for _, v in log), 15,
                 "answers from the new version")  # fmt: skip
        count = sum(map(len, seen))
        wait_for(lambda: sum(map(len, seen)) >= count + 6, 30, "requests after the swap")
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert all(status == 200 for log in seen for status, _ in log)
    for log in seen:  # per client: old version, then the new one, never back
        versions = [version for _, version in log]
        switch = versions.index(artifacts.image_v2)
        assert set(versions[:switch]) == {artifacts.image_v1}
        assert set(versions[switch:]) == {artifacts.image_v2}


def test_retired_version_is_closed_after_its_last_request(
    artifacts: Artifacts, tmp_path: Path
) -> None:
    root = copy_index_root(artifacts, tmp_path / "indexes")
    holder = IndexHolder(root, ["image"], None, ServiceMetrics(), poll_interval_s=60)
    holder.start()
    try:
        with holder.acquire("image") as old:
            assert old.version == artifacts.image_v1
            ActiveRegistry(root, None).activate("image", artifacts.image_v2)
            assert holder.refresh() == {"image": artifacts.image_v2}
            assert old.retired
            # Still fully usable by the request that holds it.
            query = np.asarray(old.index.mu[:1], dtype=np.float32)
            rows = old.index.shortlist("w2", query, np.asarray(old.index.logvar[:1]), 3)
            assert rows[0, 0] == 0
        assert not hasattr(old.index, "mu")  # IndexVersion.close() dropped its memory maps
        with holder.acquire("image") as new:
            assert new.version == artifacts.image_v2 and new.index.mu.shape[0] > 0
    finally:
        holder.stop()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[Callable[[], subprocess.Popen]]:
    """Starts (and restarts) a redis-server of this test on a fixed free port."""
    port = free_port()
    processes: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        process = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(port), "--save", "",
             "--appendonly", "no", "--dir", str(tmp_path)],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        processes.append(process)
        client = redis.Redis(port=port)
        wait_for(lambda: _pings(client), 10, "redis-server to start")
        return process

    start.port = port  # type: ignore[attr-defined]
    yield start
    for process in processes:
        process.terminate()
        process.wait(timeout=10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def _metric(http: httpx.Client, line: str) -> bool:
    return line in http.get("/metrics").text.splitlines()


def test_redis_outage_then_recovery(
    artifacts: Artifacts, own_redis: Callable[[], subprocess.Popen], tmp_path: Path
) -> None:
    first = own_redis()
    root = copy_index_root(artifacts, tmp_path / "indexes")
    url = f"redis://127.0.0.1:{own_redis.port}/0"  # type: ignore[attr-defined]
    # The shipped backoff cap, not the tests' short one: recovery must be quick with it.
    settings = make_settings(
        artifacts, index_root=root, redis_url=url, redis_backoff_max_s=DEFAULT_BACKOFF_MAX_S
    )
    request = {"text": "a green star", "k": 3}
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.post("/search/text", json=request).headers["x-cache"] == "miss"
        assert http.post("/search/text", json=request).headers["x-cache"] == "hit"

        first.terminate()
        first.wait(timeout=10)
        for i in range(4):
            started = time.monotonic()
            response = http.post("/search/text", json={**request, "k": 4 + i})
            assert response.status_code == 200 and response.headers["x-cache"] == "miss"
            assert time.monotonic() - started < 3.0
        wait_for(lambda: _metric(http, "probsearch_redis_up 0.0"), 5, "redis_up to read 0")
        # While Redis is down, the ACTIVE pointer file decides the version.
        ActiveRegistry(root, None).activate("image", artifacts.image_v2)
        wait_for(lambda: http.post("/search/text", json=request).json()["index_version"]
                 == artifacts.image_v2, 10, "the pointer-file activation")  # fmt: skip
        time.sleep(2 * DEFAULT_BACKOFF_MAX_S)  # a long outage: every backoff at its cap

        own_redis()  # restarted, empty: the pointer file still names the active version

        def cached() -> bool:
            http.post("/search/text", json=request)
            return http.post("/search/text", json=request).headers["x-cache"] == "hit"

        wait_for(cached, 5, "cache hits after the restart")
        wait_for(lambda: _metric(http, "probsearch_redis_up 1.0"), 5, "redis_up to read 1")
        assert http.post("/search/text", json=request).json()["index_version"] == (
            artifacts.image_v2
        )
        # The activation listener is back too: an event switches the version again.
        ActiveRegistry(root, url).activate("image", artifacts.image_v1)
        wait_for(lambda: http.post("/search/text", json=request).json()["index_version"]
                 == artifacts.image_v1, 5, "the activation event after the restart")  # fmt: skip


def test_redis_up_follows_a_paused_redis(
    artifacts: Artifacts, own_redis: Callable[[], subprocess.Popen], tmp_path: Path
) -> None:
    process = own_redis()
    url = f"redis://127.0.0.1:{own_redis.port}/0"  # type: ignore[attr-defined]
    settings = make_settings(artifacts, redis_url=url, redis_backoff_max_s=DEFAULT_BACKOFF_MAX_S)
    request = {"text": "a blue circle", "k": 2}
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        wait_for(lambda: _metric(http, "probsearch_redis_up 1.0"), 5, "redis_up to read 1")
        process.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: _metric(http, "probsearch_redis_up 0.0"), 5, "redis_up to read 0")
            response = http.post("/search/text", json=request)
            assert response.status_code == 200 and response.headers["x-cache"] == "miss"
            time.sleep(2 * DEFAULT_BACKOFF_MAX_S)
        finally:
            process.send_signal(signal.SIGCONT)
        wait_for(lambda: _metric(http, "probsearch_redis_up 1.0"), 5, "redis_up after resuming")

        def cached() -> bool:
            http.post("/search/text", json=request)
            return http.post("/search/text", json=request).headers["x-cache"] == "hit"

        wait_for(cached, 5, "cache hits after resuming")


def test_a_redis_version_missing_on_disk_falls_back_to_the_pointer_file(
    artifacts: Artifacts, service_redis: RedisExecutor, tmp_path: Path
) -> None:
    root = copy_index_root(artifacts, tmp_path / "indexes")
    url = redis_url_of(service_redis, 2)
    client = redis.Redis.from_url(url)
    client.flushdb()
    missing = ActiveRecord("20000101T000000000Z-notondisk", 99)  # newer than the file's
    client.set(active_key(namespace_of(root), "text"), missing.to_text())
    with ServerThread(make_settings(artifacts, index_root=root, redis_url=url)) as server:
        assert server.services.holder.versions() == {
            "image": artifacts.image_v1,
            "text": artifacts.text_v1,
        }
        assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200


def test_activations_while_redis_is_paused_never_go_back(
    artifacts: Artifacts, own_redis: Callable[[], subprocess.Popen], tmp_path: Path
) -> None:
    """Issue 41's silent rollback, as it broke: Redis paused (SIGSTOP), a version activated,
    Redis resumed, ten times under load. The activation says Redis did not take it; no answer
    started after the new version was first served comes from the old one; at the end the
    server, /readyz, Redis and the ACTIVE file all name the last activation."""
    process = own_redis()
    url = f"redis://127.0.0.1:{own_redis.port}/0"  # type: ignore[attr-defined]
    root = copy_index_root(artifacts, tmp_path / "indexes")
    settings = make_settings(artifacts, index_root=root, redis_url=url, poll_interval_s=0.5)
    answers: list[tuple[float, float, int, str | None]] = []  # (sent, received, status, version)
    stop = threading.Event()

    def client_loop(http: httpx.Client) -> None:
        for i in range(100_000):
            if stop.is_set():
                return
            sent = time.monotonic()
            response = http.post("/search/text", json={"text": f"a red circle {i % 5}", "k": 3})
            version = response.json().get("index_version")
            answers.append((sent, time.monotonic(), response.status_code, version))

    registry = ActiveRegistry(root, url, socket_timeout_s=0.3)
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        threads = [threading.Thread(target=client_loop, args=(http,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: len(answers) >= 4, 30, "answers before the first activation")
            windows = []
            for turn in range(10):
                target = artifacts.image_v2 if turn % 2 == 0 else artifacts.image_v1
                before = len(answers)
                process.send_signal(signal.SIGSTOP)
                try:
                    with pytest.raises(RedisUnreachableError, match="did not take it"):
                        registry.activate("image", target)
                finally:
                    process.send_signal(signal.SIGCONT)
                wait_for(lambda t=target: answers[-1][3] == t, 10, f"{target} served")
                seen = min(r for _, r, _, v in answers[before:] if v == target)
                time.sleep(1.5)  # the bug brought the old version back within 1 s
                windows.append((seen, time.monotonic(), target))
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
        ready = http.get("/readyz").json()
        served = server.services.holder.versions()["image"]
    assert all(status == 200 for _, _, status, _ in answers)
    for seen, end, target in windows:
        late = {v for sent, _, _, v in answers if seen < sent < end}
        assert late == {target}, f"after {target} was served, answers came from {late}"
    last = ActiveRecord(artifacts.image_v1, registry.active_record("image").generation)
    assert last.generation >= 10
    assert served == last.version
    assert ready["active"]["image"]["file"] == ready["active"]["image"]["redis"]
    assert ready["active"]["image"]["disagreement"] is None
    stored = redis.Redis.from_url(url).get(active_key(namespace_of(root), "image"))
    assert parse_record(stored) == last == parse_record((root / "image" / "ACTIVE").read_text())
