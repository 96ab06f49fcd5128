"""The measured inputs of the 1B plan, read from the benchmark records in benchmarks/results/.

Every input keeps where it came from (file, command, machine, load average), and a missing
file, table, row or provenance line is a MissingInputError naming the benchmark to run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SHARD_FILE = "index_bench_shard.md"  # index_bench.py, w2 IVF-SQ8, one thread, 1M and 5M
INDEX_FILE = "index_bench.md"  # index_bench.py at 1M: bytes/item per index type
GPU_FILE = "gpu_check.md"  # gpu_check.py: re-rank and uncertainty scores, CUDA and CPU
RAY_FILE = "ray_reindex.md"  # ray_reindex.py: images/s per encoder actor
SERVICE_FILE = "service_bench.md"  # service_bench.py: the API (encode, re-rank, scores) per pod
API_P99_BUDGET_MS = 50.0  # the API pod's share of the 100 ms p99: half


class MissingInputError(ValueError):
    """A measured input of the plan is not in benchmarks/results/."""


@dataclass(frozen=True)
class Source:
    """Where a measured figure comes from."""

    file: str
    command: str
    machine: str
    load: str


@dataclass(frozen=True)
class ShardCost:
    """One shard measured by index_bench.py: single-query latency on one core, index size."""

    items: int
    index: str
    p50_ms: float
    p95_ms: float
    bytes_per_item: float
    source: Source


@dataclass(frozen=True)
class ApiPoint:
    """The API pod's operating point: text queries, 16 draws, cache misses, closed loop."""

    concurrency: int
    qps: float
    p99_ms: float
    cores: int
    source: Source


@dataclass(frozen=True)
class Inputs:
    """Everything the plan takes from recorded runs."""

    shards: tuple[ShardCost, ...]  # ascending items
    bytes_per_item: dict[tuple[str, str], tuple[float, Source]]  # (metric, index) ->
    rerank_ms: dict[str, float]  # "cpu" / "gpu": exact re-rank of a 100-row shortlist, w2
    scores_ms: dict[str, float]  # "cpu" / "gpu": uncertainty scores per query, w2
    gpu_source: Source
    ray_items_per_s: float  # per encoder actor (one CPU thread)
    ray_source: Source
    api: ApiPoint


@dataclass(frozen=True)
class Section:
    """A part of a results file (its preamble or one `## ` section) with its tables."""

    text: str
    tables: list[list[dict[str, str]]]


def sections(text: str) -> list[Section]:
    """Split markdown at `## ` headings; each part's tables as lists of {column: cell}."""
    parts = re.split(r"(?m)^(?=## )", text)
    return [Section(part, _tables(part)) for part in parts if part.strip()]


def _tables(text: str) -> list[list[dict[str, str]]]:
    tables: list[list[dict[str, str]]] = []
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            tables.append([])
        elif not all(set(cell) <= set("-: ") for cell in cells):
            tables[-1].append(dict(zip(header, cells, strict=False)))
    return tables


def source_of(file: str, text: str, need_load: bool = True) -> Source:
    """The command, machine and load average a section records (all three required, except
    the load for a figure that load cannot change: an index's size)."""
    command = re.search(r"(?i)command:\s*`([^`]+)`", text) or re.search(r"```\w*\n(.+?)\n", text)
    machine = re.search(r"(?im)machine:\s*(.+?)(?:;\s*load|\.?\s*$)", text)
    averages = re.findall(r"(?i)load average([^:\n]*):\s*(\d+\.\d+(?:\s*/?\s*\d+\.\d+)*)", text)
    load = "; ".join(f"{when.strip()} {value}".strip() for when, value in averages) or (
        (re.search(r"(?i)load \(1 min\)\s*(\d+\.\d+)", text) or [None, None])[1]
        or (re.search(r"(?i)load average\s+(\d+\.\d+)", text) or [None, None])[1]
    )
    needed = (("command", command), ("machine", machine), ("load", load or not need_load))
    missing = [name for name, found in needed if not found]
    if missing:
        raise MissingInputError(f"{file}: the run records no {', '.join(missing)}")
    assert command and machine
    shown = load or "not recorded (a size, not a timing)"
    return Source(file, command[1].strip(), machine[1].strip(), shown)


def _read(results: Path, name: str, how: str) -> str:
    path = results / name
    if not path.is_file():
        raise MissingInputError(f"{path} is missing: record it with {how}")
    return path.read_text(encoding="utf-8")


def _number(row: dict[str, str], column: str, file: str) -> float:
    try:
        return float(row[column])
    except (KeyError, ValueError):
        raise MissingInputError(f"{file}: a row has no number in column {column!r}") from None


