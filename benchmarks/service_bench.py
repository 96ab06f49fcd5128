"""Service benchmark: a real `probsearch serve` and Redis under bounded load, against the raw parts.

Starts redis-server (no persistence) and `probsearch serve` in subprocesses (settings through
PROBSEARCH_* variables) against the demo's model and indexes (probsearch.demo.build_demo, cached
in the work dir), drives them with a closed-loop load generator (concurrency 1/4/16/64; an
asyncio HTTP/1.1 client, or httpx.AsyncClient with --client httpx) and an offered-rate
(open-loop) one, times the raw parts of a text query in a separate process
on the objects the server builds (ONNX encode, FAISS shortlist, exact re-rank, uncertainty,
metadata) and the app's no-op endpoint (GET /healthz), and writes a Markdown table per scenario
to benchmarks/results/service_bench.md with the machine, load average and command.

    .venv/bin/python benchmarks/service_bench.py --quick    # smoke run, under 2 minutes
    .venv/bin/python benchmarks/service_bench.py            # main, threads, batching, open-loop
    .venv/bin/python benchmarks/service_bench.py --scenarios all --background-load both  # issue 13

Scenarios (--scenarios): main (text/image/embedding x 0/16 draws x cache miss/hit x
--concurrency, plus the no-op endpoint), threads (PROBSEARCH_THREADS sweep, text 16 draws at
c=1 and 16), batching (PROBSEARCH_BATCH_MAX_SIZE=1 vs default), window (the batcher
waiting 5 ms for company under load vs the default of no wait, text 16 draws at c=2-64),
concurrency (one batch at a time vs the default's batches at once, text and image, c=1, 16),
open-loop (--rate per second, Poisson arrivals), gallery (a synthetic gallery of
--gallery-size Gaussians, 1M by default, searched through /search/embedding with w2 and kl;
building it takes minutes, cached).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shlex
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# As the probsearch CLI does, before any OpenMP pool starts: waiting threads sleep, not spin.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from load_generator import (  # noqa: E402
    RawHttpClient,
    Summary,
    closed_loop,
    httpx_sender,
    open_loop,
    summarise,
    timed_caption,
)
from service_bench_overhead import PREFIX, OverheadRounds, measure_overhead_rounds  # noqa: E402
from service_bench_setup import (  # noqa: E402
    Artifacts,
    background_load,
    demo_artifacts,
    gallery_queries,
    redis_server,
    server,
    synthetic_gallery,
)

SCENARIOS = ("main", "threads", "batching", "window", "concurrency", "open-loop", "gallery")
DEFAULT_SCENARIOS = "main,threads,batching,open-loop"
ENDPOINTS = ("text", "image", "embedding")
DRAWS = (0, 16)
K = 10
REDIS_DB_DEMO, REDIS_DB_GALLERY = 0, 1  # separate: each has its own cache and active keys


# ----- what is measured ------------------------------------------------------------------


@dataclass(frozen=True)
class ServerConfig:
    """One server start: its name in the tables and the PROBSEARCH_* variables it adds."""

    name: str
    env: tuple[tuple[str, str], ...] = ()
    gallery: bool = False  # serves the synthetic gallery instead of the demo's


DEFAULT_SERVER = ServerConfig("default")
UNBATCHED_SERVER = ServerConfig("batch_max_size=1", (("PROBSEARCH_BATCH_MAX_SIZE", "1"),))
WINDOW_SERVER = ServerConfig("batch_max_wait_ms=5", (("PROBSEARCH_BATCH_MAX_WAIT_MS", "5"),))
ONE_BATCH_SERVER = ServerConfig("batch_concurrency=1", (("PROBSEARCH_BATCH_CONCURRENCY", "1"),))
# Same threads as default: no raw parts.
BATCH_VARIANTS = (UNBATCHED_SERVER, WINDOW_SERVER, ONE_BATCH_SERVER)
GALLERY_SERVER = ServerConfig("gallery", (("PROBSEARCH_GALLERIES", "image"),), gallery=True)


def thread_server(setting: str) -> ServerConfig:
    """The server of one PROBSEARCH_THREADS setting ("default": the variable unset)."""
    if setting == "default":
        return DEFAULT_SERVER
    return ServerConfig(f"threads={setting}", (("PROBSEARCH_THREADS", setting),))


@dataclass(frozen=True)
class Cell:
    """One measurement: a server, a request kind and a load."""

    server: ServerConfig
    endpoint: str  # text | image | embedding | noop
    draws: int = 16
    cache: str = "miss"  # miss: every request distinct; hit: one request repeated
    concurrency: int = 1  # closed loop; 0 in open-loop cells
    rate: float = 0.0  # open loop: offered requests per second
    background: bool = False
    metric: str | None = None


@dataclass
class Measured:
    """A cell's summary and the CPU the client and the server used during it."""

    summary: Summary
    client_cpu: float  # cores (1.0 = one core busy)
    server_cpu: float
    rounds: tuple[Summary, ...] = ()  # each round's summary, when measured in rounds


