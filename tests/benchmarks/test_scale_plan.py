"""The 1B plan's arithmetic on a hand-computed case, its refusal of missing inputs, and
docs/scale.md being what benchmarks/scale_plan.py makes of the recorded runs."""

import shutil
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from scale_inputs import MissingInputError, load_inputs, sections, source_of  # noqa: E402
from scale_plan import (  # noqa: E402
    Hardware,
    Target,
    plan_row,
    reindex_hours,
    render,
    slowest_of,
    tail_ms,
    update,
)

RESULTS = BENCHMARKS / "results"
NODE = Hardware("test node", servers=4, memory_gb=10.0, speedup=1.0, wait_ms=0.0)
TEN_MILLION = Target(items=10_000_000, qps=1000.0, p99_ms=100.0)


def test_the_tail_passes_through_p50_and_p95() -> None:
    assert tail_ms(1.0, 2.0, 0.5) == pytest.approx(1.0)
    assert tail_ms(1.0, 2.0, 0.95) == pytest.approx(2.0)
    assert tail_ms(1.0, 2.0, 0.995) == pytest.approx(3.0)  # one more decade: + (p95 - p50)
    assert slowest_of(1.0, 2.0, 1) == pytest.approx(tail_ms(1.0, 2.0, 0.99))


def test_a_layout_by_hand() -> None:
    # 10 shards of 1M at 1000 B/item = 1 GB each; one core answers 1000 / 1 ms x 0.5 = 500 QPS,
    # so 1000 QPS needs R = 2; 4 cores and 7 GB usable hold 4 shards: 20 / 4 = 5 nodes.
    # p99: slowest of 10 at q = 0.99^(1/10) = 0.9989955; ln(0.5 / 0.0010045) / ln 10 = 2.6970,
    # so 1 + 2.6970 x (2 - 1) = 3.697 ms, + 2 ms merge/network + 3 ms re-rank = 8.697 ms.
    row = plan_row(NODE, 1_000_000, 1.0, 2.0, 1000.0, 3.0, TEN_MILLION)
    assert (row.shards, row.replicas, row.shards_per_node, row.nodes) == (10, 2, 4, 5)
    assert row.replica_qps == pytest.approx(1000.0)
    assert row.index_gb_per_node == pytest.approx(4.0)
    assert row.p99_ms == pytest.approx(8.697, abs=1e-3)
    assert row.meets


def test_memory_and_latency_limits() -> None:
    small = Hardware("small", servers=4, memory_gb=2.0, speedup=1.0, wait_ms=0.0)
    row = plan_row(small, 1_000_000, 1.0, 2.0, 1000.0, 3.0, TEN_MILLION)
    assert (row.shards_per_node, row.nodes) == (1, 20)  # 1.4 GB usable: one 1 GB shard
    tiny = Hardware("tiny", servers=4, memory_gb=1.0, speedup=1.0, wait_ms=0.0)
    assert not plan_row(tiny, 1_000_000, 1.0, 2.0, 1000.0, 3.0, TEN_MILLION).meets
    slow = plan_row(NODE, 1_000_000, 1.0, 2.0, 1000.0, 99.0, TEN_MILLION)
    assert slow.p99_ms > 100 and not slow.meets
    gpu = Hardware("gpu", servers=1, memory_gb=10.0, speedup=10.0, wait_ms=2.0)
    fast = plan_row(gpu, 1_000_000, 1.0, 2.0, 1000.0, 0.0, TEN_MILLION)
    assert fast.replicas == 2  # 5000 QPS per replica: one would do, availability asks two
    assert fast.replica_qps == pytest.approx(10000.0)
    assert fast.p99_ms == pytest.approx(0.3697 + 2.0 + 2.0, abs=1e-3)


def test_reindex_hours() -> None:
    assert reindex_hours(1_000_000_000, 100, 100.0) == pytest.approx(1e9 / 1e4 / 3600)


@pytest.fixture
def results(tmp_path: Path) -> Path:
    copy = tmp_path / "results"
    shutil.copytree(RESULTS, copy)
    return copy


def test_the_recorded_runs_are_read_with_their_provenance(results: Path) -> None:
    inputs = load_inputs(results)
    assert [s.items for s in inputs.shards][:1] == [1_000_000] and len(inputs.shards) >= 2
    assert all(s.source.command and s.source.machine and s.source.load for s in inputs.shards)
    assert inputs.bytes_per_item["w2", "ivfsq"][0] == 268
    assert inputs.rerank_ms == {"cpu": 0.31, "gpu": 0.6}
    assert inputs.ray_items_per_s == 94


@pytest.mark.parametrize(
    ("name", "needle"),
    [("ray_reindex.md", "ray_reindex.py"), ("gpu_check.md", "gpu_check.py"),
     ("index_bench_shard.md", "index_bench.py")],
)  # fmt: skip
def test_a_missing_results_file_is_refused(results: Path, name: str, needle: str) -> None:
    (results / name).unlink()
    with pytest.raises(MissingInputError, match=needle):
        load_inputs(results)


def test_a_run_without_its_load_average_is_refused(results: Path) -> None:
    path = results / "ray_reindex.md"
    path.write_text(path.read_text().replace("load average 10.3", "busy"))
    with pytest.raises(MissingInputError, match="records no load"):
        load_inputs(results)


def test_a_shard_run_without_numbers_is_refused(results: Path) -> None:
    path = results / "index_bench_shard.md"
    path.write_text(path.read_text().replace("| w2 |", "| w3 |"))
    with pytest.raises(MissingInputError, match="two gallery sizes"):
        load_inputs(results)


def test_provenance_formats() -> None:
    text = "Command: `python x.py`; machine: box, 2 CPUs; load (1 min) 0.4.\n"
    source = source_of("f.md", text)
    assert (source.command, source.machine, source.load) == ("python x.py", "box, 2 CPUs", "0.4")
    table = sections("# t\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n")[0].tables
    assert table == [[{"a": "1", "b": "2"}]]


def test_docs_scale_md_holds_the_plan_of_the_recorded_runs() -> None:
    doc = BENCHMARKS.parent / "docs" / "scale.md"
    assert update(doc, render(load_inputs(RESULTS), Target())) == doc.read_text(), (
        "docs/scale.md is stale: run python benchmarks/scale_plan.py"
    )


def test_update_needs_the_markers(tmp_path: Path) -> None:
    doc = tmp_path / "scale.md"
    doc.write_text("# no markers\n")
    with pytest.raises(ValueError, match="markers"):
        update(doc, "x")
    doc.write_text("a\n<!-- scale_plan:begin -->\nold\n<!-- scale_plan:end -->\nb\n")
    assert update(doc, "new") == "a\n<!-- scale_plan:begin -->\nnew\n<!-- scale_plan:end -->\nb\n"
