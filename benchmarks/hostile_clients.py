"""Issue 41's hostile clients against a real server (`probsearch serve` with a 1,024
file-descriptor limit, the clip-art demo's indexes), each next to a well-behaved client that
keeps one keep-alive connection and sends captions:

1. 2,000 connections that never send a request and 50 that send their headers one line every
   2 s: the well-behaved client's latency while they are open, and how long each took to be
   closed by the server (the header deadline is keep_alive_timeout_s; past the connection cap a
   connection gets 503 and is closed at once).
2. 16 clients sending 5 MB JSON bodies over and over: the well-behaved client's median latency
   against its own unloaded median, and how long each oversized body took to be refused: at
   the client (from its headers sent to the answer read, the client's own share of the CPUs
   included) and in the server (from the ASGI app being called to the 413 sent, timed by a
   wrapper around the app that only this scenario's server has; the 413 is answered outside
   RequestMetricsMiddleware, so /metrics does not see it).
3. 100 clients that hang up in the middle of a body: the server's 5xx count before and after.

    python benchmarks/hostile_clients.py                  # builds or reuses .cache/demo
    python benchmarks/hostile_clients.py --scenarios bodies   # rerun one, keep the others' text
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import selectors
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchmarks.service_bench_setup as setup
from benchmarks.service_bench_setup import demo_artifacts, provenance, server

ROOT = Path(__file__).resolve().parents[1]
FD_LIMIT = 1024
IDLE, SLOWLORIS, BODIES, BODY_MB, DISCONNECTS = 2000, 50, 16, 5, 100
QUERY = {"text": "a drawing of a penguin", "k": 10}


def latencies(http: httpx.Client, seconds: float) -> tuple[list[float], int]:
    """Send the caption for `seconds`; the latency of each answer and how many failed."""
    times, failures = [], 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        start = time.perf_counter()
        try:
            ok = http.post("/search/text", json=QUERY).status_code == 200
        except httpx.HTTPError:
            ok = False
        times.append(time.perf_counter() - start)
        failures += not ok
    return times, failures


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def open_idle(address: tuple[str, int], count: int) -> list[tuple[socket.socket, float]]:
    """`count` connections that send nothing, with the time each was opened."""
    opened = []
    for _ in range(count):
        sock = socket.create_connection(address, timeout=5)
        opened.append((sock, time.monotonic()))
    return opened


def slowloris(
    address: tuple[str, int], count: int, stop: threading.Event
) -> list[tuple[socket.socket, float]]:
    """`count` connections that send a request line, then a header line every 2 s."""
    opened = open_idle(address, count)
    socks = [sock for sock, _ in opened]
    for sock in socks:
        sock.sendall(b"POST /search/text HTTP/1.1\r\nHost: x\r\n")

    def drip() -> None:
        n = 0
        while not stop.wait(2.0):
            n += 1
            for sock in socks:
                with contextlib.suppress(OSError):
                    sock.sendall(f"X-Drip-{n}: {n}\r\n".encode())

    threading.Thread(target=drip, daemon=True).start()
    return opened


def closed_after(opened: list[tuple[socket.socket, float]], wait_s: float) -> list[float]:
    """Seconds from opening to the server closing each connection (EOF or reset); a connection
    still open after `wait_s` counts as inf."""
    selector = selectors.DefaultSelector()
    for sock, started in opened:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, started)
    result: list[float] = []
    deadline = time.monotonic() + wait_s
    while selector.get_map() and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=0.2):
            sock = key.fileobj
            try:
                data = sock.recv(4096)  # type: ignore[union-attr]
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data or b"503" in data[:20]:
                result.append(time.monotonic() - key.data)
                selector.unregister(sock)
                sock.close()  # type: ignore[union-attr]
    for key in list(selector.get_map().values()):
        result.append(float("inf"))
        key.fileobj.close()  # type: ignore[union-attr]
    return result


def connections_scenario(url: str, http: httpx.Client) -> dict:
    address = (urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 80)
    stop = threading.Event()
    drips = slowloris(address, SLOWLORIS, stop)
    idle = open_idle(address, IDLE)
    closed: list[float] = []
    watcher = threading.Thread(target=lambda: closed.extend(closed_after(drips + idle, 30.0)))
    watcher.start()  # sees each close as it happens, while the client searches
    during, failures = latencies(http, 10.0)
    watcher.join()
    stop.set()
    late = [t for t in closed if t > 30.0]
    return {
        "during_p50_ms": 1000 * statistics.median(during),
        "during_p99_ms": 1000 * quantile(during, 0.99),
        "requests": len(during),
        "failures": failures,
        "closed_max_s": max(t for t in closed if t != float("inf")),
        "closed_p50_s": statistics.median(closed),
        "closed_p95_s": quantile(closed, 0.95),
        "closed_within_deadline": sum(t <= 5.0 + 0.5 for t in closed),
        "still_open_after_30s": len(late),
    }


BODY = b"[" + b"0.0," * (BODY_MB * 2**20 // 4) + b"0]"

# `probsearch serve` with its app wrapped, outermost, by a timer of the 413s of
# /search/embedding: from uvicorn calling the app to the answer's last part handed to the
# transport (the service's own middleware answers the 413 outside RequestMetricsMiddleware,
# so /metrics never sees it); and a task on the server's event loop that sleeps 5 ms over
# and over and notes how late it wakes (the loop's lag: how long a task that is ready, such
# as a new request's, waits for the loop). GET REFUSALS_PATH answers both so far and clears
# them. The timer costs two clock reads and a list append per request; the service code is
# unchanged.
REFUSALS_PATH = "/bench/refusals"
TIMED_SERVE = f"""
import asyncio, json, sys, time
import service.http.main as http_main
from probsearch.cli import main

