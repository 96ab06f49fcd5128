"""Issue 43's live gallery, measured against a real server (`probsearch serve`, Redis, the
shapes lab's small demo model and calibrated indexes):

- load: 8 clients search for 60 s while 1,000 captions are added to the caption gallery and
  500 of them deleted through the admin API. Counts failed searches; for each added caption,
  the time from its 200 until a search with its own Gaussian (the caption's, as /search/text
  returns it) finds it; and every answer that started after a DELETE's 200 and still held
  that item (cache hits included).
- compact: the same load (searches only); the top-10 of 30 queries x 3 metrics before a
  compaction (POST /admin/compact) and after it, and the searches that failed meanwhile.
- kills: 10 times, a server takes adds and deletes and is killed with SIGKILL at a random
  moment; after each, every acknowledged write must be in the index root's log (read by a
  fresh LiveIndex), and at the end a restarted server's answers for every metric must equal
  brute force over the live items.
- qps: a synthetic image gallery, queried with Gaussians at concurrency 8: as built, with a
  live segment of 1% and 10% of it, and with filters matching 50% and 1% of it.

    python benchmarks/live_gallery.py [--phases load,compact,kills,qps] [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmarks.service_bench_setup import (
    demo_artifacts,
    provenance,
    redis_server,
    server,
    synthetic_gallery,
)
from indexer.live_index import LiveIndex
from indexer.live_log import Put
from indexer.registry import ActiveRegistry
from indexer.store import open_version
from models.distance.gaussian import pairwise_distance

ROOT = Path(__file__).resolve().parents[1]
ADMIN_KEY = "live-gallery-bench-key-0123456789"
ADMIN = {"X-API-Key": ADMIN_KEY}
METRICS = ("w2", "kl", "min_kl")
COLORS = ("red", "green", "blue", "yellow", "purple", "orange", "white", "black")
SHAPES = ("circle", "square", "triangle", "star", "hexagon", "cross")
SIZES = ("small", "large", "tiny", "big")
PLACES = ("left", "right", "top", "bottom", "middle")


def new_captions(count: int, seed: int = 0) -> list[str]:
    """Distinct captions in the shapes vocabulary: two objects with sizes, colors and places."""
    rng = random.Random(seed)
    found: set[str] = set()
    while len(found) < count:
        a = f"a {rng.choice(SIZES)} {rng.choice(COLORS)} {rng.choice(SHAPES)}"
        b = f"a {rng.choice(SIZES)} {rng.choice(COLORS)} {rng.choice(SHAPES)}"
        found.add(f"{a} on the {rng.choice(PLACES)} and {b} on the {rng.choice(PLACES)}")
    return sorted(found)


@dataclass
class Record:
    """What the searches of one phase saw."""

    started: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    answers: list[tuple[float, list[str], str]] = field(default_factory=list)  # text gallery
    count: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(
        self, start: float, response: httpx.Response | None, error: str | None, keep: bool
    ) -> None:
        """One search; `keep`: remember the ids it answered (the caption gallery's)."""
        with self.lock:
            self.count += 1
            if error is not None or response is None or response.status_code != 200:
                self.failures.append(error or f"{response.status_code}: {response.text[:200]}")
            elif keep:
                ids = [hit["id"] for hit in response.json()["results"]]
                self.answers.append((start, ids, response.headers.get("x-cache", "")))


@contextmanager
def searching(
    url: str, clients: int, requests: Callable[[random.Random], tuple[str, dict]], record: Record
) -> Iterator[None]:
    """`clients` threads sending requests() until the block ends."""
    stop = threading.Event()

    def client(number: int) -> None:
        rng = random.Random(number)
        with httpx.Client(base_url=url, timeout=30) as http:
            while not stop.is_set():
                path, body = requests(rng)
                keep = body.get("gallery") == "text"
                start = time.monotonic()
                try:
                    record.add(start, http.post(path, json=body), None, keep)
                except httpx.HTTPError as error:
                    record.add(start, None, repr(error), keep)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)


