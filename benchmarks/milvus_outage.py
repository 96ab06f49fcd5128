"""Issue 41's quiet outages, measured: a 30 s Milvus outage while 8 clients search a real
server (`probsearch serve` with PROBSEARCH_SHORTLIST_BACKEND=milvus) through a Milvus Lite
server of its own (`python -m milvus_lite server`, as the tests and docs/operations.md run it
to share one between reindex and serve). Reports the bytes, lines and tracebacks the server
logged from the outage's start to the end of the run, which lines they were, the statuses the
clients got before, during and after, and how long the service took to answer again once
Milvus was back.

How Milvus goes away (--how; both by default, each with a fresh server):
- kill: SIGKILL of the Milvus process, started again on the same data dir and port 30 s
  later: a crashed, OOM-killed or restarted Milvus. Connections are refused at once, so every
  search fails fast: the most failures, the most log per second.
- stop: SIGSTOP, SIGCONT 30 s later: a hung Milvus or a network partition. Connections stay
  open and each call waits for its timeout (indexer.milvus_store.TIMEOUT_S, 10 s).

    python benchmarks/milvus_outage.py                  # writes results/milvus_outage.md
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.service_bench_setup import free_port, provenance, server

ROOT = Path(__file__).resolve().parents[1]
PROBSEARCH = [sys.executable, "-c", "from probsearch.cli import main; main()"]
CLIENTS, OUTAGE_S, BEFORE_S, AFTER_S = 8, 30.0, 10.0, 20.0
SIZES, COLOURS = ("small", "large"), ("red", "green", "blue", "yellow", "purple")
SHAPES = ("circle", "square", "triangle", "star")
CAPTIONS = [f"a {s} {c} {sh}" for s in SIZES for c in COLOURS for sh in SHAPES]


HOW = {
    "kill": (
        "Milvus killed (SIGKILL), started again 30 s later",
        "SIGKILL of the Milvus Lite process, started again on its data dir and port 30 s "
        "later: what a crashed, OOM-killed or restarted Milvus does. Connections are refused "
        "at once and every search fails fast: the most failures and the most log per second.",
    ),
    "stop": (
        "Milvus hung (SIGSTOP), resumed 30 s later",
        "SIGSTOP of the Milvus Lite process, SIGCONT 30 s later: what a hung Milvus or a "
        "network partition does. Connections stay open and each call waits for its timeout "
        "(10 s): few failures, each slow.",
    ),
}

# The same runs before the fixes they led to.
BEFORE = {
    "kill": "Before 576a11f, which lets pymilvus's failure loggers pass only CRITICAL, the "
    "same run (at b4c653d, load 4.8) wrote 21,150,412 bytes, 292,062 lines and 11,453 "
    "tracebacks during the 30 s outage (33.5 MB and 18,135 tracebacks to the run's end): "
    "3,023 ERROR records from pymilvus's _log_rpc_error() and 3,022 WARNING records from its "
    "connection manager's _recover(), each with its traceback, beside the service's own 3 "
    "records (the batcher's failure and recovery, a released collection loaded again).",
    "stop": "Before ed93f92, which makes gRPC's DEADLINE_EXCEEDED and UNAVAILABLE a "
    "ShortlistUnavailableError, the same run (at ef528f6, load 4.8) wrote 103,404 bytes, "
    "1,596 lines and 11 tracebacks during the 30 s outage (143,547 bytes and 15 tracebacks to "
    "the run's end): the searches got 500 or a reset connection (8 and 8 during the outage, "
    "4 and 4 after it), /readyz 500, and uvicorn logged 'Exception in ASGI application' with "
    "a traceback of about 150 lines for each of 13 of them (Starlette's error middleware "
    "hands every unhandled exception on to the server after the 500), beside the service's "
    "own 'requests failed' and the batcher's failure, once each.",
}


def cli(*args: str | Path) -> list[str]:
    return [*PROBSEARCH, *map(str, args)]


class MilvusLite:
    """`python -m milvus_lite server` on a fixed port and data dir: killed, stopped, restarted."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        self.data_dir, self.log = data_dir, log
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> float:
        """Start it; the seconds until a new client can list its collections."""
        import pymilvus

        started = time.monotonic()
        command = [sys.executable, "-m", "milvus_lite", "server", "--data-dir",
                   str(self.data_dir), "--host", "127.0.0.1", "--port", str(self.port)]  # fmt: skip
        with self.log.open("a") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                client = pymilvus.MilvusClient(self.uri, timeout=2)
                client.list_collections()
                client.close()
                return time.monotonic() - started
            except (OSError, pymilvus.MilvusException):
                if self.process.poll() is not None or time.monotonic() - started > 60:
                    raise RuntimeError(f"Milvus Lite did not start; see {self.log}") from None
                time.sleep(0.05)

    def signal(self, number: int) -> None:
        assert self.process is not None
        self.process.send_signal(number)
        if number == signal.SIGKILL:
            self.process.wait(timeout=10)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)


