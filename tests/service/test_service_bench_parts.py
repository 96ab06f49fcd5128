"""The service benchmark's raw-parts process, run on the session's model and indexes."""

import math
import os
import sys
from pathlib import Path

from tests.service.conftest import Artifacts, ServerThread, make_settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def _spec(artifacts: Artifacts) -> dict:
    """What the raw-parts process needs (benchmarks/service_bench.py's raw_spec)."""
    return {
        "threads": "1",
        "model": str(artifacts.model),
        "index_root": str(artifacts.index_root),
        "captions": ["a red circle", "a small blue square"],
    }


def test_raw_parts_and_the_whole_searcher_are_timed_for_both_draw_counts(
    artifacts: Artifacts,
) -> None:
    from service_bench_parts import PARTS, time_parts

    spec = {**_spec(artifacts), "iterations": 5}
    result = time_parts(spec)
    for draws in ("L=16", "L=0"):
        timing = result[draws]
        assert set(timing["parts_p50"]) == set(PARTS)
        assert timing["total_p50"] > 0
        # search_batch does the parts' work and more, so it cannot be much faster than them.
        assert timing["searcher_p50"] > 0.5 * timing["total_p50"]
    assert result["threads"]["torch"] == 1


def test_the_parts_process_answers_each_block_it_is_asked_for(artifacts: Artifacts) -> None:
    from service_bench_parts import serve_queries

    spec = _spec(artifacts)
    replies: list[str] = []
    serve_queries(spec, ["0 8", "100 8"], replies.append)
    assert replies[0] == "READY"
    answers = [[float(x) for x in line.split()] for line in replies[1:]]
    # per block: p50 of the raw parts and of the whole searcher
    assert len(answers) == 2
    assert all(len(answer) == 2 and min(answer) > 0 for answer in answers)


def test_overhead_rounds_take_every_figure_once_a_round_with_cache_misses_only(
    artifacts: Artifacts,
) -> None:
    from service_bench_overhead import FIGURES, measure_overhead_rounds

    spec = _spec(artifacts)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with ServerThread(make_settings(artifacts)) as server:
        rounds = measure_overhead_rounds(server.url, env, spec, 2, 0.1, 0.4, "test", block=10)
    for name in FIGURES:
        values = getattr(rounds, name)
        assert len(values) == 2 and all(math.isfinite(x) and x > 0 for x in values), name
    median = rounds.median
    assert rounds.ratio == median("service") / (median("raw") + median("noop"))
    assert len(rounds.round_ratios()) == 2