create_app, took, lags, probe = http_main.create_app, [], [], []

async def lag_probe():
    while True:
        started = time.perf_counter()
        await asyncio.sleep(0.005)
        lags.append(time.perf_counter() - started - 0.005)

def timed_app(settings=None):
    app = create_app(settings)

    async def timed(scope, receive, send):
        if scope["type"] == "http" and not probe:
            probe.append(asyncio.get_running_loop().create_task(lag_probe()))
        if scope["type"] == "http" and scope["path"] == {REFUSALS_PATH!r}:
            body = json.dumps({{"refusals": took, "loop_lags": lags}}).encode()
            took.clear()
            lags.clear()
            await send({{"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]}})
            await send({{"type": "http.response.body", "body": body}})
            return
        if scope["type"] != "http" or scope["path"] != "/search/embedding":
            await app(scope, receive, send)
            return
        started, status = time.perf_counter(), 0

        async def timed_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if status == 413 and message["type"] == "http.response.body" and not message.get(
                "more_body"
            ):
                took.append(time.perf_counter() - started)

        await app(scope, receive, timed_send)

    return timed

http_main.create_app = timed_app
sys.argv[0] = "probsearch"
main()
"""


def server_timings(http: httpx.Client) -> dict[str, list[float]]:
    """The server's 413 times and event-loop lags (s) since the last call (TIMED_SERVE)."""
    return http.get(REFUSALS_PATH).json()


def refuse_once(address: tuple[str, int]) -> float | None:
    """Seconds from sending a 5 MB body's headers (and its first 64 KiB) to the 413; None if
    the answer was something else."""
    headers = (
        f"POST /search/embedding HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(headers)
        started = time.perf_counter()
        try:
            sock.sendall(BODY[: 64 * 1024])
            answer = sock.recv(64)
        except OSError:
            answer = b""
    return time.perf_counter() - started if answer.startswith(b"HTTP/1.1 413") else None


def oversized(address: tuple[str, int], refusals: list[float], stop: threading.Event) -> None:
    while not stop.is_set():
        took = refuse_once(address)
        if took is not None:
            refusals.append(took)


def bodies_scenario(url: str, http: httpx.Client) -> dict:
    address = (urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 80)
    alone, _ = latencies(http, 8.0)
    server_timings(http)  # clears any from before
    single = [t for t in (refuse_once(address) for _ in range(50)) if t is not None]
    server_single = server_timings(http)
    refusals: list[float] = []
    stop = threading.Event()
    senders = [
        threading.Thread(target=oversized, args=(address, refusals, stop), daemon=True)
        for _ in range(BODIES)
    ]
    for sender in senders:
        sender.start()
    loaded, failures = latencies(http, 10.0)
    stop.set()
    for sender in senders:
        sender.join(timeout=30)
    server_loaded = server_timings(http)
    return {
        "alone_p50_ms": 1000 * statistics.median(alone),
        "loaded_p50_ms": 1000 * statistics.median(loaded),
        "ratio": statistics.median(loaded) / statistics.median(alone),
        "failures": failures,
        "refused": len(refusals),
        "alone_refusal_p50_ms": 1000 * statistics.median(single),
        "alone_refusal_max_ms": 1000 * max(single),
        "refusal_p50_ms": 1000 * statistics.median(refusals) if refusals else float("nan"),
        "refusal_max_ms": 1000 * max(refusals) if refusals else float("nan"),
        "client_alone": summary_ms(single),
        "client_loaded": summary_ms(refusals),
        "server_alone": summary_ms(server_single["refusals"]),
        "server_loaded": summary_ms(server_loaded["refusals"]),
        "lag_alone": summary_ms(server_single["loop_lags"]),
        "lag_loaded": summary_ms(server_loaded["loop_lags"]),
    }


def summary_ms(seconds: list[float]) -> dict:
    """Count, p50, p99 and max in ms, and how many were under 10 ms."""
    if not seconds:
        return {
            "n": 0,
            "p50": float("nan"),
            "p99": float("nan"),
            "max": float("nan"),
            "under_10": 0,
        }
    return {
        "n": len(seconds),
        "p50": 1000 * statistics.median(seconds),
        "p99": 1000 * quantile(seconds, 0.99),
        "max": 1000 * max(seconds),
        "under_10": sum(t < 0.010 for t in seconds),
    }


def five_xx(http: httpx.Client) -> float:
    text = http.get("/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("probsearch_requests_total{") and 'status="5' in line
    )


def disconnects_scenario(url: str, http: httpx.Client) -> dict:
    address = (urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 80)
    before = five_xx(http)
    body = json.dumps({"text": "a red apple " * 100, "k": 3}).encode()
    for _ in range(DISCONNECTS):
        with socket.create_connection(address, timeout=5) as sock:
            sock.sendall(
                b"POST /search/text HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body[: len(body) // 2]
            )
    time.sleep(2.0)
    return {"disconnects": DISCONNECTS, "added_5xx": five_xx(http) - before}


def run(url: str, scenario: Callable[[str, httpx.Client], dict]) -> dict:
    with httpx.Client(base_url=url, timeout=30) as http:
        http.post("/search/text", json=QUERY)  # the keep-alive connection, opened first
        return scenario(url, http)


SCENARIOS = {
    "connections": connections_scenario,
    "bodies": bodies_scenario,
    "disconnects": disconnects_scenario,
}


def connections_section(c: dict) -> list[str]:
    return [
        f"## {IDLE} idle connections and {SLOWLORIS} slowloris connections",
        "",
        "The well-behaved client's captions while they are open (10 s), then when the server "
        "closed each of the 2,050 connections, counted from when the client opened it (the "
        "server's deadline, 5 s, runs from when it accepts the connection).",
        "",
        "| requests | failed | p50 ms | p99 ms | closed p50 / p95 / max s | closed within 5.5 s "
        "| open after 30 s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| {c['requests']} | {c['failures']} | {c['during_p50_ms']:.1f} | "
        f"{c['during_p99_ms']:.1f} | {c['closed_p50_s']:.1f} / {c['closed_p95_s']:.1f} / "
        f"{c['closed_max_s']:.1f} | {c['closed_within_deadline']} | "
        f"{c['still_open_after_30s']} |",
        "",
    ]


def bodies_section(b: dict) -> list[str]:
    def row(where: str, phase: str, t: dict) -> str:
        share = 100 * t["under_10"] / max(t["n"], 1)
        return (
            f"| {where} | {phase} | {t['n']} | {t['p50']:.2f} | {t['p99']:.2f} | "
            f"{t['max']:.2f} | {t['under_10']} ({share:.1f} %) |"
        )

    def lag_row(phase: str, t: dict) -> str:
        return (
            f"| {phase} | {t['n']} | {t['p50']:.2f} | {t['p99']:.2f} | {t['max']:.2f} | "
            f"{t['under_10']} |"
        )

    return [
        f"## {BODIES} clients sending {BODY_MB} MB JSON bodies",
        "",
        "Caption latency alone and while the bodies are sent; then the time from a body's "
        "headers to its 413, one body at a time (50) and under the 16 senders.",
        "",
        "| alone p50 ms | loaded p50 ms | ratio | failed | bodies refused | refusal alone "
        "p50 / max ms | refusal loaded p50 / max ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| {b['alone_p50_ms']:.1f} | {b['loaded_p50_ms']:.1f} | {b['ratio']:.2f} | "
        f"{b['failures']} | {b['refused']} | {b['alone_refusal_p50_ms']:.2f} / "
        f"{b['alone_refusal_max_ms']:.2f} | {b['refusal_p50_ms']:.2f} / "
        f"{b['refusal_max_ms']:.2f} |",
        "",
        "The same refusals timed at both ends. At the client: from sending a body's headers "
        "to reading the 413, which includes the client's own threads waiting for a CPU (the "
        "16 senders, the captions and the server share 2 cores). In the server: from uvicorn "
        "calling the ASGI app to the 413's last part handed to the socket, timed by a wrapper "
        "around the app (two clock reads per request; the 413 is answered before "
        "RequestMetricsMiddleware, so /metrics has no figure for it). What lies between the "
        "two is the kernel, uvicorn reading and parsing the headers, the request's task "
        "waiting for the event loop, and the client being scheduled.",
        "",
        "| timed at | senders | 413s | p50 ms | p99 ms | max ms | under 10 ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        row("client", "one at a time", b["client_alone"]),
        row("server", "one at a time", b["server_alone"]),
        row("client", f"{BODIES} senders", b["client_loaded"]),
        row("server", f"{BODIES} senders", b["server_loaded"]),
        "",
        "The server's event loop while the refusals above were timed: how late a task that "
        "sleeps 5 ms over and over woke (a new request waits about as long before uvicorn "
        "reads it or calls the app).",
        "",
        "| senders | wake-ups | p50 ms | p99 ms | max ms | under 10 ms |",
        "| --- | --- | --- | --- | --- | --- |",
        lag_row("one at a time", b["lag_alone"]),
        lag_row(f"{BODIES} senders", b["lag_loaded"]),
        "",
    ]


def disconnects_section(d: dict, log_bytes: int) -> list[str]:
    return [
        f"## {DISCONNECTS} clients hanging up mid-body",
        "",
        f"5xx added to /metrics: {d['added_5xx']:g}. Server log of this scenario: "
        f"{log_bytes} bytes.",
        "",
    ]


def replace_sections(old: str, new: dict[str, list[str]], note: str) -> str:
    """`old` with the sections (from their '## ' heading to the next) whose heading a section
    of `new` has replaced by it, `note` opening each; new sections are appended."""
    parts: list[list[str]] = [[]]
    for line in old.splitlines():
        if line.startswith("## "):
            parts.append([])
        parts[-1].append(line)
    placed = set()
    for part in parts[1:]:
        for name, lines in new.items():
            if part[0] == lines[0]:
                part[:] = [lines[0], "", note, *lines[1:]]
                placed.add(name)
    for name, lines in new.items():
        if name not in placed:
            parts.append([lines[0], "", note, *lines[1:]])
    return "\n".join("\n".join(part).rstrip("\n") + "\n" for part in parts if part) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-dir", type=Path, default=ROOT / ".cache" / "demo")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                        "hostile_clients.md")  # fmt: skip
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS),
                        help="run only these; their sections replace those of --out, the "
                        "others are kept")  # fmt: skip
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 16384), hard))  # this side's sockets
    command = " ".join([".venv/bin/python benchmarks/hostile_clients.py", *sys.argv[1:]])
    artifacts = demo_artifacts(args.demo_dir, quick=False, plan_name="clipart")
    results, log_bytes = {}, 0
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROBSEARCH_")}
        env["PYTHONPATH"] = str(ROOT)
        log = Path(tmp) / "server.log"
        for name in args.scenarios:
            serve = TIMED_SERVE if name == "bodies" else setup.SERVE
            with (
                mock.patch.object(setup, "SERVE", serve),
                server(env, artifacts.model, artifacts.index_root, log, FD_LIMIT) as (url, _),
            ):
                results[name] = run(url, SCENARIOS[name])
                print(name, results[name], flush=True)
            log_bytes = log.stat().st_size
    sections = {
        "connections": lambda: connections_section(results["connections"]),
        "bodies": lambda: bodies_section(results["bodies"]),
        "disconnects": lambda: disconnects_section(results["disconnects"], log_bytes),
    }
    new = {name: sections[name]() for name in args.scenarios}
    if set(args.scenarios) != set(SCENARIOS) and args.out.exists():
        text = replace_sections(args.out.read_text(), new, f"Rerun alone: {provenance(command)}")
    else:
        lines = [
            "# Hostile clients against a server with a 1,024 file-descriptor limit",
            "",
            f"{provenance(command)} "
            f"The clip-art demo's model and indexes, `probsearch serve` "
            "with its defaults (keep_alive_timeout_s 5, connection cap = fd limit - 256 = 768, "
            "max_json_bytes 512 KiB), a fresh server per scenario. The well-behaved client keeps "
            f"one keep-alive connection and sends `{json.dumps(QUERY)}` back to back.",
            "",
            *(line for name in args.scenarios for line in new[name]),
        ]
        text = "\n".join(lines)
    args.out.write_text(text)
    print(args.out.read_text())


if __name__ == "__main__":
    main()
