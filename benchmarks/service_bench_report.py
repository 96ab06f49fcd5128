"""The Markdown report of benchmarks/service_bench.py: setup, issue 13's targets, one table per
scenario, the raw parts and the overhead ratio."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import subprocess
from dataclasses import replace
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
from service_bench import (
    DEFAULT_SERVER,
    ROOT,
    UNBATCHED_SERVER,
    Cell,
    Measured,
    RunState,
    thread_server,
)

CLIENTS = {
    "raw": "one asyncio HTTP/1.1 keep-alive client (load_generator.RawHttpClient)",
    "httpx": "one httpx.AsyncClient (slow past a few connections: encode/httpx#3215)",
}
PARTS = ("encode", "shortlist", "rerank", "uncertainty", "metadata")
SCENARIO_TITLES = {
    "main": "Endpoints x draws x cache x concurrency (shipped settings)",
    "threads": "Thread setting sweep (PROBSEARCH_THREADS), text with 16 draws, cache misses",
    "batching": "Micro-batching off (batch_max_size=1) vs on (default), text with 16 draws",
    "window": "Batcher window: 5 ms under load (batch_max_wait_ms=5) vs none (default), "
    "text with 16 draws, cache misses",
    "concurrency": "Batches at once: one (batch_concurrency=1) vs the default (CPUs // pool "
    "threads: 2 on 2 cores), 16 draws, cache misses",
    "open-loop": "Offered rate (open loop, Poisson arrivals), text with 16 draws, cache misses",
    "gallery": "Synthetic gallery through /search/embedding, cache misses",
}


def threads_verdict(found: dict[str, Measured], what: str) -> tuple[str, bool]:
    """Whether the shipped threads are within 10% of the best setting (p50: lower is better,
    QPS: higher), and the figures. Settings measured in rounds show each one's range over
    them; where the median misses by more than 10% but the default's range overlaps the
    best's, the gap is inside the rounds' spread: no difference."""
    name, digits, unit = ("p50", 2, " ms") if what == "p50" else ("qps", 1, "")
    figure = {s: getattr(m.summary, name) for s, m in found.items()}
    if what == "p50":
        best = min(found, key=figure.__getitem__)
        ok = figure["default"] <= 1.1 * figure[best]
    else:
        best = max(found, key=figure.__getitem__)
        ok = figure["default"] >= figure[best] / 1.1

    def shown(setting: str) -> str:
        spread = [getattr(r, name) for r in found[setting].rounds]
        span = f" ({fmt(min(spread), digits)}-{fmt(max(spread), digits)})" if spread else ""
        return f"{fmt(figure[setting], digits)}{unit}{span}"

    value = f"default {shown('default')}, best {best} {shown(best)}"
    if ok or not found["default"].rounds or not found[best].rounds:
        return value, ok
    default_span = [getattr(r, name) for r in found["default"].rounds]
    best_span = [getattr(r, name) for r in found[best].rounds]
    overlap = min(default_span) <= max(best_span) and min(best_span) <= max(default_span)
    if overlap:
        value += "; the gap is inside the rounds' spread: no difference"
    return value, overlap


def fmt(value: float, digits: int = 1) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def machine() -> str:
    cpu = platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []:
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    from models.threads import available_cpus

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{cpu}; {os.cpu_count()} logical CPUs, {available_cpus()} usable by this process;"
        f" {ram:.0f} GiB RAM; {platform.platform()}"
    )


def versions() -> str:
    found = []
    for name in ("torch", "onnxruntime", "faiss-cpu", "fastapi", "uvicorn", "httpx", "redis"):
        with contextlib.suppress(PackageNotFoundError):
            found.append(f"{name} {version(name)}")
    try:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
        found.append("redis-server " + out.stdout.split()[2].removeprefix("v="))
    except (OSError, IndexError):
        pass
    return f"Python {platform.python_version()}; " + ", ".join(found)


def gpu_line() -> str:
    import torch

    if torch.cuda.is_available():
        return f"GPU: {torch.cuda.get_device_name(0)} (device auto: the server may use it)"
    return "GPU: none available; everything ran on the CPU"


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout

    dirty = " (with uncommitted changes)" if git("status", "--porcelain").strip() else ""
    return git("rev-parse", "--short", "HEAD").strip() + dirty


def errors(s) -> str:
    """ "3 (503: 2, none: 1)": the count, then by status (none: no answer)."""
    if not s.errors:
        return "0"
    kinds = ", ".join(f"{k or 'none'}: {v}" for k, v in sorted(s.error_statuses.items()))
    return f"{s.errors} ({kinds})"


def row(cell: Cell, m: Measured) -> str:
    s = m.summary
    load = str(cell.concurrency) if not cell.rate else f"{cell.rate:g}/s"
    hit = "" if math.isnan(s.hit_fraction) else f"{100 * s.hit_fraction:.0f}"
    return (
        f"| {cell.server.name} | {'on' if cell.background else 'off'} | {cell.endpoint} |"
        f" {cell.metric or ''} | {cell.draws} | {cell.cache} | {load} | {s.count} | {errors(s)}"
        f" | {hit} | {fmt(s.p50, 2)} | {fmt(s.p95, 2)} | {fmt(s.p99, 2)} | {fmt(s.qps)} |"
        f" {fmt(m.client_cpu, 2)} | {fmt(m.server_cpu, 2)} |"
    )


TABLE_HEAD = [
    "| server | bg load | endpoint | metric | draws | cache | c / rate | n | errors | hit % |"
    " p50 ms | p95 ms | p99 ms | QPS | client CPU | server CPU |",
    "| --- | --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    " ---: | ---: | ---: |",
]


def raw_table(state: RunState) -> list[str]:
    lines = [
        "| threads | bg load | draws | metric | encode | shortlist | rerank | uncertainty |"
        " metadata | sum p50 | sum p95 | whole searcher p50 |"
        " threads in use (torch/interop/faiss/onnx) |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for (setting, background), raw in sorted(state.raw.items()):
        t = raw["threads"]
        used = (
            f"{t['torch']}/{t['torch_interop']}/{t['faiss']}/{t['onnx_intra_op'] or 'ORT default'}"
        )
        for draws in ("L=16", "L=0"):
            r = raw[draws]
            parts = " | ".join(fmt(r["parts_p50"][p], 3) for p in PARTS)
            lines.append(
                f"| {setting} | {'on' if background else 'off'} | {draws[2:]} |"
                f" {r['metric']} | {parts} | {fmt(r['total_p50'], 3)} |"
                f" {fmt(r['total_p95'], 3)} | {fmt(r.get('searcher_p50'), 3)} | {used} |"
            )
    return lines


def overhead_ratios(state: RunState) -> list[tuple[str, bool, float, float, float, float]]:
    """(threads, background, service p50, raw p50, no-op p50, ratio) wherever all three exist."""
    out = []
    for (setting, background), raw in sorted(state.raw.items()):
        server = thread_server(setting)
        text = state.cells.get(Cell(server, "text", 16, "miss", 1, background=background))
        noop = state.cells.get(Cell(server, "noop", 0, "miss", 1, background=background))
        if text and noop:
            parts, base = raw["L=16"]["total_p50"], noop.summary.p50
            out.append(
                (
                    setting,
                    background,
                    text.summary.p50,
                    parts,
                    base,
                    text.summary.p50 / (parts + base),
                )
            )
    return out


def overhead_table(state: RunState) -> list[str]:
    """The overhead ratio from cells and raw parts taken in rounds (service_bench_overhead)."""
    if not state.overhead:
        return []
    lines = [
        "### Overhead ratio, in rounds",
        "",
        "Per round: a c=1 text-search cell (16 draws, every caption new), a c=1 no-op cell"
        " (same warm-up and duration as the cells above) and a block of raw-parts queries"
        " timed back to back in a process of their own, in an order rotated by one each round"
        " (benchmarks/service_bench_overhead.py). Each figure is taken hot, in a loop of its"
        " own, as above; the rounds make the machine's drift reach all three alike. Figures:"
        " median over the rounds (min-max in brackets). The target is checked on these.",
        "",
        "| threads | bg load | rounds | service p50 ms | raw parts p50 ms | whole searcher p50 ms"
        " | no-op p50 ms | ratio | ratio per round | service - searcher - no-op ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]

    def spread(values: list[float], digits: int) -> str:
        return f"{fmt(float(np.median(values)), digits)} ({fmt(min(values), digits)}-" + (
            f"{fmt(max(values), digits)})"
        )

    for (setting, background), o in sorted(state.overhead.items()):
        rest = o.median("service") - o.median("searcher") - o.median("noop")
        per_round = ", ".join(f"{r:.2f}" for r in o.round_ratios())
        lines.append(
            f"| {setting} | {'on' if background else 'off'} | {len(o.service)} |"
            f" {spread(o.service, 2)} | {spread(o.raw, 3)} | {spread(o.searcher, 3)} |"
            f" {spread(o.noop, 3)} | {o.ratio:.2f} | {per_round} | {fmt(rest, 2)} |"
        )
    return [*lines, ""]


def checks(args, state: RunState) -> list[str]:
    """issue 13's "done when" lines, each with what this run measured."""

    def get(cell: Cell) -> Measured | None:
        """The cell's measurement if it measured any request."""
        measured = state.cells.get(cell)
        return measured if measured is not None and measured.summary.count > 0 else None

    lines = ["| target (issue 13) | measured | met |", "| --- | --- | --- |"]

    def add(target: str, measured: str, met: bool | None) -> None:
        lines.append(
            f"| {target} | {measured} | {'n/a' if met is None else 'yes' if met else 'NO'} |"
        )

    text16 = Cell(DEFAULT_SERVER, "text", 16)
    for background in (False, True):
        bg = " (background load)" if background else ""
        for c, what in ((1, "p50"), (16, "QPS")):
            found = {
                s: get(
                    replace(text16, server=thread_server(s), concurrency=c, background=background)
                )
                for s in args.threads
            }
            found = {s: m for s, m in found.items() if m}
            if "default" not in found or len(found) < 2:
                continue
            value, ok = threads_verdict(found, what)
            add(f"shipped threads within 10% of the best, c={c} {what}{bg}", value, ok)
    rounds = state.overhead.get(("default", False))
    if rounds is not None:
        add(
            f"text 16 draws: p50 at c=1 <= 1.5 x (raw parts + no-op p50), {len(rounds.service)}"
            " rounds",
            f"{fmt(rounds.median('service'), 2)} / ({fmt(rounds.median('raw'), 2)} +"
            f" {fmt(rounds.median('noop'), 2)}) = {rounds.ratio:.2f}x",
            rounds.ratio <= 1.5,
        )
    for setting, background, service, parts, base, ratio in overhead_ratios(state):
        if setting == "default" and not background:
            add(
                "same, from the cells above and the raw-parts loop (once each, minutes apart)",
                f"{fmt(service, 2)} / ({fmt(parts, 2)} + {fmt(base, 2)}) = {ratio:.2f}x",
                ratio <= 1.5,
            )
    m = get(replace(text16, concurrency=16))
    if m:
        add("text 16 draws: >= 300 QPS at c=16", fmt(m.summary.qps), m.summary.qps >= 300)
    m = get(replace(text16, concurrency=0, rate=args.rate))
    if m:
        add(
            f"text 16 draws: p99 <= 50 ms at an offered {args.rate:g} QPS",
            f"p99 {fmt(m.summary.p99, 2)} ms, {fmt(m.summary.qps)} QPS served",
            m.summary.p99 <= 50,
        )
    on1, off1 = get(replace(text16, concurrency=1)), get(Cell(UNBATCHED_SERVER, "text", 16))
    if on1 and off1:
        add(
            "batching on: c=1 p50 within 10% of batching off",
            f"on {fmt(on1.summary.p50, 2)} ms, off {fmt(off1.summary.p50, 2)} ms",
            on1.summary.p50 <= 1.1 * off1.summary.p50,
        )
    on64 = get(replace(text16, concurrency=64))
    off64 = get(Cell(UNBATCHED_SERVER, "text", 16, concurrency=64))
    if on64 and off64:
        add(
            "batching on: c=64 QPS >= 1.5 x batching off",
            f"on {fmt(on64.summary.qps)}, off {fmt(off64.summary.qps)}",
            on64.summary.qps >= 1.5 * off64.summary.qps,
        )
    for cell, m in state.cells.items():
        if (
            cell.server.gallery
            and cell.concurrency == 1
            and cell.draws == 16
            and not cell.background
        ):
            add(
                f"{args.gallery_size} Gaussians, {cell.metric}: service p50 <= 25 ms at c=1",
                f"{fmt(m.summary.p50, 2)} ms",
                m.summary.p50 <= 25 if args.gallery_size >= 10**6 else None,
            )
    return lines


