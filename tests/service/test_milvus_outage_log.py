"""A Milvus outage under concurrent searches is logged once, with a count (issue 41, point 5).

pymilvus logs every failed call itself, a traceback per failed RPC and another per failed
reconnect: a 30 s outage at 8 clients wrote 21 MB of log (benchmarks/milvus_outage.py). The
service reports the outage once (service.outage_log) and /readyz says why, so none of those
records may reach the log."""

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

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


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Warnings and errors of every logger: the root's and pymilvus's (which does not
    propagate; it writes to stderr with a handler of its own)."""
    handler = Records()
    loggers = [logging.getLogger(), logging.getLogger("pymilvus")]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler.records
    for logger in loggers:
        logger.removeHandler(handler)


@pytest.fixture(scope="module")
def index_root(tmp_path_factory, artifacts: Artifacts, milvus: MilvusLiteServer) -> Path:
    root = copy_index_root(artifacts, tmp_path_factory.mktemp("milvus-outage") / "indexes")
    reindex_into_milvus(artifacts, root, milvus.uri)
    return root


def searches(url: str) -> list[int]:
    with httpx.Client(base_url=url, timeout=30) as client:
        return [client.post("/search/text", json=QUERY).status_code for _ in range(SEARCHES)]


def test_a_milvus_outage_is_logged_once_with_a_count(
    artifacts, index_root, milvus, records
) -> None:
    settings = make_settings(
        artifacts, index_root, galleries=["image"], shortlist_backend="milvus"
    ).model_copy(update={"milvus_uri": milvus.uri})
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.post("/search/text", json=QUERY).status_code == 200
        before = len(records)
        milvus.stop()
        try:
            with ThreadPoolExecutor(CLIENTS) as pool:
                statuses = [s for run in pool.map(searches, [server.url] * CLIENTS) for s in run]
            ready = [client.get("/readyz").status_code for _ in range(3)]
        finally:
            milvus.start()
        wait_for(
            lambda: client.post("/search/text", json=QUERY).status_code == 200,
            60,
            "a search to succeed after Milvus came back",
        )
    assert set(statuses) == {503} and ready == [503] * 3
    outage = records[before:]
    messages = [f"{r.name}: {r.getMessage()[:200]}" for r in outage]
    assert [m for m in messages if m.startswith("pymilvus")] == [], messages
    assert sum(r.exc_info is not None for r in outage) == 1, messages  # the outage's first
    assert any("recovered after" in m for m in messages), messages
    assert len(outage) <= 4, messages  # failed, recovered, a released collection loaded