@dataclass
class RunState:
    """Everything a run measured, for the report."""

    cells: dict[Cell, Measured] = field(default_factory=dict)
    raw: dict[tuple[str, bool], dict] = field(default_factory=dict)  # (threads, background)
    servers: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> env
    server_threads: dict[str, int] = field(default_factory=dict)  # name -> OS threads at the end
    overhead: dict[tuple[str, bool], OverheadRounds] = field(default_factory=dict)  # threads, bg
    notes: list[str] = field(default_factory=list)


def plan_cells(args: argparse.Namespace) -> dict[str, list[Cell]]:
    """The cells of each selected scenario (one cell may appear in several)."""
    loads = {"off": [False], "on": [True], "both": [False, True]}[args.background_load]
    text16 = Cell(DEFAULT_SERVER, "text", 16)
    plan: dict[str, list[Cell]] = {}
    for background in loads:
        cells: dict[str, list[Cell]] = {name: [] for name in args.scenarios}
        if "main" in cells:
            for endpoint in ENDPOINTS:
                for draws in DRAWS:
                    for cache in ("miss", "hit"):
                        cells["main"] += [
                            Cell(DEFAULT_SERVER, endpoint, draws, cache, c, background=background)
                            for c in args.concurrency
                        ]
            cells["main"] += [noop(DEFAULT_SERVER, c, background) for c in args.concurrency]
        if "threads" in cells:
            for setting in args.threads:
                server = thread_server(setting)
                cells["threads"] += [
                    replace(text16, server=server, concurrency=c, background=background)
                    for c in (1, 16)
                ] + [noop(server, 1, background)]
        if "batching" in cells:
            for server in (DEFAULT_SERVER, UNBATCHED_SERVER):
                cells["batching"] += [
                    replace(text16, server=server, concurrency=c, background=background)
                    for c in (1, 16, 64)
                ]
        if "window" in cells:
            for server in (DEFAULT_SERVER, WINDOW_SERVER):
                cells["window"] += [
                    replace(text16, server=server, concurrency=c, background=background)
                    for c in (2, 4, 16, 64)
                ]
        if "concurrency" in cells:
            for server in (DEFAULT_SERVER, ONE_BATCH_SERVER):
                cells["concurrency"] += [
                    replace(text16, server=server, endpoint=endpoint, concurrency=c,
                            background=background)
                    for endpoint in ("text", "image")
                    for c in (1, 16)
                ]  # fmt: skip
        if "open-loop" in cells:
            cells["open-loop"].append(
                replace(text16, concurrency=0, rate=args.rate, background=background)
            )
        if "gallery" in cells:
            cells["gallery"] += [
                Cell(
                    GALLERY_SERVER,
                    "embedding",
                    draws,
                    "miss",
                    c,
                    background=background,
                    metric=metric,
                )
                for metric in args.gallery_metrics
                for draws in DRAWS
                for c in (1, 16)
            ]
        for name, listed in cells.items():
            plan.setdefault(name, []).extend(listed)
    return plan


def noop(server: ServerConfig, concurrency: int, background: bool) -> Cell:
    return Cell(server, "noop", 0, "miss", concurrency, background=background)


# ----- the server's environment --------------------------------------------------------------