def server_env(redis_url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBSEARCH_")}
    env.update({
        "PYTHONPATH": str(ROOT), "PROBSEARCH_REDIS_URL": redis_url,
        "PROBSEARCH_API_KEYS": ADMIN_KEY, "PROBSEARCH_COMPACT_AT_ROWS": "0",
        "PROBSEARCH_ADMIN_AUTH_MAX_FAILURES": "1000",
    })  # fmt: skip
    env.update(extra or {})
    return env


def gaussians_of(url: str, captions: list[str]) -> list[tuple[list[float], list[float]]]:
    """Each caption's Gaussian as the service encodes it (return_embedding)."""
    out = []
    with httpx.Client(base_url=url, timeout=30) as http:
        for caption in captions:
            body = {"text": caption, "k": 1, "mc_samples": 0, "return_embedding": True}
            query = http.post("/search/text", json=body).raise_for_status().json()["query"]
            out.append((query["mu"], query["logvar"]))
    return out


def finds(http: httpx.Client, item_id: str, gaussian, k: int = 20) -> bool:
    body = {"gallery": "text", "mu": gaussian[0], "logvar": gaussian[1], "k": k}
    hits = http.post("/search/embedding", json=body).raise_for_status().json()["results"]
    return any(h["id"] == item_id and h["distance"] < 1e-3 for h in hits)


# ----- phase: load ---------------------------------------------------------------------------


def phase_load(url: str, captions: list[str], seconds: float, lines: list[str]) -> None:
    test_captions = new_captions(50, seed=99)
    gaussians = gaussians_of(url, captions)
    adds, deletes = len(captions), len(captions) // 2  # the pace: 1,500 writes over `seconds`
    record = Record()
    ack: dict[str, float] = {}
    deleted_at: dict[str, float] = {}
    visible_after: list[float] = []
    not_found: list[str] = []
    write_failures: list[str] = []

    def requests(rng: random.Random) -> tuple[str, dict]:
        if rng.random() < 0.5:
            return "/search/text", {"text": rng.choice(test_captions), "k": 10}
        mu, logvar = gaussians[rng.randrange(len(gaussians))]
        return "/search/embedding", {"gallery": "text", "mu": mu, "logvar": logvar, "k": 10}

    pace = seconds / (adds + deletes)
    start = time.monotonic()
    with searching(url, 8, requests, record), httpx.Client(base_url=url, timeout=30) as http:
        for i, caption in enumerate(captions):
            item = {"id": f"live-{i}", "text": caption, "metadata": {"batch": i % 10}}
            response = http.post("/v1/items", json=item, headers=ADMIN)
            if response.status_code != 200:
                write_failures.append(f"add {i}: {response.status_code} {response.text[:200]}")
                continue
            ack[item["id"]] = time.monotonic()
            while not finds(http, item["id"], gaussians[i]):
                if time.monotonic() - ack[item["id"]] > 5:
                    not_found.append(item["id"])
                    break
            else:
                visible_after.append(time.monotonic() - ack[item["id"]])
            # every other item is deleted 10 adds after its own, the last ones at the end
            targets = [i - 10] if i >= 10 else []
            targets += list(range(i - 9, i + 1)) if i == len(captions) - 1 else []
            for gone in (f"live-{t}" for t in targets if t % 2 == 0):
                response = http.delete(
                    f"/v1/items/{gone}", params={"gallery": "text"}, headers=ADMIN
                )
                if response.status_code == 200:
                    deleted_at[gone] = time.monotonic()
                else:
                    write_failures.append(f"delete {gone}: {response.status_code}")
            time.sleep(max(0.0, start + (i + 1 + len(deleted_at)) * pace - time.monotonic()))
    wall = time.monotonic() - start
    stale = [
        (item_id, cache)
        for began, ids, cache in record.answers
        for item_id in ids
        if item_id in deleted_at and began > deleted_at[item_id]
    ]
    visible = np.array(visible_after or [np.nan]) * 1000
    lines += [
        "## Load: adds and deletes under 8 searching clients",
        "",
        f"- {wall:.0f} s; {len(ack)} adds and {len(deleted_at)} deletes acknowledged; "
        f"{len(write_failures)} writes failed {write_failures[:3]}",
        f"- searches: {record.count} sent ({record.count / wall:.0f}/s), "
        f"{len(record.failures)} failed {record.failures[:3]}",
        "- added caption found by its own Gaussian after its 200: "
        f"p50 {np.percentile(visible, 50):.1f} ms, "
        f"p99 {np.percentile(visible, 99):.1f} ms, max {visible.max():.1f} ms; "
        f"{len(not_found)} not found within 5 s; {int((visible > 1000).sum())} over 1 s",
        f"- answers from the caption gallery checked for deleted items: {len(record.answers)} "
        f"({sum(c == 'hit' for _, _, c in record.answers)} cache hits); holding an item after "
        f"its DELETE's 200: {len(stale)} {stale[:3]}",
        "",
    ]


# ----- phase: compact ------------------------------------------------------------------------


def top10(url: str, queries, metric: str) -> list[list[str]]:
    with httpx.Client(base_url=url, timeout=30) as http:
        return [
            [h["id"] for h in http.post("/search/embedding", json={
                "gallery": "text", "mu": mu, "logvar": logvar, "k": 10, "metric": metric,
            }).raise_for_status().json()["results"]]
            for mu, logvar in queries
        ]  # fmt: skip


def phase_compact(url: str, captions: list[str], lines: list[str]) -> None:
    queries = gaussians_of(url, captions[:30])
    before = {m: top10(url, queries, m) for m in METRICS}
    record = Record()

    def requests(rng: random.Random) -> tuple[str, dict]:
        mu, logvar = queries[rng.randrange(len(queries))]
        return "/search/embedding", {"gallery": "text", "mu": mu, "logvar": logvar, "k": 10,
                                     "mc_samples": rng.choice([0, 8])}  # fmt: skip

    with searching(url, 8, requests, record):
        time.sleep(2)
        started = time.monotonic()
        with httpx.Client(base_url=url, timeout=600) as http:
            response = http.post("/admin/compact", params={"gallery": "text"}, headers=ADMIN)
        took = time.monotonic() - started
        time.sleep(2)
    result = response.json()
    after = {m: top10(url, queries, m) for m in METRICS}
    same = sum(before[m][q] == after[m][q] for m in METRICS for q in range(len(queries)))
    lines += [
        "## Compaction under load (8 clients searching the caption gallery)",
        "",
        f"- POST /admin/compact: {response.status_code} in {took:.1f} s: {result}",
        f"- searches meanwhile: {record.count}, "
        f"failed {len(record.failures)} {record.failures[:3]}",
        f"- top-10 equal before and after, for 30 queries x {len(METRICS)} metrics: "
        f"{same}/{len(queries) * len(METRICS)}",
        "",
    ]


# ----- phase: kills --------------------------------------------------------------------------


def live_of(index_root: Path, gallery: str = "text") -> LiveIndex:
    registry = ActiveRegistry(index_root, None)
    version = registry.active_version(gallery)
    return LiveIndex(open_version(registry.version_path(gallery, version), device="cpu"))


def brute_force_ids(live: LiveIndex, mu, logvar, metric: str, k: int = 10) -> list[str]:
    state = live.snapshot()[0]
    rows = state.live_rows()
    distances = pairwise_distance(
        metric, torch.tensor([mu]), torch.tensor([logvar]),
        torch.from_numpy(np.asarray(live.mu[rows], np.float32)),
        torch.from_numpy(np.asarray(live.logvar[rows], np.float32)),
    )[0].numpy()  # fmt: skip
    order = np.argsort(distances, kind="stable")[:k]
    return [r["id"] for r in live.metadata(rows[order].tolist())]


def phase_kills(env, model: Path, index_root: Path, work: Path, lines: list[str]) -> None:
    rng = random.Random(7)
    acked_adds: set[str] = set()
    acked_deletes: set[str] = set()
    lost, resurrected, rounds = [], [], []
    for round_number in range(10):
        captions = new_captions(3000, seed=1000 + round_number)
        with server(env, model, index_root, work / f"kill-{round_number}.log") as (url, process):
            stop_at = time.monotonic() + rng.uniform(0.5, 3.0)
            sent = 0
            with httpx.Client(base_url=url, timeout=10) as http:
                while time.monotonic() < stop_at and sent < len(captions):
                    item_id = f"kill-{round_number}-{sent}"
                    try:
                        if sent % 3 == 2:
                            gone = f"kill-{round_number}-{sent - 2}"
                            if gone in acked_adds:
                                r = http.delete(f"/v1/items/{gone}", params={"gallery": "text"},
                                                headers=ADMIN)  # fmt: skip
                                if r.status_code == 200:
                                    acked_deletes.add(gone)
                        r = http.post("/v1/items", json={"id": item_id, "text": captions[sent]},
                                      headers=ADMIN)  # fmt: skip
                        if r.status_code == 200:
                            acked_adds.add(item_id)
                    except httpx.HTTPError:
                        break
                    sent += 1
                process.kill()  # SIGKILL, mid-stream
                process.wait(timeout=30)
            rounds.append(sent)
        live = live_of(index_root)
        lost += [i for i in acked_adds - acked_deletes if live.record(i) is None]
        resurrected += [i for i in acked_deletes if live.record(i) is not None]
        live.close()
    exact, checked = 0, 0
    with server(env, model, index_root, work / "kill-final.log") as (url, _):
        live = live_of(index_root)
        queries = gaussians_of(url, new_captions(10, seed=5))
        for metric in METRICS:
            got = top10(url, queries, metric)
            for q, (mu, logvar) in enumerate(queries):
                checked += 1
                exact += got[q] == brute_force_ids(live, mu, logvar, metric)
        live.close()
    lines += [
        "## kill -9 of the server during writes, 10 times",
        "",
        f"- writes sent per round before the kill: {rounds}",
        f"- acknowledged: {len(acked_adds)} adds, {len(acked_deletes)} deletes; after the "
        f"restarts, acknowledged adds missing: {len(lost)} {lost[:3]}; acknowledged deletes "
        f"back: {len(resurrected)} {resurrected[:3]}",
        f"- a restarted server's top-10 equal to brute force over the live items: "
        f"{exact}/{checked} (10 queries x {len(METRICS)} metrics)",
        "",
    ]


# ----- phase: qps ----------------------------------------------------------------------------


def qps_cell(url: str, queries, seconds: float, extra: dict) -> tuple[float, float, int]:
    record = Record()

    def requests(rng: random.Random) -> tuple[str, dict]:
        q = rng.randrange(len(queries[0]))
        body = {"gallery": "image", "mu": queries[0][q].tolist(), "logvar": queries[1][q].tolist(),
                "k": 10, "mc_samples": 0, **extra}  # fmt: skip
        body["mu"][0] += rng.random() * 1e-3  # another request each time: no cache hits
        return "/search/embedding", body

    with searching(url, 8, requests, record):
        time.sleep(3)  # warm: the first searches read the index from disk
        before, began = record.count, time.monotonic()
        time.sleep(seconds)
        done, took = record.count - before, time.monotonic() - began
    return done / took, took, len(record.failures)


def phase_qps(
    redis_url: str,
    model: Path,
    cache: Path,
    work: Path,
    count: int,
    seconds: float,
    lines: list,
    rounds: int = 3,
) -> None:
    import sqlite3

    from indexer.manifest import read_manifest

    root = work / "synthetic"
    shutil.copytree(synthetic_gallery(cache, model, count, ("w2",)), root)
    version = root / "image" / "synthetic"
    index_type = read_manifest(version).index_type

    db = sqlite3.connect(version / "metadata.sqlite")
    rows = np.arange(count)
    db.executemany(
        "UPDATE items SET extra = ? WHERE row = ?",
        [(json.dumps({"half": int(r % 2), "one_in_100": int(r % 100 == 0)}), int(r)) for r in rows],
    )
    db.commit()
    db.close()
    env = server_env(redis_url, {"PROBSEARCH_GALLERIES": "image"})
    mu = np.load(version / "mu.npy", mmap_mode="r")
    logvar = np.load(version / "logvar.npy", mmap_mode="r")
    pick = np.random.default_rng(3).integers(0, count, 256)
    queries = (np.asarray(mu[pick]) + 0.1, np.asarray(logvar[pick]))
    plan = [("as built", 0, {}), ("filter matching 50%", 0, {"filter": {"half": 1}}),
            ("filter matching 1%", 0, {"filter": {"one_in_100": 1}}),
            ("segment 1% of the gallery", count // 100, {}),
            ("segment 10% of the gallery", count // 10, {})]  # fmt: skip
    roots = {0: root}
    for segment in sorted({s for _, s, _ in plan} - {0}):
        roots[segment] = work / f"synthetic-{segment}"
        shutil.copytree(root, roots[segment])
        add_segment(roots[segment] / "image" / "synthetic", mu, logvar, segment)
    measured: dict[str, list[float]] = defaultdict(list)
    failed: dict[str, int] = defaultdict(int)
    for turn in range(rounds):  # turns, so that the machine's drift reaches every cell alike
        for name, segment, extra in plan:
            log = work / f"qps-{turn}-{name}.log"
            with server(env, model, roots[segment], log) as (url, _):
                qps, _, failures = qps_cell(url, queries, seconds, extra)
            measured[name].append(qps)
            failed[name] += failures
    base = float(np.median(measured["as built"]))
    lines += [
        f"## QPS at concurrency 8: a synthetic gallery of {count} Gaussians ({index_type} w2), "
        f"/search/embedding, mc_samples 0, no cache hits; median of {rounds} turns (min-max)",
        "",
        "| gallery | QPS | of as built | failed |",
        "| --- | --- | --- | --- |",
        *[
            f"| {name} | {np.median(q):.0f} ({min(q):.0f}-{max(q):.0f}) | "
            f"{np.median(q) / base:.2f} | {failed[name]} |"
            for name, q in measured.items()
        ],
        "",
    ]


def add_segment(version: Path, mu: np.ndarray, logvar: np.ndarray, segment: int) -> None:
    """`segment` live items added to the version: near random rows, matching filter "half"."""
    live = LiveIndex(open_version(version, device="cpu"))
    rng = np.random.default_rng(segment)
    rows_from = rng.integers(0, len(mu), segment)
    noise = rng.normal(0, 0.05, (segment, mu.shape[1])).astype(np.float32)
    live.write([
        Put(f"seg-{i}", np.asarray(mu[r]) + noise[i], np.asarray(logvar[r]),
            {"extra": {"half": 1}})
        for i, r in enumerate(rows_from)
    ])  # fmt: skip
    live.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", default="load,compact,kills,qps")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--adds", type=int, default=1000)
    parser.add_argument("--qps-gallery", type=int, default=50_000)
    parser.add_argument("--qps-seconds", type=float, default=10.0)
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench-live")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/live_gallery.md")
    args = parser.parse_args()
    phases = args.phases.split(",")
    args.work.mkdir(parents=True, exist_ok=True)
    demo = demo_artifacts(args.work / "demo", quick=True)
    command = "python benchmarks/live_gallery.py " + " ".join(sys.argv[1:])
    lines = ["# Live gallery: adds, deletes, compaction, kills and filters (issue 43)", "",
             provenance(command), ""]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as redis_url:
        work = Path(tmp)
        index_root = work / "root"
        shutil.copytree(demo.index_root, index_root, ignore=shutil.ignore_patterns(".*"))
        for wal in index_root.glob("*/*/live.wal"):
            wal.unlink()
        env = server_env(f"{redis_url}/0")
        captions = new_captions(args.adds)

        def done() -> None:  # each phase's figures are kept even if a later one fails
            args.out.write_text("\n".join(lines) + "\n")
            print("\n".join(lines), flush=True)

        if "load" in phases or "compact" in phases:
            with server(env, demo.model, index_root, work / "server.log") as (url, _):
                if "load" in phases:
                    phase_load(url, captions, args.seconds, lines)
                    done()
                if "compact" in phases:
                    phase_compact(url, captions, lines)
                    done()
        if "kills" in phases:
            phase_kills(env, demo.model, index_root, work, lines)
            done()
        if "qps" in phases:
            phase_qps(
                f"{redis_url}/1", demo.model, args.work, work, args.qps_gallery,
                args.qps_seconds, lines,
            )  # fmt: skip
            done()


if __name__ == "__main__":
    main()
