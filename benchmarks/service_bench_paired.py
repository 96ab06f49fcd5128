"""The overhead ratio with its figures taken in turn: no-op requests, one text search through
the server, then the raw parts of a text query (and the whole searcher) in a process of their
own, query after query.

On this shared 2-core machine the speed drifts by a third within minutes (text search at one
client: 2.0 to 4.0 ms in one hour on unchanged code), so a service cell and a raw-parts loop
timed a minute apart differ by the drift as well. Taken in turn, every figure sees the same
machine. Each turn times two no-ops, two
text searches and two raw-parts queries, each pair back to back: the first of each runs after
the other processes' activity (cold), the second right after the first (hot), as in the
separate cells and the raw-parts loop, where each figure repeats on its own. Issue 13's ratio
is checked on the hot figures; the cold ones are reported beside them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
from load_generator import RawHttpClient

ROOT = Path(__file__).resolve().parents[1]
DRAWS = 16
PREFIX = "PARTS "
NOOP = ("GET", "/healthz", None, {})
FIGURES = (
    "service",
    "service_hot",
    "noop",
    "noop_hot",
    "raw",
    "searcher",
    "raw_hot",
    "searcher_hot",
)


@dataclass(frozen=True)
class Paired:
    """p50s (ms) over the turns, and how many turns. service: POST /search/text with 16 draws
    and a caption never sent before; noop: GET /healthz; raw: the raw parts of a text query
    (service_bench_parts); searcher: Searcher.search_batch on that caption; _hot: the second of
    the pair, right after the first."""

    count: int
    service: float
    service_hot: float
    noop: float
    noop_hot: float
    raw: float
    searcher: float
    raw_hot: float
    searcher_hot: float

    @property
    def ratio(self) -> float:
        """service / (raw parts + no-op), all three hot: issue 13's overhead ratio."""
        return self.service_hot / (self.raw_hot + self.noop_hot)

    @property
    def ratio_cold(self) -> float:
        """The same with the first (cold) search, raw parts and no-op of each turn."""
        return self.service / (self.raw + self.noop)


@contextmanager
def parts_process(env: dict[str, str], spec: dict) -> Iterator[Callable[[int], list[float]]]:
    """A process that times query i's raw parts and whole searcher, cold then hot, when asked
    (its environment: the server's); yields the function that asks it."""
    command = [sys.executable, str(ROOT / "benchmarks/service_bench.py"), "--raw-parts-serve",
               json.dumps(spec)]  # fmt: skip
    process = subprocess.Popen(
        command, env=env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdin is not None and process.stdout is not None

    def answer() -> str:
        for line in process.stdout:
            if line.startswith(PREFIX):
                return line[len(PREFIX) :].strip()
        raise RuntimeError(f"the raw-parts process exited ({process.wait()})")

    def ask(i: int) -> list[float]:
        process.stdin.write(f"{i}\n")
        process.stdin.flush()
        return [float(x) for x in answer().split()]

    try:
        if answer() != "READY":
            raise RuntimeError("the raw-parts process did not start")
        yield ask
    finally:
        process.stdin.close()
        process.wait(timeout=60)


def measure_paired(
    url: str, env: dict[str, str], spec: dict, warmup_s: float, duration_s: float, nonce: str
) -> Paired:
    """Turns for warmup_s + duration_s; p50s over the turns after the warm-up."""
    with parts_process(env, spec) as parts:
        return asyncio.run(_turns(url, parts, spec["captions"], warmup_s, duration_s, nonce))


async def _turns(url, parts, captions: list[str], warmup_s, duration_s, nonce) -> Paired:
    address = urlsplit(url)
    client = RawHttpClient(address.hostname or "127.0.0.1", address.port or 80, 1)
    measured: list[list[float]] = []
    begin = time.perf_counter()
    i = 0
    try:
        while (elapsed := time.perf_counter() - begin) < warmup_s + duration_s:
            # No-ops first: the search's cache write, done after its answer, would otherwise
            # be charged to them.
            noop, noop_hot = await _timed(client, NOOP), await _timed(client, NOOP)
            text, text_hot = [await _timed(client, _search(captions, nonce, i, repeat))
                              for repeat in (0, 1)]  # fmt: skip
            raw, searcher, raw_hot, searcher_hot = parts(i)
            if elapsed >= warmup_s:
                measured.append(
                    [text, text_hot, noop, noop_hot, raw, searcher, raw_hot, searcher_hot]
                )
            i += 1
    finally:
        await client.close()
    p50 = np.median(np.array(measured), axis=0) if measured else [float("nan")] * len(FIGURES)
    return Paired(len(measured), *(float(x) for x in p50))


def _search(captions: list[str], nonce: str, i: int, repeat: int) -> tuple:
    """A text search with 16 draws whose caption no other request sends (a cache miss)."""
    body = {"text": f"{captions[i % len(captions)]} {nonce}p{i}r{repeat}", "k": 10,
            "mc_samples": DRAWS}  # fmt: skip
    return "POST", "/search/text", json.dumps(body).encode(), {"content-type": "application/json"}


async def _timed(client: RawHttpClient, request) -> float:
    start = time.perf_counter()
    status, _ = await client.send(request)
    if status != 200:
        raise RuntimeError(f"{request[0]} {request[1]} answered {status} during the paired run")
    return 1000 * (time.perf_counter() - start)