def server_env(config: ServerConfig, extra: dict[str, str], redis_url: str) -> dict[str, str]:
    """The environment of a server (and of the raw-parts process that mirrors it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBSEARCH_")}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's code, not whatever is installed
    db = REDIS_DB_GALLERY if config.gallery else REDIS_DB_DEMO
    env["PROBSEARCH_REDIS_URL"] = f"{redis_url}/{db}"
    env.update(extra)
    env.update(dict(config.env))
    return env


# ----- requests ------------------------------------------------------------------------------

JSON = {"content-type": "application/json"}
BOUNDARY = "service-bench-boundary"


def png_variant(png: bytes, tag: str) -> bytes:
    """The same image with a tEXt chunk before IEND: other bytes (another cache key and seed),
    the same pixels."""
    data = b"bench\x00" + tag.encode()
    chunk = struct.pack(">I", len(data)) + b"tEXt" + data
    chunk += struct.pack(">I", zlib.crc32(b"tEXt" + data))
    return png[:-12] + chunk + png[-12:]


def multipart(image: bytes, fields: dict[str, str]) -> bytes:
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="q.png"'
        "\r\nContent-Type: image/png\r\n\r\n".encode()
        + image
        + b"\r\n"
    ]
    parts += [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def request_maker(cell: Cell, art: Artifacts, gallery: tuple | None, nonce: str):
    """i -> request of this cell; misses never repeat a request (nor one of another cell)."""
    if cell.endpoint == "noop":
        return lambda i: ("GET", "/healthz", None, {})
    key = (lambda i: f"{nonce}x{i}") if cell.cache == "miss" else (lambda i: f"{nonce}hit")
    index = (lambda i: i) if cell.cache == "miss" else (lambda i: 0)
    options = {"k": K, "mc_samples": cell.draws}
    if cell.metric:
        options["metric"] = cell.metric
    if cell.endpoint == "text":
        captions = art.captions

        def text(i: int) -> tuple:
            body = {"text": timed_caption(captions[index(i) % len(captions)], key(i)), **options}
            return "POST", "/search/text", json.dumps(body).encode(), JSON

        return text
    if cell.endpoint == "image":
        images = art.images
        headers = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
        fields = {name: str(value) for name, value in options.items()}

        def image(i: int) -> tuple:
            data = png_variant(images[index(i) % len(images)], key(i))
            return "POST", "/search/image", multipart(data, fields), headers

        return image
    mu, logvar = gallery if gallery is not None else (art.gallery_mu, art.gallery_logvar)

    def embedding(i: int) -> tuple:
        row = index(i) % len(mu)
        noise = np.random.default_rng(zlib.crc32(key(i).encode())).standard_normal(mu.shape[1])
        body = {
            "mu": np.round(mu[row] + 0.1 * noise, 5).tolist(),
            "logvar": np.round(logvar[(row + 1) % len(mu)], 5).tolist(),
            "gallery": "image",
            **options,
        }
        return "POST", "/search/embedding", json.dumps(body).encode(), JSON

    return embedding


# ----- running cells -------------------------------------------------------------------------


async def _drive(url: str, cell: Cell, make, args) -> tuple:
    """Run one cell's load; (records, window start, window end)."""

    async def load(send) -> tuple:
        if cell.rate:
            return await open_loop(send, make, cell.rate, args.warmup, args.open_duration)
        return await closed_loop(
            send, make, cell.concurrency, args.warmup, args.duration, cell.concurrency
        )

    connections = max(cell.concurrency, 256)
    if args.client == "httpx":
        limits = httpx.Limits(max_connections=connections)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
            return await load(httpx_sender(client))
    host, port = url.removeprefix("http://").split(":")
    client = RawHttpClient(host, int(port), connections)
    try:
        return await load(client.send)
    finally:
        await client.close()


def server_cpu_seconds(process: psutil.Process) -> dict[int, float]:
    """User + system CPU seconds of the server and each of its processes (uvicorn's workers
    are its children), by pid."""
    seconds = {}
    for member in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            seconds[member.pid] = sum(member.cpu_times()[:2])
    return seconds


def measure(url: str, process: psutil.Process, cell: Cell, make, args) -> Measured:
    cpu_client, cpu_server = time.process_time(), server_cpu_seconds(process)
    wall = time.perf_counter()
    records, start, end = asyncio.run(_drive(url, cell, make, args))
    wall = time.perf_counter() - wall
    used = server_cpu_seconds(process)
    measured = Measured(
        summarise(records, start, end),
        (time.process_time() - cpu_client) / wall,
        sum(used[pid] - cpu_server.get(pid, 0.0) for pid in used) / wall,
    )
    s = measured.summary
    print(
        f"  {label(cell):<58} n={s.count:<6} p50={s.p50:7.2f} p99={s.p99:7.2f} "
        f"qps={s.qps:7.1f} err={s.errors} {s.error_statuses or ''}",
        flush=True,
    )
    return measured


