"""`probsearch serve --workers N`: a listening socket per process on one port, which the kernel
spreads new connections over (SO_REUSEPORT), and a parent that replaces a worker that dies."""

import os
import re
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from service.worker_processes import RestartBudget, check_port_free, reuse_port_socket
from tests.service.conftest import Artifacts, wait_for
from tests.service.test_metrics_workers import STARTED, two_workers
from tests.service.test_resilience import free_port

CONNECTIONS = 32


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_restart_budget_counts_deaths_in_a_sliding_window() -> None:
    clock = FakeClock()
    budget = RestartBudget(limit=3, window_s=60.0, clock=clock)
    assert [budget.allows_another() for _ in range(3)] == [True, True, True]
    assert not budget.allows_another()  # a fourth within the minute: a crash loop
    clock.now += 60.0  # every earlier death is a minute old: out of the window
    assert budget.allows_another() and budget.allows_another()
    clock.now += 59.0  # the last two are still inside it, and a third joins them
    assert budget.allows_another()
    assert not budget.allows_another()
    spaced = RestartBudget(limit=3, window_s=60.0, clock=clock)
    for _ in range(20):  # a death every 30 s is never more than 2 a minute
        clock.now += 30.0
        assert spaced.allows_another()


def test_two_processes_sockets_share_the_port_and_both_get_connections() -> None:
    port = free_port()
    sockets = [reuse_port_socket("127.0.0.1", port) for _ in range(2)]
    clients = []
    try:
        for sock in sockets:
            sock.listen(CONNECTIONS)
            sock.setblocking(False)
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(CONNECTIONS)]
        accepted = [0, 0]
        deadline = time.monotonic() + 5
        while sum(accepted) < CONNECTIONS and time.monotonic() < deadline:
            for i, sock in enumerate(sockets):
                try:
                    sock.accept()[0].close()
                    accepted[i] += 1
                except BlockingIOError:
                    pass
        # 32 connections hashed over two sockets: all on one has odds of 2 ** -31
        assert sum(accepted) == CONNECTIONS and min(accepted) > 0, accepted
    finally:
        for sock in [*sockets, *clients]:
            sock.close()


def test_a_port_held_by_a_running_servers_workers_fails_the_check() -> None:
    port = free_port()
    worker = reuse_port_socket("127.0.0.1", port)
    try:
        worker.listen()
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            check_port_free("127.0.0.1", port)
    finally:
        worker.close()
    check_port_free("127.0.0.1", port)  # free again once the worker has gone


def test_a_port_held_without_sharing_is_refused() -> None:
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        with pytest.raises(OSError):
            reuse_port_socket("127.0.0.1", port)


def started_workers(log: Path) -> list[int]:
    return [int(pid) for pid in re.findall(r"Started server process \[(\d+)\]", log.read_text())]


def test_a_worker_that_dies_is_replaced(artifacts: Artifacts, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with two_workers(artifacts, log) as (url, _):
        killed = started_workers(log)[0]
        folder = metrics_folder(killed)
        live = sorted(folder.glob(f"gauge_live*_{killed}.db"))
        assert live, "the worker keeps live gauges (its active version)"
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: log.read_text().count(STARTED) == 3, 120, "a third worker to start")
        assert not any(path.exists() for path in live), "a dead worker's gauges stay live"
        for n in range(8):  # each on a connection of its own, so either worker may answer
            with httpx.Client(base_url=url, timeout=30) as fresh:
                search = fresh.post("/search/text", json={"text": f"a red circle {n}", "k": 1})
            assert search.status_code == 200, search.text
    assert len(started_workers(log)) == 3
    assert "exited with -9; starting another" in log.read_text()


def metrics_folder(pid: int) -> Path:
    """The PROMETHEUS_MULTIPROC_DIR that `serve` made and handed to worker `pid`."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    value = next(v for v in environ if v.startswith(b"PROMETHEUS_MULTIPROC_DIR="))
    return Path(value.split(b"=", 1)[1].decode())


def test_ctrl_c_stops_every_worker_quietly(artifacts: Artifacts, tmp_path: Path) -> None:
    """A terminal's Ctrl-C sends SIGINT to the whole process group, so it may reach the
    workers before the parent: here it reaches the workers alone, and the server stops."""
    log = tmp_path / "serve.log"
    with two_workers(artifacts, log) as (_, process):
        for pid in started_workers(log):
            os.kill(pid, signal.SIGINT)
        assert process.wait(timeout=60) == 0
    text = log.read_text()
    assert text.count("Finished server process") == 2
    assert "Traceback" not in text and "starting another" not in text, text[-3000:]
