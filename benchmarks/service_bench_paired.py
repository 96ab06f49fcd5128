"""The overhead ratio measured in pairs: one no-op request, one text search through the server,
then the raw parts of a text query (and the whole searcher) in a process of their own, in turn,
query after query.

On this shared 2-core machine the speed drifts by a third within minutes (text search at one
client: 2.0 to 4.0 ms in one hour on unchanged code), so a service cell and a raw-parts loop
timed a minute apart can differ by the drift alone. Taken in turn, every figure of the ratio
sees the same machine, and each part runs after the others' activity as it does inside the
server, not in a hot loop of its own.
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


@dataclass(frozen=True)
class Paired:
    """p50s (ms) of the requests and parts taken in turn, and how many turns."""

    count: int
    service_p50: float  # POST /search/text, 16 draws, a caption never sent before
    noop_p50: float  # GET /healthz
    raw_p50: float  # the raw parts of a text query (service_bench_parts)
    searcher_p50: float  # Searcher.search_batch of that caption, in the same process

    @property
    def ratio(self) -> float:
        return self.service_p50 / (self.raw_p50 + self.noop_p50)


@contextmanager
def parts_process(
    env: dict[str, str], spec: dict
) -> Iterator[Callable[[int], tuple[float, float]]]:
    """A process that times query i's raw parts and whole searcher when asked (its
    environment: the server's); yields the function that asks it."""
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

    def ask(i: int) -> tuple[float, float]:
        process.stdin.write(f"{i}\n")
        process.stdin.flush()
        raw, whole = answer().split()
        return float(raw), float(whole)

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
    """Text search, no-op and the raw parts in turn for warmup_s + duration_s (p50s over the
    turns after the warm-up)."""
    with parts_process(env, spec) as parts:
        return asyncio.run(_turns(url, parts, spec["captions"], warmup_s, duration_s, nonce))


async def _turns(url, parts, captions: list[str], warmup_s, duration_s, nonce) -> Paired:
    address = urlsplit(url)
    client = RawHttpClient(address.hostname or "127.0.0.1", address.port or 80, 1)
    measured: list[tuple[float, float, float, float]] = []
    begin = time.perf_counter()
    i = 0
    try:
        while (elapsed := time.perf_counter() - begin) < warmup_s + duration_s:
            # The no-op goes first: the search's cache write, done after its answer, would
            # otherwise be charged to the no-op.
            noop = await _timed(client, ("GET", "/healthz", None, {}))
            body = {"text": f"{captions[i % len(captions)]} {nonce}p{i}", "k": 10,
                    "mc_samples": DRAWS}  # fmt: skip
            text = await _timed(client, ("POST", "/search/text", json.dumps(body).encode(),
                                         {"content-type": "application/json"}))  # fmt: skip
            raw, whole = parts(i)
            if elapsed >= warmup_s:
                measured.append((text, noop, raw, whole))
            i += 1
    finally:
        await client.close()
    p50 = np.median(np.array(measured), axis=0) if measured else [float("nan")] * 4
    return Paired(len(measured), *(float(x) for x in p50))


async def _timed(client: RawHttpClient, request) -> float:
    start = time.perf_counter()
    status, _ = await client.send(request)
    if status != 200:
        raise RuntimeError(f"{request[0]} {request[1]} answered {status} during the paired run")
    return 1000 * (time.perf_counter() - start)