def label(cell: Cell) -> str:
    load = "c=" + str(cell.concurrency) if not cell.rate else f"{cell.rate:g}/s offered"
    metric = f" {cell.metric}" if cell.metric else ""
    bg = " +bg" if cell.background else ""
    return f"[{cell.server.name}{bg}] {cell.endpoint}{metric} L={cell.draws} {cell.cache} {load}"


def run_all(args: argparse.Namespace, plan: dict[str, list[Cell]], state: RunState) -> None:
    """Start each server once and run its cells (and the raw parts of its thread setting);
    then the comparison cells in rounds, their servers all up and taking turns."""
    logs = args.work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    art = demo_artifacts(args.demo_dir, args.quick, args.plan)
    unique = list(dict.fromkeys(cell for cells in plan.values() for cell in cells))
    compared = [c for c in unique if any(c in plan.get(n, []) for n in COMPARED)]
    compared = compared if args.rounds else []
    with redis_server(logs) as redis_url:
        context = ServerContext(args, art, redis_url, logs, state, secrets.token_hex(4))
        for config in dict.fromkeys(cell.server for cell in unique):
            own = [c for c in unique if c.server == config and c not in compared]
            needs_raw = not config.gallery and config not in BATCH_VARIANTS
            with context.started(config) if own else contextlib.nullcontext() as up:
                for background in sorted({c.background for c in unique if c.server == config}):
                    with background_load(background):
                        if needs_raw:
                            setting = dict(config.env).get("PROBSEARCH_THREADS", "default")
                            state.raw[(setting, background)] = raw_parts(
                                context.env(config), art, setting, args.raw_iterations
                            )
                        for cell in own:
                            if cell.background == background:
                                state.cells[cell] = context.measure(*up[:2], cell)
                        if needs_raw and own and "main" in plan:
                            state.overhead[(setting, background)] = measure_overhead_rounds(
                                up[0], context.env(config), raw_spec(art, setting, 0),
                                max(args.rounds, 1), args.warmup, args.duration,
                                f"{context.nonce}{setting}{int(background)}",
                            )  # fmt: skip
                if up is not None:  # a thread setting shows in the server's thread count
                    state.server_threads[config.name] = up[1].num_threads()
        if compared:
            run_rounds(context, compared)


# Scenarios whose cells are measured in rounds.
COMPARED = ("threads", "batching", "window", "concurrency")


def run_rounds(context: ServerContext, cells: list[Cell]) -> None:
    """Every server of `cells` up at once; in each round every cell once, the order rotated
    round by round, so a drift of the shared machine reaches every server alike; each figure
    is its median over the rounds (combine_rounds)."""
    rounds: dict[Cell, list[Measured]] = {cell: [] for cell in cells}
    with contextlib.ExitStack() as stack:
        up = {
            config: stack.enter_context(context.started(config))
            for config in dict.fromkeys(cell.server for cell in cells)
        }
        for background in sorted({cell.background for cell in cells}):
            batch = [cell for cell in cells if cell.background == background]
            with background_load(background):
                for number in range(context.args.rounds):
                    shift = number % len(batch)
                    for cell in batch[shift:] + batch[:shift]:
                        url, process, _ = up[cell.server]
                        rounds[cell].append(context.measure(url, process, cell))
        for config, (_, process, _) in up.items():
            context.state.server_threads[config.name] = process.num_threads()
    for cell, measured in rounds.items():
        context.state.cells[cell] = combine_rounds(measured)


def combine_rounds(rounds: list[Measured]) -> Measured:
    """Median of each figure over the rounds; counts and errors summed."""
    summaries = [m.summary for m in rounds]
    statuses: dict[int, int] = {}
    for s in summaries:
        for status, count in s.error_statuses.items():
            statuses[status] = statuses.get(status, 0) + count

    def median(name: str) -> float:
        return float(np.median([getattr(s, name) for s in summaries]))

    summary = Summary(
        count=sum(s.count for s in summaries),
        errors=sum(s.errors for s in summaries),
        error_statuses=statuses,
        **{name: median(name) for name in ("p50", "p95", "p99", "mean", "qps", "hit_fraction")},
    )
    return Measured(
        summary,
        float(np.median([m.client_cpu for m in rounds])),
        float(np.median([m.server_cpu for m in rounds])),
        tuple(summaries),
    )


