"""docs/design.md section 9 lists a text query's path file by file, each calling only files
below it. A real server answers that query under a profiler: the project files it calls must be
exactly those of the table, and no call may go from a file to one listed above it."""

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import Artifacts, ServerThread, make_settings, redis_url_of

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("models", "indexer", "service", "probsearch")
SECTION = re.compile(r"^## 9\. .*?(?=^## 10\.)", re.S | re.M)
ROW = re.compile(r"^\| (\d+) \| `([^`]+)` \|", re.M)


def documented_path() -> list[str]:
    """The files of the section 9 table, in its order."""
    section = SECTION.search((REPO / "docs/design.md").read_text())
    assert section is not None, "docs/design.md has no section 9"
    rows = ROW.findall(section.group(0))
    assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1)), "rows out of order"
    return [path for _, path in rows]


def project_file(filename: str) -> str | None:
    """`filename` relative to the repository when it is a module of the four packages."""
    path = Path(filename)
    if not path.is_absolute() or not path.is_relative_to(REPO):
        return None
    relative = path.relative_to(REPO).as_posix()
    return relative if relative.split("/", 1)[0] in PACKAGES else None


class CallRecorder:
    """(caller file, callee file) of every Python call in the threads started while it is
    installed, while `recording` is set."""

    def __init__(self) -> None:
        self.recording = False
        self.calls: set[tuple[str | None, str]] = set()

    def __call__(self, frame, event: str, arg) -> None:
        if not self.recording or event != "call":
            return
        callee = project_file(frame.f_code.co_filename)
        if callee is not None:
            caller = frame.f_back and project_file(frame.f_back.f_code.co_filename)
            self.calls.add((caller, callee))


@pytest.fixture
def profiled_server(artifacts: Artifacts, service_redis) -> Iterator[tuple[str, CallRecorder]]:
    """A server whose threads report their calls to a CallRecorder, with no background polling
    that could call other files while a query is recorded."""
    recorder = CallRecorder()
    settings = make_settings(
        artifacts,
        redis_url=redis_url_of(service_redis, 6),
        mc_samples=16,
        poll_interval_s=3600,
        redis_health_interval_s=3600,
    )
    threading.setprofile(recorder)
    try:
        with ServerThread(settings) as running:
            threading.setprofile(None)
            yield running.url, recorder
    finally:
        threading.setprofile(None)


def test_a_text_query_calls_the_documented_files_downward_only(profiled_server) -> None:
    url, recorder = profiled_server
    path = documented_path()
    with httpx.Client(base_url=url, timeout=30) as client:
        warm = client.post("/search/text", json={"text": "a big red circle"})
        assert warm.status_code == 200, warm.text
        recorder.recording = True
        answer = client.post("/search/text", json={"text": "a small blue square"})
        time.sleep(0.5)  # the cache store is written behind, within cache_write_delay_ms
        recorder.recording = False
    assert answer.status_code == 200 and answer.headers["X-Cache"] == "miss", answer.text
    called = {callee for _, callee in recorder.calls}
    assert called - set(path) == set(), "called but not in docs/design.md section 9"
    assert set(path) - called == set(), "in docs/design.md section 9 but not called"
    rank = {file: i for i, file in enumerate(path)}
    upward = sorted(
        (caller, callee)
        for caller, callee in recorder.calls
        if caller in rank and caller != callee and rank[callee] < rank[caller]
    )
    assert upward == [], "calls from a file to one listed above it"
