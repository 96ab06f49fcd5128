"""benchmarks/service_bench_compare.py reads service_bench.py's own report and compares sides."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from service_bench_compare import cells, table  # noqa: E402

REPORT = (ROOT / "benchmarks/results/service_bench.md").read_text()


def test_every_default_main_row_and_the_ratio_in_rounds_are_read() -> None:
    found = cells(REPORT)
    section = REPORT.split("\n## main:")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| default | off | ")]
    assert len(found) - 1 == len(rows) > 0
    assert found["text, 16 draws, miss, c=1"] == {"p50 ms": 2.21, "p99 ms": 3.06, "QPS": 446.6}
    assert found["overhead ratio (text 16 draws, c=1)"] == {"ratio": 1.47}


def test_a_cell_with_errors_stops_the_comparison() -> None:
    broken = REPORT.replace(
        "| text |  | 16 | miss | 1 | 11158 | 0 |", "| text |  | 16 | miss | 1 | 11158 | 3 |"
    )
    with pytest.raises(SystemExit, match="16 draws miss c=1: 3 errors"):
        cells(broken)


def test_overlapping_ranges_are_inside_the_noise_and_disjoint_ones_are_not() -> None:
    before = [{"cell": {"p50 ms": 2.0}}, {"cell": {"p50 ms": 2.4}}]
    inside = table(before, [{"cell": {"p50 ms": 2.3}}, {"cell": {"p50 ms": 2.5}}])
    outside = table(before, [{"cell": {"p50 ms": 3.0}}, {"cell": {"p50 ms": 3.2}}])
    assert inside[-1] == "| cell | p50 ms | 2.20 (2.00-2.40) | 2.40 (2.30-2.50) | 1.091 | yes |"
    assert outside[-1].endswith("| 1.409 | NO |")
