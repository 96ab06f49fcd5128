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
