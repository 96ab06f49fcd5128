"""Per-query cost of Searcher.search_batch at several batch sizes, in-process (no HTTP, no batcher).

Builds the server's services (service.http.main.build_services) on a demo build (benchmarks/
service_bench.py's work dir), then runs batches of B distinct text queries through
Searcher.search_batch: wall ms per query for each B, and with --profile a cProfile breakdown
(cumulative ms per query of the pipeline's stages). The code under test is whatever PYTHONPATH
names first, so the same script times two checkouts:

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/searcher_profile.py \
        --demo-dir runs/service_bench/full --batch-sizes 1,16 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from pathlib import Path

import numpy as np

from models.settings import Settings
from service.http.main import build_services
from service.metrics import ServiceMetrics
from service.searcher import Query, SearchParams
from service.services import Services

# Functions whose cumulative time is reported (file suffix, function name).
STAGES = (
    ("searcher.py", "search_batch"),
    ("encoder_runtime.py", "encode_texts"),
    ("store.py", "shortlist"),
    ("rerank.py", "exact_rerank"),
    ("rerank.py", "rerank_batch"),
    ("query_scores.py", "score_shortlists"),
    ("searcher.py", "_outcome"),
    ("searcher.py", "_hits"),
    ("outcome.py", "hit_lists"),
    ("store.py", "metadata"),
)


def make_queries(params: SearchParams, captions: list[str], batch: int, offset: int) -> list[Query]:
    """`batch` distinct text queries with these options."""
    return [
        Query(
            kind="text",
            gallery="image",
            params=params,
            seed=offset + i,
            text=f"{captions[(offset + i) % len(captions)]} q{offset + i}",
        )
        for i in range(batch)
    ]


def _params(services: Services, args) -> SearchParams:
    """k=10, the default metric and shortlist, args.draws draws."""
    return services.searcher.params("image", k=10, mc_samples=args.draws)


def time_batches(services: Services, captions: list[str], batch: int, args) -> float:
    """Median wall ms per query over args.rounds batches of `batch` queries."""
    per_query = []
    for round_ in range(args.warmup + args.rounds):
        queries = make_queries(_params(services, args), captions, batch, round_ * batch)
        start = time.perf_counter()
        outcomes = services.searcher.search_batch(queries)
        elapsed = time.perf_counter() - start
        failed = [o for o in outcomes if isinstance(o, Exception)]
        if failed:
            raise failed[0]
        if round_ >= args.warmup:
            per_query.append(1000 * elapsed / batch)
    return float(np.median(per_query))


def profile_batches(services: Services, captions: list[str], batch: int, args) -> dict:
    """Cumulative ms per query of each stage (STAGES) under cProfile, and the top functions."""
    queries = [
        make_queries(_params(services, args), captions, batch, 10_000 + r * batch)
        for r in range(args.rounds)
    ]
    profiler = cProfile.Profile()
    profiler.enable()
    for batch_queries in queries:
        services.searcher.search_batch(batch_queries)
    profiler.disable()
    stats = pstats.Stats(profiler)
    count = batch * args.rounds
    stages = {}
    for (path, _, name), (_, _, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        for suffix, wanted in STAGES:
            if name == wanted and path.endswith(suffix):
                stages[f"{suffix}:{name}"] = round(1000 * cumulative / count, 4)
    top = sorted(stats.stats.items(), key=lambda item: -item[1][2])[: args.top]  # type: ignore[attr-defined]
    own = {
        f"{Path(path).name}:{line}:{name}": round(1000 * total / count, 4)
        for (path, line, name), (_, _, total, _, _) in top
    }
    return {"stages_ms_per_query": stages, "own_time_ms_per_query": own}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-dir", type=Path, required=True)
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--draws", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="timing passes, alternating B")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    settings = Settings(
        model=args.demo_dir / "model", index_root=args.demo_dir / "indexes", galleries=["image"]
    )
    services = build_services(settings, ServiceMetrics())
    lines = (args.demo_dir / "data" / "captions.jsonl").read_text().splitlines()
    captions = [c["text"] for c in map(json.loads, lines)]
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    try:
        timings: dict[int, list[float]] = {b: [] for b in sizes}
        for _ in range(args.repeats):
            for b in sizes:
                timings[b].append(time_batches(services, captions, b, args))
        result: dict = {"ms_per_query": {b: min(t) for b, t in timings.items()}}
        if args.profile:
            result["profile"] = {b: profile_batches(services, captions, b, args) for b in sizes}
        print(json.dumps(result, indent=1))
    finally:
        services.holder.stop()
        services.decoder.close()


if __name__ == "__main__":
    main()