def build(work: Path, env: dict[str, str], images: int) -> tuple[Path, Path]:
    """A shapes dataset, a 1-epoch model, and its image gallery reindexed into Milvus and
    activated (as reindex_kills.py and the Milvus tests make theirs); (model, index root)."""
    data, model, root = work / "shapes", work / "model", work / "indexes"
    reindex = cli("reindex", "--modality", "image", "--source", data, "--model", model,
                  "--index-root", root, "--index-type", "flat", "--activate")  # fmt: skip
    steps = [
        cli("data", "shapes", "--out", data, "--images", images),
        cli("train", "--data", data, "--out", model, "--epochs", "1", "--no-progress"),
        reindex,
    ]
    for step in steps:
        done = subprocess.run(step, env=env, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{step[3:5]} failed:\n{done.stderr[-3000:]}")
    return model, root


class Clients:
    """`count` threads that send captions back to back; every answer as (start, end, status),
    status 0 for a transport error."""

    def __init__(self, url: str, count: int) -> None:
        self.url = url
        self.answers: list[tuple[float, float, int]] = []
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(count)
        ]

    def _run(self, index: int) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as http:
            n = index
            while not self.stop.is_set():
                query = {"text": CAPTIONS[n % len(CAPTIONS)], "k": 5 + n % 7}
                n += len(self.threads)
                started = time.monotonic()
                try:
                    status = http.post("/search/text", json=query).status_code
                except httpx.HTTPError:
                    status = 0
                self.answers.append((started, time.monotonic(), status))

    def __enter__(self) -> Clients:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