def rounds_line(args) -> str:
    """How the cells of the threads, batching and window scenarios were measured."""
    if not args.rounds:
        return "- rounds: none; each server's cells ran in one pass, one server after another"
    return (
        f"- rounds: the cells of the threads, batching and window scenarios ran in {args.rounds}"
        " rounds"
        " with all their servers up, each round in an order rotated by one cell, so a drift"
        " of the shared machine reaches every setting alike; their figures are medians over"
        " the rounds (n and errors: sums); a shipped-defaults cell they share with main is"
        " that median too"
    )


def write_report(args, plan: dict[str, list[Cell]], state: RunState, load_start, wall_s) -> None:
    load_end = os.getloadavg()
    lines = [
        "# Service benchmark",
        "",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}; commit {commit()}",
        f"- command: `{args.command}`",
        f"- machine: {machine()}",
        f"- {versions()}",
        f"- {gpu_line()}",
        f"- load average (1/5/15 min) at start: {' / '.join(f'{x:.2f}' for x in load_start)};"
        f" at end: {' / '.join(f'{x:.2f}' for x in load_end)}; wall time {wall_s / 60:.1f} min",
        f"- artifacts: demo build in `{args.demo_dir}` ({_plan_name(args)})",
        f"- each server: {args.server_warmup:g} s of unmeasured load (text, image, embedding;"
        " 16 draws, c=4) after it is ready and before its first cell",
        f"- cells: {args.warmup:g} s warm-up, then {args.duration:g} s measured (open loop:"
        f" {args.open_duration:g} s); closed loop = c clients each sending its next request when"
        " the last is answered; latency percentiles over the requests started in the measured"
        " window, QPS = successful completions in it per second",
        f"- client: {CLIENTS[args.client]} in the benchmark's process, on the same machine (its"
        " CPU is the client CPU column, in cores); server CPU likewise, for the server process",
        rounds_line(args),
        "- cache: `miss` cells send distinct requests (text, image bytes or mu differ), `hit`"
        " cells repeat one; hit % is the share answered with X-Cache: hit",
        "- servers (PROBSEARCH_* each one ran with; Redis on a free port, db 0 demo / db 1"
        " gallery):",
    ]
    for name, env in state.servers.items():
        shown = ", ".join(f"{k}={v}" for k, v in sorted(env.items()) if k != "PROBSEARCH_REDIS_URL")
        threads = state.server_threads.get(name)
        running = f" ({threads} OS threads after its cells)" if threads else ""
        lines.append(f"  - {name}: {shown or 'shipped defaults'}{running}")
    lines += [f"- note: {note}" for note in state.notes]
    lines += ["", "## Issue 13 targets", "", *checks(args, state), ""]
    if state.raw:
        lines += [
            "## Raw parts of one text query (ms, p50 per part)",
            "",
            f"Timed in a process of their own with each server's environment, on the"
            f" objects service.http.main.build_services makes; {args.raw_iterations} queries"
            " after 20 warm-up ones. Thread setting `default` pins nothing. The whole"
            " searcher column: after each of those queries, the same caption through"
            " Searcher.search_batch (the parts and the searcher's own bookkeeping), so that"
            " service - no-op - whole searcher is what the search route adds (request body,"
            " cache lookup, response).",
            "",
            *raw_table(state),
            "",
        ]
        ratios = overhead_ratios(state)
        if ratios:
            lines += [
                "### Overhead ratio: service text p50 at c=1 (16 draws, cache miss) /"
                " (raw parts p50 + no-op GET /healthz p50)",
                "",
                "| threads | bg load | service p50 ms | raw parts p50 ms | no-op p50 ms | ratio |",
                "| --- | --- | ---: | ---: | ---: | ---: |",
            ]
            lines += [
                f"| {s} | {'on' if b else 'off'} | {fmt(v, 2)} | {fmt(p, 3)} |"
                f" {fmt(n, 3)} | {r:.2f} |"
                for s, b, v, p, n, r in ratios
            ]
            lines.append("")
        lines += overhead_table(state)
    for name, cells in plan.items():
        lines += [f"## {name}: {SCENARIO_TITLES[name]}", "", *TABLE_HEAD]
        lines += [row(cell, state.cells[cell]) for cell in cells if cell in state.cells]
        lines.append("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")


def _plan_name(args) -> str:
    """The demo plan the artifacts were built with (probsearch.demo)."""
    if getattr(args, "plan", "shapes") == "clipart":
        return "CLIPART_PLAN: clip art, heads on the pretrained backbones"
    return "SMALL_PLAN" if args.quick else "SHAPES_PLAN"
