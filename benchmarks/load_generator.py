"""Bounded HTTP load generators (closed loop and offered rate) and their latency summary.

Used by benchmarks/service_bench.py. A request is made by a `RequestMaker`: i -> (method,
path, body bytes or None, headers), and sent by a `Sender`. Two senders: `RawHttpClient`, a
minimal HTTP/1.1 keep-alive client on asyncio streams (the default), and httpx.AsyncClient.
httpx's async client is the bottleneck at high concurrency (encode/httpx#3215): on the 2-core
development machine, against a bare ASGI app under uvicorn it made 534 / 262 / 51 requests/s
at concurrency 1 / 16 / 64 where the raw client made 1554 / 4230 / 6261, so a benchmark
driven by it measures the client, not the server.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
import numpy as np

Request = tuple[str, str, bytes | None, dict[str, str]]
RequestMaker = Callable[[int], Request]
# -> (HTTP status, X-Cache header); status 0: no answer (connection failed or timed out)
Sender = Callable[[Request], Awaitable[tuple[int, str | None]]]


def timed_caption(caption: str, *key: object) -> str:
    """`caption` made unique by a tag of one fixed shape, "q" and 8 hex digits of a hash of
    `key`. Every caption the benchmarks time takes this form, in the service's cells and in
    the raw parts alike, so that both encode captions of the same length on average: with tags
    of different shapes ("raw17" against "a1b2c3d4default0o1x17") the service's captions were
    19.4 MiniLM tokens long and the raw parts' 11.4, and the overhead ratio charged the service
    for encoding longer captions."""
    tag = hashlib.blake2b(repr(key).encode(), digest_size=4).hexdigest()
    return f"{caption} q{tag}"


@dataclass(frozen=True)
class Record:
    """One request: when it was due (open loop) or sent (closed loop), when it ended."""

    start: float  # time.perf_counter()
    end: float
    status: int  # HTTP status; 0: no answer
    cache: str | None  # the X-Cache header: "hit", "miss" or None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass(frozen=True)
class Summary:
    """Latency percentiles (ms) and throughput of the requests inside a measurement window."""

    count: int  # requests started inside the window (their latencies are the percentiles)
    errors: int  # of those, answered with a non-2xx status or failed
    error_statuses: dict[int, int]  # status (0: no answer) -> how many of the errors
    p50: float
    p95: float
    p99: float
    mean: float
    qps: float  # successful completions inside the window per second
    hit_fraction: float  # of the successful started requests, answered from the cache


def summarise(records: list[Record], window_start: float, window_end: float) -> Summary:
    """Percentiles over the requests started in [window_start, window_end) (warm-up before it
    is left out); QPS counts the successful ones that completed in the window."""
    inside = [r for r in records if window_start <= r.start < window_end]
    latencies = np.array([1000 * (r.end - r.start) for r in inside if r.ok], dtype=np.float64)
    done = sum(1 for r in records if r.ok and window_start <= r.end < window_end)
    ok = [r for r in inside if r.ok]
    hits = sum(1 for r in ok if r.cache == "hit")

    def pct(q: float) -> float:
        return float(np.percentile(latencies, q)) if len(latencies) else math.nan

    return Summary(
        count=len(inside),
        errors=len(inside) - len(ok),
        error_statuses=dict(Counter(r.status for r in inside if not r.ok)),
        p50=pct(50),
        p95=pct(95),
        p99=pct(99),
        mean=float(latencies.mean()) if len(latencies) else math.nan,
        qps=done / (window_end - window_start),
        hit_fraction=hits / len(ok) if ok else math.nan,
    )


class RawHttpClient:
    """HTTP/1.1 with keep-alive on asyncio streams, at most `max_connections` open (a request
    beyond them waits for one, and the wait counts in its latency). Bodies are read by
    Content-Length or chunked; nothing else of HTTP is needed here."""

    def __init__(self, host: str, port: int, max_connections: int, timeout_s: float = 60.0):
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._slots = asyncio.Semaphore(max_connections)

    async def send(self, request: Request) -> tuple[int, str | None]:
        method, path, body, headers = request
        head = [f"{method} {path} HTTP/1.1", f"host: {self.host}:{self.port}"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None:
            head.append(f"content-length: {len(body)}")
        data = ("\r\n".join(head) + "\r\n\r\n").encode() + (body or b"")
        async with self._slots:
            for attempt in (0, 1):  # an idle connection the server closed: once more, fresh
                reused, conn = bool(self._idle), None
                try:
                    conn = self._idle.pop() if reused else await self._connect()
                    status, response_headers = await asyncio.wait_for(
                        self._exchange(conn, data), self.timeout_s
                    )
                except (OSError, asyncio.IncompleteReadError, ValueError):  # TimeoutError too
                    if conn is not None:
                        conn[1].close()
                    if reused and attempt == 0:
                        continue
                    return 0, None
                if response_headers.get("connection", "").lower() == "close":
                    conn[1].close()
                else:
                    self._idle.append(conn)
                return status, response_headers.get("x-cache")
        return 0, None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port, limit=1 << 22)

    @staticmethod
    async def _exchange(conn, data: bytes) -> tuple[int, dict[str, str]]:
        reader, writer = conn
        writer.write(data)
        await writer.drain()
        lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                await reader.readexactly(size + 2)
            await reader.readuntil(b"\r\n")
        return status, headers

    async def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


def httpx_sender(client: httpx.AsyncClient) -> Sender:
    """A Sender on an httpx.AsyncClient (slow at high concurrency; see the module doc)."""

    async def send(request: Request) -> tuple[int, str | None]:
        method, path, body, headers = request
        try:
            response = await client.request(method, path, content=body, headers=headers)
        except httpx.HTTPError:
            return 0, None
        return response.status_code, response.headers.get("x-cache")

    return send


async def closed_loop(
    send: Sender,
    make: RequestMaker,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    min_measured: int = 0,
    max_extra_s: float = 30.0,
) -> tuple[list[Record], float, float]:
    """`concurrency` workers, each sending its next request when the last one is answered,
    for warmup_s + duration_s, extended (by at most max_extra_s) until at least min_measured
    requests were started after the warm-up (a slow server at high concurrency would
    otherwise start none). Returns (records, window start, window end)."""
    records: list[Record] = []
    counter = itertools.count()
    begin = time.perf_counter()
    window_start, stop = begin + warmup_s, begin + warmup_s + duration_s
    measured, closing = 0, math.inf

    async def worker() -> None:
        nonlocal measured, closing
        for i in counter:
            request = make(i)
            start = time.perf_counter()
            if start >= closing:
                return
            if start >= stop and (measured >= min_measured or start >= stop + max_extra_s):
                closing = min(closing, start)
                return
            measured += start >= window_start
            status, cache = await send(request)
            records.append(Record(start, time.perf_counter(), status, cache))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records, window_start, min(closing, time.perf_counter())


def arrival_offsets(rate: float, total_s: float, seed: int) -> np.ndarray:
    """Poisson arrival times (s from the start) at `rate` per second within total_s."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, int(rate * total_s * 1.5) + 16)
    offsets = np.cumsum(gaps)
    return offsets[offsets < total_s]


async def open_loop(
    send: Sender,
    make: RequestMaker,
    rate: float,
    warmup_s: float,
    duration_s: float,
    max_in_flight: int = 1024,
    seed: int = 0,
) -> tuple[list[Record], float, float]:
    """Requests due at Poisson arrival times of `rate` per second, sent whether or not the
    earlier ones were answered. Latency counts from when a request was due (so a server that
    falls behind is charged for the queue, no coordinated omission); a request due while
    max_in_flight are outstanding is recorded as failed. Returns (records, window)."""
    records: list[Record] = []
    begin = time.perf_counter()
    in_flight: set[asyncio.Task] = set()

    async def one(due: float, request: Request) -> None:
        status, cache = await send(request)
        records.append(Record(due, time.perf_counter(), status, cache))

    for i, offset in enumerate(arrival_offsets(rate, warmup_s + duration_s, seed)):
        request = make(i)
        due = begin + float(offset)
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(in_flight) >= max_in_flight:
            records.append(Record(due, due, 0, None))
            continue
        task = asyncio.create_task(one(due, request))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    if in_flight:
        await asyncio.gather(*in_flight)
    return records, begin + warmup_s, begin + warmup_s + duration_s