def log_mark(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    return len(data), data.count(b"\n")


def kinds_of_lines(text: str, top: int = 8) -> list[tuple[int, str]]:
    """The most frequent lines that open a log record or end a traceback (not a traceback's
    frames), numbers and addresses replaced by '#'."""
    shapes = collections.Counter(
        re.sub(r"0x[0-9a-f]+|\d+(\.\d+)?", "#", line.strip())[:160]
        for line in text.splitlines()
        if line.strip() and not line.startswith((" ", "Traceback", "^"))
    )
    return [(n, line) for line, n in shapes.most_common(top)]


def statuses(answers: list[tuple[float, float, int]], start: float, end: float) -> str:
    """Statuses of the answers that ended in [start, end), e.g. '200: 310, 503: 12'."""
    counts = collections.Counter(s for _, t, s in answers if start <= t < end)
    return ", ".join(f"{s or 'no answer'}: {n}" for s, n in sorted(counts.items())) or "none"


def outage(
    how: str, env: dict[str, str], model: Path, root: Path, milvus: MilvusLite, keep: Path | None
) -> list[str]:
    """One outage against a fresh server; its section of the results."""
    log = root.parent / f"server-{how}.log"
    with server(env, model, root, log) as (url, _), Clients(url, CLIENTS) as clients:
        time.sleep(BEFORE_S)
        ready_before = httpx.get(f"{url}/readyz", timeout=30).status_code
        marks = {"start": log_mark(log)}
        t0 = time.monotonic()
        milvus.signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        time.sleep(OUTAGE_S / 2)
        ready_during = httpx.get(f"{url}/readyz", timeout=30).status_code
        time.sleep(t0 + OUTAGE_S - time.monotonic())
        marks["outage"] = log_mark(log)
        t1 = time.monotonic()
        if how == "kill":
            startup = milvus.start()
        else:
            milvus.signal(signal.SIGCONT)
            startup = 0.0
        back = time.monotonic()  # Milvus answers a new client again
        time.sleep(AFTER_S)
        ready_after = httpx.get(f"{url}/readyz", timeout=30).status_code
        marks["end"] = log_mark(log)
        t2 = time.monotonic()
    written = log.read_bytes()
    if keep:
        (keep / log.name).write_bytes(written)
    outage_text = written[marks["start"][0] :].decode(errors="replace")
    during_text = written[marks["start"][0] : marks["outage"][0]].decode(errors="replace")
    answers = sorted(clients.answers, key=lambda a: a[1])
    first_ok = next((t for _, t, s in answers if s == 200 and t >= back), float("nan"))
    ended_after = [a for a in answers if a[1] >= back]
    failed_after = [a for a in ended_after if a[2] != 200]
    last_failed = max((t for _, t, _ in failed_after), default=back)
    before = sorted(t - s for s, t, _ in answers if t < t0)
    during = sorted(t - s for s, t, st in answers if t0 <= t < t1 and st != 200)
    nan = float("nan")
    out_bytes = marks["outage"][0] - marks["start"][0]
    out_lines = marks["outage"][1] - marks["start"][1]
    all_bytes, all_lines = marks["end"][0] - marks["start"][0], marks["end"][1] - marks["start"][1]
    traceback = "Traceback (most recent call last)"
    # pymilvus's own handler writes "<time> [LEVEL][function]: ..." (pymilvus/settings.py)
    pymilvus = collections.Counter(
        re.findall(r"^\d{4}-\d\d-\d\d [\d:,]+ \[(\w+)\]\[(\w+)\]", outage_text, re.M)
    )
    by_pymilvus = (
        ", ".join(f"{n:,} {level} from {where}()" for (level, where), n in pymilvus.most_common())
        or "none"
    )
    title, what = HOW[how]
    restarted = f" (its start took {startup:.1f} s)" if how == "kill" else ""
    return [
        f"## {title}",
        "",
        f"{what} `--how {how}`.",
        "",
        "| phase | s | statuses (answers ended in it) | /readyz |",
        "| --- | --- | --- | --- |",
        f"| before | {BEFORE_S:.0f} | {statuses(answers, 0, t0)} | {ready_before} |",
        f"| outage | {t1 - t0:.1f} | {statuses(answers, t0, t1)} | {ready_during} (at 15 s) |",
        f"| restart | {back - t1:.1f} | {statuses(answers, t1, back)} | |",
        f"| after | {t2 - back:.1f} | {statuses(answers, back, t2 + 60)} | {ready_after} |",
        "",
        f"Searches took {1000 * before[len(before) // 2] if before else nan:.0f} ms (p50) "
        f"before the outage; a failed one during it took "
        f"{1000 * during[len(during) // 2] if during else nan:.0f} ms (p50), "
        f"{1000 * during[-1] if during else nan:.0f} ms at most.",
        "",
        "| log written | bytes | lines | tracebacks |",
        "| --- | --- | --- | --- |",
        f"| during the {t1 - t0:.0f} s outage | {out_bytes:,} | {out_lines:,} | "
        f"{during_text.count(traceback)} |",
        f"| from the outage's start to the run's end ({t2 - t0:.0f} s) | {all_bytes:,} | "
        f"{all_lines:,} | {outage_text.count(traceback)} |",
        "",
        f"Records of pymilvus's own log handler from the outage's start to the end: "
        f"{by_pymilvus}. The most frequent lines that open a record or end a traceback "
        "(numbers as #):",
        "",
        "| times | line |",
        "| --- | --- |",
        *(f"| {n} | `{line.replace('|', '/')}` |" for n, line in kinds_of_lines(outage_text)),
        "",
        BEFORE[how],
        "",
        f"Recovery: Milvus answered a new client again {back - t1:.1f} s after the restart "
        f"began{restarted}. From then, the first 200 came after {first_ok - back:.2f} s; "
        f"{len(failed_after)} of the {len(ended_after)} answers after it failed, the last "
        f"of them {last_failed - back:.2f} s after it.",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--how", nargs="+", choices=list(HOW), default=list(HOW))
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--keep-logs", type=Path, help="copy the servers' logs into this dir")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                        "milvus_outage.md")  # fmt: skip
    args = parser.parse_args()
    command = " ".join([".venv/bin/python benchmarks/milvus_outage.py", *sys.argv[1:]])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBSEARCH_")}
    env["PYTHONPATH"] = str(ROOT)
    sections: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        milvus = MilvusLite(work / "milvus", work / "milvus.log")
        try:
            milvus.start()
            env |= {"PROBSEARCH_SHORTLIST_BACKEND": "milvus", "PROBSEARCH_MILVUS_URI": milvus.uri}
            model, root = build(work, env, args.images)
            env["PROBSEARCH_GALLERIES"] = "image"
            for how in args.how:
                sections += outage(how, env, model, root, milvus, args.keep_logs)
                print("\n".join(sections), flush=True)
        finally:
            milvus.close()
    lines = [
        f"# A {OUTAGE_S:.0f} s Milvus outage under {CLIENTS} clients",
        "",
        f"{provenance(command)} A {args.images}-image shapes gallery with a 1-epoch model, "
        "reindexed into a Milvus Lite server (`python -m milvus_lite server`) and served by "
        "`probsearch serve --log-level warning` with PROBSEARCH_SHORTLIST_BACKEND=milvus, a "
        f"fresh server per outage; {CLIENTS} clients send captions back to back (k 5-11, "
        f"{len(CAPTIONS)} captions, no Redis so no result cache): {BEFORE_S:.0f} s of "
        f"searches, Milvus gone for {OUTAGE_S:.0f} s, then {AFTER_S:.0f} s more. Tracebacks "
        'count "Traceback (most recent call last)" lines: one logged error with the exception '
        "it was raised from has two.",
        "",
        *sections,
    ]
    args.out.write_text("\n".join(lines))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
