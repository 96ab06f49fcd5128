"""The service benchmark's rounds: comparison cells measured in turns, combined by medians."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from load_generator import Summary
from service_bench import Measured, combine_rounds


def measured(p50: float, qps: float, errors: int, cpu: float) -> Measured:
    summary = Summary(
        count=100, errors=errors, error_statuses={503: errors} if errors else {},
        p50=p50, p95=2 * p50, p99=3 * p50, mean=p50, qps=qps, hit_fraction=0.0,
    )  # fmt: skip
    return Measured(summary, client_cpu=cpu, server_cpu=2 * cpu)


def test_each_figure_is_its_median_over_rounds_and_counts_add_up() -> None:
    rounds = [measured(9.0, 100.0, 0, 0.1), measured(5.0, 300.0, 2, 0.3), measured(6.0, 50, 1, 0.2)]
    combined = combine_rounds(rounds)
    s = combined.summary
    assert (s.p50, s.p95, s.p99, s.mean, s.qps) == (6.0, 12.0, 18.0, 6.0, 100.0)
    assert (s.count, s.errors, s.error_statuses) == (300, 3, {503: 3})
    assert (combined.client_cpu, combined.server_cpu) == (0.2, 0.4)


def test_the_window_scenario_compares_the_default_with_a_5_ms_window_in_rounds(
    monkeypatch,
) -> None:
    import service_bench

    monkeypatch.setattr(sys, "argv", ["service_bench.py", "--scenarios", "window"])
    cells = service_bench.plan_cells(service_bench.parse_args())["window"]
    by_server = {}
    for cell in cells:
        assert (cell.endpoint, cell.draws, cell.cache) == ("text", 16, "miss")
        by_server.setdefault(tuple(cell.server.env), []).append(cell.concurrency)
    assert by_server == {
        (): [2, 4, 16, 64],
        (("PROBSEARCH_BATCH_MAX_WAIT_MS", "5"),): [2, 4, 16, 64],
    }
    assert "window" in service_bench.COMPARED


def in_rounds(p50s: list[float]) -> Measured:
    return combine_rounds([measured(p50, 1000 / p50, 0, 0.5) for p50 in p50s])


def test_a_thread_setting_is_better_only_beyond_the_rounds_spread() -> None:
    """The figures of one run (session 17) where the default and threads=1 were the same
    setting: medians 3.80 and 2.51 ms, but each spread over 2.4-4.1 ms round by round."""
    from service_bench_report import threads_verdict

    same = {"default": in_rounds([3.80, 3.91, 3.89, 2.45, 2.49]),
            "1": in_rounds([4.09, 2.43, 3.85, 2.43, 2.51])}  # fmt: skip
    value, ok = threads_verdict(same, "p50")
    assert ok and "no difference" in value and "(2.45-3.91)" in value
    worse = {"default": in_rounds([4.5, 4.8, 5.2]), "1": in_rounds([2.4, 2.5, 3.9])}
    value, ok = threads_verdict(worse, "p50")
    assert not ok and value == "default 4.80 ms (4.50-5.20), best 1 2.50 ms (2.40-3.90)"
    close = {"default": in_rounds([2.6, 2.7]), "1": in_rounds([2.5, 2.5])}
    assert threads_verdict(close, "p50")[1]
    qps = {"default": in_rounds([5.0, 5.0, 5.0]), "2": in_rounds([2.0, 2.1, 2.2])}
    value, ok = threads_verdict(qps, "QPS")
    assert not ok and value.startswith("default 200.0 (200.0-200.0), best 2 476.2")
