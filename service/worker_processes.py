"""Several server processes on one port, each with its own listening socket (SO_REUSEPORT).

uvicorn's own `--workers` binds one socket in the parent and every worker accepts from it.
On 2 cores, 16 keep-alive clients then went nearly all to one process, which the GIL holds to
about 1.5 cores, and a second process gained nothing (benchmarks/results/serve_workers.md).
With a socket per process in one SO_REUSEPORT group, the kernel spreads new connections over
the processes by their addresses instead of by whichever process is waiting in accept().

The parent only supervises: it starts the workers, replaces one that dies, and on SIGINT or
SIGTERM asks each to shut down gracefully (uvicorn's own SIGTERM handling) and waits for it.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType

from models.settings import Settings
from service.metrics import forget_process

log = logging.getLogger("probsearch.workers")

RESTART_LIMIT = 5  # worker deaths within RESTART_WINDOW_S the server replaces, then gives up
RESTART_WINDOW_S = 60.0
STOP_GRACE_S = 30.0  # how long a worker may take to finish its requests on shutdown
CANNOT_LISTEN = 3  # a worker's exit status when its port cannot be bound: not worth a restart
STOPPED = (-signal.SIGINT, -signal.SIGTERM, 0)  # a worker that was told to stop, or did


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port that other processes may bind too (SO_REUSEPORT).

    Bound, not listening: uvicorn listens on it once the app has started, so the kernel sends
    no connection to a worker that is still loading its model.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def check_port_free(host: str, port: int) -> None:
    """Raise OSError when any socket holds host:port. The probe does not share the port, so
    it also fails on a running server's workers, whose sockets would take a second server's
    into their group and split the traffic with it without a word."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        socket.create_server((host, port), family=family).close()
    except OSError as error:
        raise OSError(f"cannot listen on {host}:{port}: {error.strerror}") from None


class RestartBudget:
    """At most `limit` replaced workers in any `window_s` seconds. A worker that keeps dying at
    start-up (a bad model, no memory) stops the server within a minute rather than looping;
    one that dies now and then over weeks is replaced every time."""

    def __init__(
        self,
        limit: int = RESTART_LIMIT,
        window_s: float = RESTART_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit, self.window_s, self.clock = limit, window_s, clock
        self.deaths: deque[float] = deque()

    def allows_another(self) -> bool:
        """Count one more death now; False once more than `limit` fall in the window."""
        now = self.clock()
        self.deaths.append(now)
        while self.deaths[0] <= now - self.window_s:
            self.deaths.popleft()
        return len(self.deaths) <= self.limit


def _worker(settings: Settings, log_level: str) -> None:
    """One server process: its own socket and its own app (model, indexes, thread pools)."""
    import uvicorn

    from service.http.main import create_app
    from service.http.transport import server_options

    try:
        sock = reuse_port_socket(settings.host, settings.port)
    except OSError as error:
        print(f"probsearch serve: cannot listen on {settings.host}:{settings.port}: {error}",
              file=sys.stderr)  # fmt: skip
        sys.exit(CANNOT_LISTEN)
    config = uvicorn.Config(create_app(settings), log_level=log_level, **server_options(settings))
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: uvicorn has shut down, re-raising it
        uvicorn.Server(config).run(sockets=[sock])


def run_workers(settings: Settings, log_level: str) -> int:
    """Serve with settings.workers processes until SIGINT or SIGTERM; returns the exit
    status: 0, or 1 when workers kept dying and the server gave up."""
    context = multiprocessing.get_context("spawn")
    stopping = False

    def start() -> BaseProcess:
        process = context.Process(target=_worker, args=(settings, log_level))
        process.start()
        return process

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    processes = [start() for _ in range(settings.workers)]
    log.info("%d worker processes on %s:%d", settings.workers, settings.host, settings.port)
    budget, gave_up = RestartBudget(), False
    try:
        while not stopping:
            for sentinel in wait([p.sentinel for p in processes], timeout=0.5):
                dead = next(p for p in processes if p.sentinel == sentinel)
                dead.join()
                forget_process(dead.pid)
                if stopping or dead.exitcode in STOPPED:
                    stopping = True  # Ctrl-C reaches the whole process group, workers first
                    break
                if dead.exitcode == CANNOT_LISTEN or not budget.allows_another():
                    log.error("worker %d exited with %s; stopping", dead.pid, dead.exitcode)
                    stopping = gave_up = True
                    break
                log.warning("worker %d exited with %s; starting another", dead.pid, dead.exitcode)
                processes[processes.index(dead)] = start()
    finally:
        _stop_all(processes)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 1 if gave_up else 0


def _stop_all(processes: list[BaseProcess]) -> None:
    """SIGTERM to each live worker (uvicorn finishes its requests and exits), then wait."""
    for process in processes:
        if process.is_alive() and process.pid is not None:
            os.kill(process.pid, signal.SIGTERM)
    for process in processes:
        process.join(STOP_GRACE_S)
        if process.is_alive():
            process.kill()
            process.join()
