"""A Milvus outage under concurrent searches is logged once, with a count (issue 41, point 5).

Measured by benchmarks/milvus_outage.py, 30 s at 8 clients: a Milvus that is down (killed)
made pymilvus log a traceback per failed RPC and another per failed reconnect, 21 MB; a Milvus
that hangs (SIGSTOP) let gRPC's DEADLINE_EXCEEDED through as a 500 with uvicorn's traceback per
request, 103 KB. The service reports an outage once (service.outage_log), answers 503 and
/readyz says why, so none of those records may reach the log."""

import contextlib
import logging
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from indexer.milvus_store import MilvusBackend
from tests.service.conftest import (
    Artifacts,
    ServerThread,
    copy_index_root,
    make_settings,
    wait_for,
)
from tests.service.milvus_lite import MilvusLiteServer
from tests.service.test_milvus_backend import reindex_into_milvus

CLIENTS, SEARCHES = 8, 10
QUERY = {"text": "a red circle", "k": 5, "metric": "kl"}


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def captured() -> Iterator[list[logging.LogRecord]]:
    """Warnings and errors of every logger: the root's, and pymilvus's and uvicorn's, which do
    not propagate (each writes to stderr with a handler of its own; uvicorn sets its up when
    a server is made, so this comes after)."""
    handler = Records()
    loggers = [logging.getLogger(name) for name in ("", "pymilvus", "uvicorn")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


@pytest.fixture(scope="module")
def index_root(tmp_path_factory, artifacts: Artifacts, milvus: MilvusLiteServer) -> Path:
    root = copy_index_root(artifacts, tmp_path_factory.mktemp("milvus-outage") / "indexes")
    reindex_into_milvus(artifacts, root, milvus.uri)
    return root


def searches(url: str, count: int = SEARCHES) -> list[int]:
    """Each search's status; 0 when the server closed the connection without one."""
    statuses = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(count):
            try:
                statuses.append(client.post("/search/text", json=QUERY).status_code)
            except httpx.HTTPError:
                statuses.append(0)
    return statuses


def outage(
    artifacts: Artifacts, index_root: Path, milvus: MilvusLiteServer, count: int, hang: bool
) -> tuple[list[int], list[int], list[logging.LogRecord]]:
    """Milvus stopped (or paused, `hang`) while CLIENTS clients send `count` searches each,
    then back; (their statuses, /readyz's during it, the log records from its start)."""
    settings = make_settings(
        artifacts, index_root, galleries=["image"], shortlist_backend="milvus"
    ).model_copy(update={"milvus_uri": milvus.uri})
    with (
        ServerThread(settings) as server,
        captured() as records,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        assert client.post("/search/text", json=QUERY).status_code == 200
        before = len(records)
        assert milvus.process is not None
        pid = milvus.process.pid
        if hang:
            os.kill(pid, signal.SIGSTOP)
        else:
            milvus.stop()
        try:
            with ThreadPoolExecutor(CLIENTS) as pool:
                runs = pool.map(searches, [server.url] * CLIENTS, [count] * CLIENTS)
                statuses = [status for run in runs for status in run]
            ready = [client.get("/readyz").status_code for _ in range(3)]
        finally:
            if hang:
                os.kill(pid, signal.SIGCONT)
            else:
                milvus.start()
        wait_for(
            lambda: client.post("/search/text", json=QUERY).status_code == 200,
            60,
            "a search to succeed after Milvus came back",
        )
        return statuses, ready, records[before:]


def assert_logged_once(records: list[logging.LogRecord]) -> None:
    messages = [f"{r.name}: {r.getMessage()[:200]}" for r in records]
    assert [m for m in messages if m.startswith(("pymilvus", "uvicorn"))] == [], messages
    assert sum(r.exc_info is not None for r in records) == 1, messages  # the outage's first
    assert any("recovered after" in m for m in messages), messages
    assert len(records) <= 4, messages  # failed, recovered, a released collection loaded


def test_a_milvus_outage_is_logged_once_with_a_count(artifacts, index_root, milvus) -> None:
    statuses, ready, records = outage(artifacts, index_root, milvus, SEARCHES, hang=False)
    assert set(statuses) == {503} and ready == [503] * 3
    assert_logged_once(records)


def test_a_hung_milvus_is_503_and_logged_once(artifacts, index_root, milvus, monkeypatch) -> None:
    """SIGSTOP: every call waits for its timeout (2 s here, 10 s by default)."""
    monkeypatch.setattr(
        "indexer.shortlist_backends.MilvusBackend", lambda uri: MilvusBackend(uri, timeout_s=2.0)
    )
    statuses, ready, records = outage(artifacts, index_root, milvus, 1, hang=True)
    assert set(statuses) == {503} and ready == [503] * 3
    assert_logged_once(records)
