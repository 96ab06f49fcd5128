"""The service benchmark's raw-parts process, run on the session's model and indexes."""

import math
import os
import sys
from pathlib import Path

import pytest

from service.metrics import STAGES, ServiceMetrics
from tests.service.conftest import Artifacts, ServerThread, make_settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_raw_parts_and_the_whole_searcher_are_timed_for_both_draw_counts(
    artifacts: Artifacts,
) -> None:
    from service_bench_parts import PARTS, time_parts

    spec = {
        "threads": "1",
        "model": str(artifacts.model),
        "index_root": str(artifacts.index_root),
        "captions": ["a red circle", "a small blue square"],
        "iterations": 5,
    }
    result = time_parts(spec)
    for draws in ("L=16", "L=0"):
        timing = result[draws]
        assert set(timing["parts_p50"]) == set(PARTS)
        assert timing["total_p50"] > 0
        # search_batch does the parts' work and more, so it cannot be much faster than them.
        assert timing["searcher_p50"] > 0.5 * timing["total_p50"]
    assert result["threads"]["torch"] == 1


@pytest.mark.parametrize("stage", [*STAGES, "a stage not listed"])
def test_a_stage_observation_lands_in_its_own_histogram(stage: str) -> None:
    metrics = ServiceMetrics()
    metrics.observe_stage(stage, 2.0)
    metrics.observe_stage(stage, 6.0)
    labels = {"stage": stage}
    sample = metrics.registry.get_sample_value
    assert sample("probsearch_stage_latency_seconds_count", labels) == 2
    assert sample("probsearch_stage_latency_seconds_sum", labels) == pytest.approx(0.008)
    others = [s for s in STAGES if s != stage]
    assert all(sample("probsearch_stage_latency_seconds_count", {"stage": s}) == 0 for s in others)


def test_the_paired_parts_process_answers_each_query_it_is_asked_for(artifacts: Artifacts) -> None:
    from service_bench_parts import serve_queries

    spec = {
        "threads": "1",
        "model": str(artifacts.model),
        "index_root": str(artifacts.index_root),
        "captions": ["a red circle", "a small blue square"],
    }
    replies: list[str] = []
    serve_queries(spec, ["0", "1", "7"], replies.append)
    assert replies[0] == "READY"
    answers = [[float(x) for x in line.split()] for line in replies[1:]]
    assert len(answers) == 3
    # raw parts and whole searcher of the query asked for, then of its hot repeat
    assert all(len(answer) == 4 and min(answer) > 0 for answer in answers)


def test_requests_and_raw_parts_taken_in_turn_give_every_figure_of_the_ratio(
    artifacts: Artifacts,
) -> None:
    from service_bench_paired import FIGURES, measure_paired

    spec = {
        "threads": "1",
        "model": str(artifacts.model),
        "index_root": str(artifacts.index_root),
        "captions": ["a red circle", "a small blue square"],
    }
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with ServerThread(make_settings(artifacts)) as server:
        paired = measure_paired(server.url, env, spec, 0.2, 1.0, "test")
    assert paired.count > 5
    figures = [getattr(paired, name) for name in FIGURES]
    assert all(math.isfinite(x) and x > 0 for x in figures)
    assert paired.ratio == paired.service_hot / (paired.raw_hot + paired.noop_hot)
    assert paired.ratio_cold == paired.service / (paired.raw + paired.noop)
