"""A server with two worker processes: the kernel spreads new connections over both (a socket
each, SO_REUSEPORT), and every scrape of /metrics counts what both answered, from a directory
the serve command makes for them and removes when they stop."""

import contextlib
import http.client
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.mmap_dict import MmapedDict

from tests.service.conftest import PROBSEARCH, Artifacts, wait_for
from tests.service.test_resilience import free_port

REQUESTS = 64
TEXT_200 = {"endpoint": "/search/text", "status": "200"}
STARTED = "Application startup complete."  # a worker's log line just before it listens
COUNTED = re.compile(
    r'^probsearch_requests_total\{endpoint="/search/text",status="200"\} (\S+)$', re.M
)


def metrics_directories() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("probsearch-metrics-*"))


@contextlib.contextmanager
def two_workers(artifacts: Artifacts, log: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """`probsearch serve --workers 2` on a free port, without Redis, in a process group of its
    own (as a terminal starts it); yields its URL and the serve process."""
    port = free_port()
    env = {**os.environ, "PROBSEARCH_INDEX_ROOT": str(artifacts.index_root),
           "PROBSEARCH_MODEL": str(artifacts.model), "PROBSEARCH_DEVICE": "cpu"}  # fmt: skip
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.pop("PROBSEARCH_REDIS_URL", None)
    command = [str(PROBSEARCH), "serve", "--workers", "2", "--port", str(port)]
    with log.open("w") as out:
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: _ready(url, process, log), 120, "two workers to start")
            wait_for(lambda: log.read_text().count(STARTED) == 2, 60, "both workers to listen")
            yield url, process
        finally:
            process.terminate()
            process.wait(timeout=30)


def searches_per_worker(folder: Path) -> list[float]:
    """The /search/text 200s each worker process counted, read from its own counter file."""
    counts = []
    for path in sorted(folder.glob("counter_*.db")):
        total = 0.0
        for key, value, *_ in MmapedDict.read_all_values_from_file(str(path)):
            _, sample, labels, _ = json.loads(key)
            if sample == "probsearch_requests_total" and labels == TEXT_200:
                total += value
        counts.append(total)
    return counts


def _ready(url: str, process: subprocess.Popen, log: Path) -> bool:
    if process.poll() is not None:
        pytest.fail(f"serve --workers 2 exited {process.returncode}:\n{log.read_text()[-3000:]}")
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _burst_of_keep_alive_clients(url: str, clients: int) -> set[int]:
    """`clients` connections opened at once, as a load test's clients are, then one search
    on each; the statuses."""
    host, port = url.removeprefix("http://").split(":")
    connections = [http.client.HTTPConnection(host, int(port), timeout=30) for _ in range(clients)]
    for connection in connections:
        connection.connect()
    statuses = set()
    body = json.dumps({"text": "a red circle", "k": 3})
    for connection in connections:
        connection.request("POST", "/search/text", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        statuses.add(response.status)
        connection.close()
    return statuses


def test_a_burst_of_clients_reaches_both_workers_and_every_scrape_sums_them(
    artifacts: Artifacts, tmp_path: Path
) -> None:
    before = metrics_directories()
    with two_workers(artifacts, tmp_path / "serve.log") as (url, _):
        (folder,) = metrics_directories() - before
        assert _burst_of_keep_alive_clients(url, REQUESTS) == {200}
        wait_for(lambda: sum(searches_per_worker(folder)) == REQUESTS, 10, "the workers' counts")
        # 64 connections hashed over two sockets: fewer than 16 on one has odds of about 1e-4
        per_worker = searches_per_worker(folder)
        assert len(per_worker) == 2 and min(per_worker) >= REQUESTS / 4, per_worker
        for _ in range(6):  # a scrape on a connection of its own reaches either worker
            with httpx.Client(base_url=url, timeout=10) as fresh:
                body = fresh.get("/metrics").text
            assert [float(v) for v in COUNTED.findall(body)] == [REQUESTS], body[-2000:]
            assert re.search(r"^probsearch_onnx_provider\{.*\} 1\.0$", body, re.M), body
    assert metrics_directories() - before == set()
