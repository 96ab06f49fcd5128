"""The overhead ratio in rounds: a c=1 text-search cell, a c=1 no-op cell and a block of raw
parts in a process of their own, in turn, round after round (the order rotated by one each
round); each figure is its median over the rounds.

On this shared 2-core machine the speed drifts by a third within minutes (text search at one
client: 2.0 to 4.0 ms in one hour on unchanged code), so one service cell and one raw-parts
loop a minute apart differ by the drift as well. Each figure is still taken as it is defined,
hot, in a loop of its own; the rounds only make the drift reach all three alike. (Taking a
search, a no-op and a query's parts one after another instead was tried: every figure then ran
after the others had taken the caches, and the ratio moved with that, 1.3x to 2.0x.)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
from load_generator import RawHttpClient, closed_loop, summarise, timed_caption

ROOT = Path(__file__).resolve().parents[1]
DRAWS = 16
PREFIX = "PARTS "
BLOCK = 300  # raw-parts queries per round, as many as the separate raw-parts loop times
FIGURES = ("service", "noop", "raw", "searcher")


@dataclass(frozen=True)
class OverheadRounds:
    """Per round, p50 (ms) of: service, c=1 POST /search/text with 16 draws, every caption new
    (cache misses); noop, c=1 GET /healthz; raw, the raw parts of a text query
    (service_bench_parts); searcher, Searcher.search_batch on the same captions."""

    service: list[float]
    noop: list[float]
    raw: list[float]
    searcher: list[float]

    def median(self, figure: str) -> float:
        return float(np.median(getattr(self, figure)))

    @property
    def ratio(self) -> float:
        """Issue 13's overhead ratio: service / (raw parts + no-op), medians over the rounds."""
        return self.median("service") / (self.median("raw") + self.median("noop"))

    def round_ratios(self) -> list[float]:
        return [s / (r + n) for s, r, n in zip(self.service, self.raw, self.noop, strict=True)]


@contextmanager
def parts_process(env: dict[str, str], spec: dict) -> Iterator[Callable[[int, int], list[float]]]:
    """A process that times blocks of raw-parts queries when asked (its environment: the
    server's); yields the function that asks it for (start, count)."""
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

    def ask(start: int, count: int) -> list[float]:
        process.stdin.write(f"{start} {count}\n")
        process.stdin.flush()
        return [float(x) for x in answer().split()]

    try:
        if answer() != "READY":
            raise RuntimeError("the raw-parts process did not start")
        yield ask
    finally:
        process.stdin.close()
        process.wait(timeout=60)


def measure_overhead_rounds(
    url: str, env: dict[str, str], spec: dict, rounds: int, warmup_s: float, duration_s: float,
    nonce: str, block: int = BLOCK,
) -> OverheadRounds:  # fmt: skip
    """`rounds` rounds of: the text cell and the no-op cell (warmup_s + duration_s each) and
    `block` raw-parts queries, in an order rotated by one each round."""
    figures: dict[str, list[float]] = {name: [] for name in FIGURES}
    with parts_process(env, spec) as parts:

        def raw_block(number: int) -> None:
            raw, whole = parts(number * block, block)
            figures["raw"].append(raw)
            figures["searcher"].append(whole)

        def text_cell(number: int) -> None:
            captions = spec["captions"]

            def make(i: int) -> tuple:
                text = timed_caption(captions[i % len(captions)], nonce, number, i)
                body = {"text": text, "k": 10, "mc_samples": DRAWS}
                return ("POST", "/search/text", json.dumps(body).encode(),
                        {"content-type": "application/json"})  # fmt: skip

            figures["service"].append(_p50(url, make, warmup_s, duration_s, expect_miss=True))

        def noop_cell(number: int) -> None:
            make = lambda i: ("GET", "/healthz", None, {})  # noqa: E731
            figures["noop"].append(_p50(url, make, warmup_s, duration_s, expect_miss=False))

        steps = [text_cell, noop_cell, raw_block]
        for number in range(rounds):
            shift = number % len(steps)
            for step in steps[shift:] + steps[:shift]:
                step(number)
    return OverheadRounds(**figures)


def _p50(url: str, make, warmup_s: float, duration_s: float, expect_miss: bool) -> float:
    address = urlsplit(url)

    async def run() -> tuple:
        client = RawHttpClient(address.hostname or "127.0.0.1", address.port or 80, 1)
        try:
            return await closed_loop(client.send, make, 1, warmup_s, duration_s)
        finally:
            await client.close()

    summary = summarise(*asyncio.run(run()))
    if summary.errors or (expect_miss and summary.hit_fraction > 0):
        raise RuntimeError(f"the overhead run's cell was not clean: {summary}")
    return summary.p50