def shard_costs(results: Path) -> tuple[ShardCost, ...]:
    """The w2 IVF-SQ8 shards, one per recorded gallery size: index_bench_shard.md's runs, then
    index_bench.md's (a single query runs on one core in both: FAISS splits over queries)."""
    how = "`nice -n 10 python benchmarks/index_bench.py --n N --types ivfsq --metrics w2 --out"
    texts = [(SHARD_FILE, _read(results, SHARD_FILE, f"{how} benchmarks/results/{SHARD_FILE}`"))]
    if (results / INDEX_FILE).is_file():
        texts.append((INDEX_FILE, (results / INDEX_FILE).read_text(encoding="utf-8")))
    found: dict[int, ShardCost] = {}
    for file, text in texts:
        for section in sections(text):
            size = re.search(r"data:\s*(\d+) synthetic", section.text)
            rows = [
                r for t in section.tables for r in t
                if r.get("metric") == "w2" and r.get("index", "").endswith("ivfsq")
            ]  # fmt: skip
            if size is None or not rows or int(size[1]) in found:
                continue
            row = rows[0]
            found[int(size[1])] = ShardCost(
                int(size[1]),
                row["index"].removeprefix("auto: "),
                _number(row, "p50 ms", file),
                _number(row, "p95 ms", file),
                _number(row, "bytes/item", file),
                source_of(file, section.text),
            )
    if len(found) < 2:
        sizes = sorted(found) or "none"
        raise MissingInputError(
            f"{SHARD_FILE}: needs w2 IVF-SQ8 runs at two gallery sizes, has {sizes};"
            f" record one with {how} benchmarks/results/{SHARD_FILE}`"
        )
    return tuple(found[n] for n in sorted(found))


def index_bytes(results: Path) -> dict[tuple[str, str], tuple[float, Source]]:
    """Bytes/item per (metric, index type) from index_bench.md; the newest run wins."""
    text = _read(results, INDEX_FILE, "`python benchmarks/index_bench.py`")
    found: dict[tuple[str, str], tuple[float, Source]] = {}
    for section in sections(text):
        rows = [r for t in section.tables for r in t if "bytes/item" in r]
        if not rows:
            continue
        source = source_of(INDEX_FILE, section.text, need_load=False)
        for row in rows:
            metric = row.get("metric") or row.get("family", "")
            index = row["index"].removeprefix("auto: ")
            found.setdefault((metric, index), (_number(row, "bytes/item", INDEX_FILE), source))
    if ("w2", "ivfsq") not in found:
        raise MissingInputError(f"{INDEX_FILE}: no w2 IVF-SQ8 row")
    return found


def gpu_costs(results: Path) -> tuple[dict[str, float], dict[str, float], Source]:
    """Re-rank ms and scores ms per query (w2), CPU and CUDA, from gpu_check.md."""
    text = _read(results, GPU_FILE, "`python benchmarks/gpu_check.py` on a GPU machine")
    rows = [r for s in sections(text) for t in s.tables for r in t if r.get("metric") == "w2"]
    if not rows:
        raise MissingInputError(f"{GPU_FILE}: no w2 row")
    row = rows[0]
    queries = re.search(r"Scores: (\d+) queries", text)
    if queries is None:
        raise MissingInputError(f"{GPU_FILE}: the scores' batch size is not recorded")
    per_query = 1 / int(queries[1])
    devices = (("cpu", "CPU"), ("gpu", "CUDA"))
    rerank = {d: _number(row, f"re-rank {c} ms", GPU_FILE) for d, c in devices}
    scores = {d: per_query * _number(row, f"scores {c} ms", GPU_FILE) for d, c in devices}
    return rerank, scores, source_of(GPU_FILE, text)


def ray_rate(results: Path) -> tuple[float, Source]:
    """Images/s of one Ray encoder actor (one thread) from ray_reindex.md."""
    text = _read(results, RAY_FILE, "`python benchmarks/ray_reindex.py`")
    rows = [
        r for s in sections(text) for t in s.tables for r in t
        if r.get("engine", "").startswith("ray, 1 actor")
    ]  # fmt: skip
    if not rows:
        raise MissingInputError(f"{RAY_FILE}: no 'ray, 1 actor' row")
    return _number(rows[0], "images/s", RAY_FILE), source_of(RAY_FILE, text)


def api_point(results: Path) -> ApiPoint:
    """The busiest closed-loop cell of the shipped server (text, 16 draws, misses, no background
    load) whose p99 stays within API_P99_BUDGET_MS, from service_bench.md."""
    text = _read(results, SERVICE_FILE, "`python benchmarks/service_bench.py`")
    cores = re.search(r"(\d+) usable by this process", text)
    if cores is None:
        raise MissingInputError(f"{SERVICE_FILE}: the CPUs the server had are not recorded")
    cells = [
        r for s in sections(text) for t in s.tables for r in t
        if (r.get("server"), r.get("bg load"), r.get("endpoint"), r.get("draws"), r.get("cache"))
        == ("default", "off", "text", "16", "miss") and r.get("c / rate", "").isdigit()
    ]  # fmt: skip
    within = [r for r in cells if _number(r, "p99 ms", SERVICE_FILE) <= API_P99_BUDGET_MS]
    if not within:
        raise MissingInputError(
            f"{SERVICE_FILE}: no text/16-draw/miss cell with p99 <= {API_P99_BUDGET_MS:g} ms"
        )
    best = max(within, key=lambda r: _number(r, "QPS", SERVICE_FILE))
    return ApiPoint(
        int(best["c / rate"]),
        _number(best, "QPS", SERVICE_FILE),
        _number(best, "p99 ms", SERVICE_FILE),
        int(cores[1]),
        source_of(SERVICE_FILE, text),
    )


def load_inputs(results: Path) -> Inputs:
    """Every measured input of the plan from the results dir."""
    rerank, scores, gpu_source = gpu_costs(results)
    rate, ray_source = ray_rate(results)
    return Inputs(
        shard_costs(results), index_bytes(results), rerank, scores, gpu_source, rate, ray_source,
        api_point(results),
    )  # fmt: skip