@dataclass
class ServerContext:
    """What starting a server and measuring a cell on it need."""

    args: argparse.Namespace
    art: Artifacts
    redis_url: str
    logs: Path
    state: RunState
    nonce: str
    galleries: dict[str, tuple] = field(default_factory=dict)  # server name -> its queries
    measured: int = 0  # cells so far: each gets requests no other cell sends

    def env(self, config: ServerConfig) -> dict[str, str]:
        return server_env(config, dict(setting_env(s) for s in self.args.setting), self.redis_url)

    @contextlib.contextmanager
    def started(self, config: ServerConfig) -> Iterator[tuple]:
        """The server of `config`, warmed up: (url, process, synthetic gallery queries)."""
        index_root = self.art.index_root
        if config.gallery:
            index_root = synthetic_gallery(
                self.args.work_dir,
                self.art.model,
                self.args.gallery_size,
                tuple(self.args.gallery_metrics),
            )
            self.galleries[config.name] = gallery_queries(index_root)
        env = self.env(config)
        self.state.servers[config.name] = {k: v for k, v in env.items() if k.startswith("PROB")}
        log_path = self.logs / f"server-{config.name.replace('=', '-')}.log"
        begun = time.perf_counter()
        with server(env, self.art.model, index_root, log_path) as (url, process):
            print(f"server {config.name} ready in {time.perf_counter() - begun:.1f} s")
            gallery = self.galleries.get(config.name)
            warm_up(url, config, self.art, gallery, self.args, f"{self.nonce}w{self.measured}")
            yield url, process, gallery

    def measure(self, url: str, process: psutil.Process, cell: Cell) -> Measured:
        self.measured += 1
        gallery = self.galleries.get(cell.server.name)
        make = request_maker(cell, self.art, gallery, f"{self.nonce}c{self.measured}")
        return measure(url, process, cell, make, self.args)


def warm_up(url: str, config: ServerConfig, art: Artifacts, gallery, args, nonce: str) -> None:
    """Unmeasured load on a fresh server before its first cell, split over its endpoints.

    Takes first-use costs (lazy imports, the first allocations of ONNX Runtime's and torch's
    arenas, cold caches) out of every server's first cell. On the idle machine the first
    server a run started measured 20-35% slower at c=1 than the next, whichever setting it
    had; on a loaded machine (cells +-10%) neither order nor this warm-up showed an effect.
    """
    if args.server_warmup <= 0:
        return
    endpoints = ("embedding",) if config.gallery else ENDPOINTS
    share = argparse.Namespace(
        **{**vars(args), "warmup": 0.0, "duration": args.server_warmup / len(endpoints)}
    )
    for endpoint in endpoints:
        cell = Cell(config, endpoint, 16, "miss", 4)
        make = request_maker(cell, art, gallery, f"{nonce}{endpoint}")
        asyncio.run(_drive(url, cell, make, share))


def setting_env(setting: str) -> tuple[str, str]:
    name, sep, value = setting.partition("=")
    if not sep:
        raise SystemExit(f"--setting takes NAME=VALUE, e.g. batch_max_wait_ms=0; got {setting!r}")
    return f"PROBSEARCH_{name.upper()}", value


# ----- raw parts (a process of their own, with the server's environment) ---------------------


def raw_spec(art: Artifacts, threads: str, iterations: int) -> dict:
    """What the raw-parts process needs (service_bench_parts)."""
    return {
        "model": str(art.model),
        "index_root": str(art.index_root),
        "captions": art.captions[:200],
        "threads": threads,
        "iterations": iterations,
    }


def raw_parts(env: dict[str, str], art: Artifacts, threads: str, iterations: int) -> dict:
    """Time the parts of a text query in a fresh process with the server's environment."""
    spec = raw_spec(art, threads, iterations)
    command = [sys.executable, str(Path(__file__).resolve()), "--raw-parts", json.dumps(spec)]
    out = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RAW ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"the raw-parts process failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][4:])


def raw_parts_main(spec: dict) -> None:
    """Build the server's services from the environment, then time one text query's parts."""
    from service_bench_parts import time_parts

    print("RAW " + json.dumps(time_parts(spec)), flush=True)


# ----- entry point -----------------------------------------------------------------------------


