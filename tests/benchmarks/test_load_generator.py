"""The service benchmark's load generators and latency summary (benchmarks/load_generator.py)."""

import asyncio
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from load_generator import (
    RawHttpClient,
    Record,
    arrival_offsets,
    closed_loop,
    open_loop,
    summarise,
    timed_caption,
)


def test_summary_leaves_out_warmup_and_failures_and_counts_completions_in_the_window():
    latencies = np.arange(1, 11, dtype=np.float64)  # ms, requests started at 10.0 .. 10.9
    records = [Record(9.5, 10.5, 200, "miss")]  # warm-up: started before the window
    records += [Record(10 + i / 10, 10 + i / 10 + ms / 1000, 200, "hit" if i < 3 else "miss")
                for i, ms in enumerate(latencies)]  # fmt: skip
    records.append(Record(10.35, 10.4, 503, None))  # a failure: counted, not in percentiles
    records.append(Record(10.95, 11.2, 200, "miss"))  # ends after the window: not in QPS
    summary = summarise(records, 10.0, 11.0)
    every = np.append(latencies, 250.0)
    for q, value in ((50, summary.p50), (95, summary.p95), (99, summary.p99)):
        assert value == pytest.approx(np.percentile(every, q))
    assert summary.mean == pytest.approx(every.mean())
    assert (summary.count, summary.errors, summary.error_statuses) == (12, 1, {503: 1})
    # completed in [10, 11): the warm-up one (at 10.5) and the ten; per second of window
    assert summary.qps == pytest.approx(11.0)
    assert summary.hit_fraction == pytest.approx(3 / 11)


def _fake_server(delay_s: float, seen: dict):
    """A Sender that takes delay_s per request and records how many overlap."""

    async def send(request):
        seen["now"] += 1
        seen["max"] = max(seen["max"], seen["now"])
        await asyncio.sleep(delay_s)
        seen["now"] -= 1
        return 200, "miss"

    return send


def request(i: int):
    return "GET", f"/q/{i}", None, {}


def test_closed_loop_never_exceeds_its_concurrency_and_waits_for_enough_measured_requests():
    seen = {"now": 0, "max": 0}
    # the window (10 ms) is shorter than one request: it must be extended
    run = closed_loop(_fake_server(0.05, seen), request, 4, 0.02, 0.01, min_measured=4)
    records, start, end = asyncio.run(run)
    assert seen["max"] == 4
    summary = summarise(records, start, end)
    assert summary.count >= 4 and summary.errors == 0
    assert summary.p50 >= 50


def test_open_loop_sends_at_the_scheduled_times_and_charges_queueing_to_latency():
    seen = {"now": 0, "max": 0}
    rate, warmup, duration = 200.0, 0.1, 0.3
    run = open_loop(_fake_server(0.02, seen), request, rate, warmup, duration, seed=3)
    records, start, end = asyncio.run(run)
    assert len(records) == len(arrival_offsets(rate, warmup + duration, 3))
    assert seen["max"] > 1  # not closed loop: requests overlap
    assert end - start == pytest.approx(duration)
    assert min(r.end - r.start for r in records) >= 0.02


def test_raw_client_reads_both_body_framings_keeps_connections_alive_and_reconnects():
    answers = [
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-cache: hit\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        b"HTTP/1.1 422 Unprocessable\r\ncontent-length: 2\r\n\r\n{}",
    ]
    connections, bodies = [], []

    async def handle(reader, writer):
        connections.append(writer)
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            length = [int(x.split(b":")[1]) for x in head.split(b"\r\n") if b"content-length" in x]
            bodies.append(await reader.readexactly(length[0]) if length else b"")
            writer.write(answers[(len(bodies) - 1) % len(answers)])
            await writer.drain()
            if len(bodies) == 3:  # the server drops the idle connection after the third
                writer.close()
                return

    async def run():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        client = RawHttpClient("127.0.0.1", server.sockets[0].getsockname()[1], 4)
        got = [await client.send(("POST", "/x", b'{"a": 1}', {})) for _ in range(4)]
        await client.close()
        server.close()
        return got

    got = asyncio.run(run())
    assert got == [(200, "hit"), (200, None), (422, None), (200, "hit")]
    assert len(connections) == 2  # kept alive for three, then one reconnection
    assert bodies == [b'{"a": 1}'] * 4


def test_every_timed_caption_carries_a_tag_of_one_shape_unique_to_its_key():
    """The service's cells, the overhead rounds and the raw parts time captions of the same
    form, whatever their keys look like, so none encodes longer captions than another."""
    keys = [("raw", 7), ("searcher", 7), ("a1b2c3d4default0", 1, 7), ("a1b2c3d4c12x7",)]
    captions = [timed_caption("a drawing of a penguin", *key) for key in keys]
    for caption in captions:
        assert re.fullmatch(r"a drawing of a penguin q[0-9a-f]{8}", caption)
    assert len(set(captions)) == len(keys)
    assert timed_caption("x", "raw", 7) == timed_caption("x", "raw", 7)
