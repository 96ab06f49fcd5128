"""/metrics of a server with two worker processes: every scrape counts what both answered,
from a directory the serve command makes for them and removes when they stop."""

import contextlib
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import PROBSEARCH, Artifacts, wait_for
from tests.service.test_resilience import free_port

REQUESTS = 64
COUNTED = re.compile(
    r'^probsearch_requests_total\{endpoint="/search/text",status="200"\} (\S+)$', re.M
)


def metrics_directories() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("probsearch-metrics-*"))


@contextlib.contextmanager
def two_workers(artifacts: Artifacts, log: Path) -> Iterator[str]:
    """`probsearch serve --workers 2` on a free port, without Redis; yields its URL."""
    port = free_port()
    env = {**os.environ, "PROBSEARCH_INDEX_ROOT": str(artifacts.index_root),
           "PROBSEARCH_MODEL": str(artifacts.model), "PROBSEARCH_DEVICE": "cpu"}  # fmt: skip
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.pop("PROBSEARCH_REDIS_URL", None)
    command = [str(PROBSEARCH), "serve", "--workers", "2", "--port", str(port)]
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: _ready(url, process, log), 120, "two workers to start")
            yield url
        finally:
            process.terminate()
            process.wait(timeout=30)


def _ready(url: str, process: subprocess.Popen, log: Path) -> bool:
    if process.poll() is not None:
        pytest.fail(f"serve --workers 2 exited {process.returncode}:\n{log.read_text()[-3000:]}")
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _search(url: str, n: int) -> int:
    with httpx.Client(base_url=url, timeout=30) as fresh:  # a connection of its own
        return fresh.post("/search/text", json={"text": f"a red circle {n}", "k": 3}).status_code


def test_every_scrape_sums_both_workers_and_the_directory_goes_with_them(
    artifacts: Artifacts, tmp_path: Path
) -> None:
    before = metrics_directories()
    with two_workers(artifacts, tmp_path / "serve.log") as url:
        assert len(metrics_directories() - before) == 1
        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(_search, [url] * REQUESTS, range(REQUESTS))) == {200}
        for _ in range(6):  # a scrape on a connection of its own reaches either worker
            with httpx.Client(base_url=url, timeout=10) as fresh:
                body = fresh.get("/metrics").text
            assert [float(v) for v in COUNTED.findall(body)] == [REQUESTS], body[-2000:]
            assert re.search(r"^probsearch_onnx_provider\{.*\} 1\.0$", body, re.M), body
    assert metrics_directories() - before == set()