def main() -> None:
    args = parse_args()
    if args.raw_parts:
        raw_parts_main(json.loads(args.raw_parts))
        return
    if args.raw_parts_serve:
        from service_bench_parts import serve_queries

        reply = lambda line: print(PREFIX + line, flush=True)  # noqa: E731
        serve_queries(json.loads(args.raw_parts_serve), sys.stdin, reply)
        return
    from service_bench_report import write_report

    load_start, started = os.getloadavg(), time.perf_counter()
    plan = plan_cells(args)
    state = RunState(notes=list(args.note))
    try:
        run_all(args, plan, state)
    finally:
        if state.cells:
            write_report(args, plan, state, load_start, time.perf_counter() - started)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: the small demo plan, 1 s cells, c=1,16"
    )
    parser.add_argument(
        "--plan", choices=("shapes", "clipart"), default="shapes",
        help="the demo served: the shapes lab, or clip art with heads on pretrained backbones",
    )  # fmt: skip
    parser.add_argument(
        "--scenarios",
        default=DEFAULT_SCENARIOS,
        help=f"comma-separated of {', '.join(SCENARIOS)}, or all",
    )
    parser.add_argument("--concurrency", help="closed-loop levels of main (default 1,4,16,64)")
    parser.add_argument("--duration", type=float, help="measured seconds per cell (default 10)")
    parser.add_argument("--warmup", type=float, help="unmeasured seconds per cell (default 2)")
    parser.add_argument(
        "--server-warmup",
        type=float,
        help="unmeasured seconds of load on each server before its first cell (default 10)",
    )
    parser.add_argument(
        "--open-duration",
        type=float,
        help="measured seconds of the open-loop cell (default 3 x duration)",
    )
    parser.add_argument("--rate", type=float, default=100.0, help="open-loop offered QPS")
    parser.add_argument(
        "--threads", help="PROBSEARCH_THREADS values of the threads scenario (1,2,default)"
    )
    parser.add_argument(
        "--background-load",
        nargs="?",
        const="on",
        default="off",
        choices=("off", "on", "both"),
        help="a busy-loop process per CPU during the cells",
    )
    parser.add_argument("--gallery-size", type=int, help="synthetic gallery (default 1000000)")
    parser.add_argument("--gallery-metrics", default="w2,kl")
    parser.add_argument("--raw-iterations", type=int, help="raw-parts queries (default 300)")
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a service setting for every server, e.g. batch_max_wait_ms=0",
    )
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "service_bench")
    parser.add_argument(
        "--demo-dir",
        type=Path,
        help="build_demo cache (default WORK_DIR/small or /full); "
        "e.g. .cache/demo to reuse the demo's",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/service_bench.md")
    parser.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="HTTP client of the load generator (httpx: slow at high concurrency)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of the threads and batching cells, their servers taking turns; each "
        "figure is the median over rounds (0: one pass, server after server)",
    )
    parser.add_argument("--note", action="append", default=[], help="a line for the report")
    parser.add_argument("--raw-parts", help=argparse.SUPPRESS)
    parser.add_argument("--raw-parts-serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    quick = args.quick
    defaults = {
        "concurrency": "1,16" if quick else "1,4,16,64",
        "duration": 1.0 if quick else 10.0,
        "warmup": 0.3 if quick else 2.0,
        "server_warmup": 3.0 if quick else 10.0,
        "gallery_size": 20_000 if quick else 1_000_000,
        "raw_iterations": 40 if quick else 300,
        "threads": "1,default" if quick else "1,2,default",
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.open_duration is None:
        args.open_duration = 3 * args.duration
    args.concurrency = [int(c) for c in str(args.concurrency).split(",")]
    args.threads = args.threads.split(",")
    args.gallery_metrics = args.gallery_metrics.split(",")
    chosen = SCENARIOS if args.scenarios == "all" else tuple(args.scenarios.split(","))
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    args.scenarios = [s for s in SCENARIOS if s in chosen]
    if args.demo_dir is None:
        name = "clipart" if args.plan == "clipart" else "small" if quick else "full"
        args.demo_dir = args.work_dir / name
    args.command = shlex.join([Path(sys.executable).name, *sys.argv])
    return args


if __name__ == "__main__":
    # Run as the module `service_bench`, the one its helpers import (not a second copy whose
    # Cell class would differ from theirs).
    import service_bench

    service_bench.main()
