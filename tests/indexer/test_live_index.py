"""The live gallery (issue 43): writes logged and replayed, searched with the version's rows
as one gallery, exact against brute force over the live items, and compacted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexer.compaction import compact
from indexer.live_index import LiveIndex, LiveWriteError, VersionMovedError
from indexer.live_log import Delete, LiveLog, Put
from indexer.metadata_filter import MetadataFilter
from indexer.registry import ActiveRegistry
from indexer.store import open_version
from models.distance.augmented import FAMILIES, INDEX_FAMILIES
from models.distance.gaussian import pairwise_distance
from models.scoring.rerank import rerank_batch
from tests.indexer.synthetic import clustered_gaussians, nearby_queries, write_synthetic_version

DIM, COUNT = 8, 120
METRICS = tuple(INDEX_FAMILIES)  # every metric with an exact index form
# Filters, and the same condition written as a plain predicate on an item's extra fields:
# many rows (searched inside FAISS through the selector) and few (scored by brute force).
FILTERS = (
    (None, lambda extra: True),
    ({"i": {"lt": 60}}, lambda extra: extra.get("i", 10**9) < 60),
    ({"i": {"in": [1, 2, 3, 77]}}, lambda extra: extra.get("i") in (1, 2, 3, 77)),
)


def _version(tmp_path: Path, name: str = "v1", duplicates: bool = False) -> Path:
    mu, logvar = clustered_gaussians(COUNT, DIM, seed=3, clusters=12)
    if duplicates:  # rows 1..4 share row 0's embedding: indexed once, as one group
        mu[1:5], logvar[1:5] = mu[0], logvar[0]
    path = tmp_path / "root" / "text" / name
    write_synthetic_version(path, mu, logvar, FAMILIES, "flat")
    return path


def _put(item_id: str, seed: int, text: str = "added") -> Put:
    mu, logvar = clustered_gaussians(1, DIM, seed=3, clusters=12)
    rng = np.random.default_rng(seed)
    mu = mu[0] + rng.normal(0, 1.5, DIM).astype(np.float32)
    return Put(item_id, mu, logvar[0], {"text": text, "extra": {"seed": seed}})


Model = dict[str, tuple[np.ndarray, np.ndarray, dict]]


def _model(path: Path) -> Model:
    """The version's items, id -> (mu, logvar) in row order: what the writes then change, by
    the test's own book-keeping (a put moves its id to the end, as a new row does)."""
    version = open_version(path)
    rows = range(version.manifest.count)
    model = {r["id"]: (np.array(version.mu[i]), np.array(version.logvar[i]), r["extra"])
             for i, r in zip(rows, version.metadata(list(rows)), strict=True)}  # fmt: skip
    version.close()
    return model


def _apply(model: Model, entry: Put | Delete) -> None:
    model.pop(entry.item_id, None)
    if isinstance(entry, Put):
        model[entry.item_id] = (entry.mu, entry.logvar, entry.record["extra"])


def _live_items(live: LiveIndex) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The live index's own view of its items (id, mu, logvar), in row order."""
    rows = live.snapshot()[0].live_rows()
    ids = [record["id"] for record in live.metadata(rows.tolist())]
    return (
        ids,
        np.asarray(live.mu[rows]).reshape(-1, DIM),
        np.asarray(live.logvar[rows]).reshape(-1, DIM),
    )


def _brute_force(
    model: Model, metric: str, mu_q: np.ndarray, logvar_q: np.ndarray, k: int, keep=None
):
    ids = [i for i in model if keep is None or keep(model[i][2])]
    mu = np.stack([model[i][0] for i in ids])
    logvar = np.stack([model[i][1] for i in ids])
    distances = pairwise_distance(
        metric, *map(torch.from_numpy, (mu_q, logvar_q, mu, logvar))
    ).numpy()  # (Q, N)
    order = np.argsort(distances, axis=1, kind="stable")[:, :k]
    return [[ids[i] for i in row] for row in order], np.take_along_axis(distances, order, 1)


def _searched(
    live: LiveIndex, metric: str, mu_q: np.ndarray, logvar_q: np.ndarray, k: int, spec=None
):
    row_filter = None if spec is None else MetadataFilter.parse(spec)
    rows = live.shortlist(metric, mu_q, logvar_q, 2 * k, row_filter)
    ranked = rerank_batch(
        metric, mu_q, logvar_q, live.mu, live.logvar, rows, k, torch.device("cpu")
    )
    ids = [
        [r["id"] for r in live.metadata(ranked.rows[q, : ranked.counts[q]])]
        for q in range(len(rows))
    ]
    return ids, ranked.distances.numpy()


def _assert_exact(live: LiveIndex, model: Model, seed: int = 5, k: int = 10) -> None:
    _, mu, logvar = _live_items(live)
    mu_q, logvar_q = nearby_queries(mu, logvar, 6, seed=seed)
    added = live.snapshot()[0].alive_segment_rows()[:6]  # queries at the added items too
    mu_q = np.concatenate([mu_q, np.asarray(live.mu[added]).reshape(-1, DIM)])
    logvar_q = np.concatenate([logvar_q, np.asarray(live.logvar[added]).reshape(-1, DIM)])
    for metric in METRICS:
        for spec, keep in FILTERS:
            want_ids, want = _brute_force(model, metric, mu_q, logvar_q, k, keep)
            got_ids, got = _searched(live, metric, mu_q, logvar_q, k, spec)
            assert got_ids == want_ids, (metric, spec)
            np.testing.assert_allclose(got[:, : want.shape[1]], want, rtol=1e-4, atol=1e-4)


operations = st.lists(
    st.tuples(
        st.sampled_from(["put-new", "put-base", "put-added", "delete"]), st.integers(0, 10**6)
    ),
    min_size=1,
    max_size=40,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=operations, duplicates=st.booleans())
def test_live_search_equals_brute_force_over_the_live_items(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]], duplicates: bool
) -> None:
    path = _version(tmp_path_factory.mktemp("live"), duplicates=duplicates)
    live, model = LiveIndex(open_version(path)), _model(path)
    added: list[str] = []
    for i, (op, value) in enumerate(ops):
        entry: Put | Delete | None = None
        if op == "put-new":
            added.append(f"new-{i}")
            entry = _put(added[-1], value)
        elif op == "put-base":  # replaces a version row (in the duplicate group for low ids)
            entry = _put(f"item-{value % 10}", value)
        elif op == "put-added" and added:
            entry = _put(added[value % len(added)], value)
        elif op == "delete":
            pool = [*added, f"item-{value % 10}"]
            entry = Delete(pool[value % len(pool)])
        if entry is not None:
            live.write([entry])
            _apply(model, entry)
    _assert_exact(live, model)
    ids = _live_items(live)[0]
    assert ids == list(model) and live.count == len(model)
    replayed = LiveIndex(open_version(path))  # another process reading the same log
    assert _live_items(replayed)[0] == ids
    np.testing.assert_array_equal(_live_items(replayed)[1], _live_items(live)[1])


def test_deleted_items_are_gone_and_replaced_items_hold_their_new_values(tmp_path: Path) -> None:
    live = LiveIndex(open_version(_version(tmp_path)))
    result = live.write([Delete("item-3"), Delete("no-such-item"), _put("item-4", 9, "new text")])
    assert result.logged == 2 and result.missing == ("no-such-item",)
    assert live.record("item-3") is None
    assert live.record("item-4")["text"] == "new text"
    assert live.count == COUNT - 1
    _, mu, logvar = _live_items(live)
    found = _searched(live, "w2", mu[:COUNT], logvar[:COUNT], 3)[0]
    assert all("item-3" not in row for row in found)


def test_a_torn_last_line_is_never_read_and_the_next_write_cuts_it(tmp_path: Path) -> None:
    path = _version(tmp_path)
    live = LiveIndex(open_version(path))
    live.write([_put("a", 1)])
    with (path / "live.wal").open("ab") as handle:
        handle.write(b'{"op": "put", "id": "torn", "mu": "AAAA')  # a crash mid-write
    other = LiveIndex(open_version(path))
    assert other.record("a") is not None and other.record("torn") is None
    other.write([_put("b", 2)])
    entries, end = LiveLog(path).read(0)
    assert [e.item_id for e in entries] == ["a", "b"] and end == (path / "live.wal").stat().st_size


def test_malformed_writes_are_refused_and_nothing_is_logged(tmp_path: Path) -> None:
    path = _version(tmp_path)
    live = LiveIndex(open_version(path))
    bad = Put("x", np.zeros(DIM + 1, np.float32), np.zeros(DIM + 1, np.float32), {"extra": {}})
    with pytest.raises(LiveWriteError, match=f"must be {DIM} finite numbers"):
        live.write([bad])
    nan = Put("x", np.full(DIM, np.nan, np.float32), np.zeros(DIM, np.float32), {"extra": {}})
    with pytest.raises(LiveWriteError, match="finite"):
        live.write([nan])
    with pytest.raises(LiveWriteError, match="1 to 512 characters"):
        live.write([Delete("")])
    assert LiveLog(path).size() == 0


def _registry(tmp_path: Path) -> ActiveRegistry:
    registry = ActiveRegistry(tmp_path / "root", None)
    registry.activate("text", "v1")
    return registry


def test_compaction_returns_the_same_top_10_and_keeps_later_writes(tmp_path: Path) -> None:
    path = _version(tmp_path)
    registry = _registry(tmp_path)
    live = LiveIndex(open_version(path))
    live.write([_put(f"new-{i}", i) for i in range(15)] + [Delete(f"item-{i}") for i in range(7)])
    _, mu, logvar = _live_items(live)
    mu_q, logvar_q = nearby_queries(mu, logvar, 6, seed=8)
    before = {m: _searched(live, m, mu_q, logvar_q, 10) for m in METRICS}
    result = compact(registry, "text")
    assert result.new_version is not None and registry.active_version("text") == result.new_version
    compacted = LiveIndex(
        open_version(registry.version_path("text", result.new_version), verify=True)
    )
    assert not compacted.snapshot()[0].changed and compacted.count == COUNT - 7 + 15
    for metric in METRICS:
        ids, distances = _searched(compacted, metric, mu_q, logvar_q, 10)
        assert ids == before[metric][0]
        np.testing.assert_allclose(distances, before[metric][1], rtol=1e-5, atol=1e-5)
    with pytest.raises(VersionMovedError):  # the old version no longer takes writes
        live.write([_put("late", 1)], still_active=lambda: registry.active_version("text") == "v1")
    assert compact(registry, "text").new_version is None  # nothing left to fold


def test_writes_logged_during_a_compaction_are_copied_into_the_new_version(
    tmp_path: Path, monkeypatch
) -> None:
    path = _version(tmp_path)
    registry = _registry(tmp_path)
    live = LiveIndex(open_version(path))
    live.write([_put("before", 1)])
    import indexer.compaction as compaction

    build = compaction._build

    def build_then_write(*args, **kwargs):
        built = build(*args, **kwargs)
        live.write([_put("during", 2), Delete("item-0")])  # after the snapshot, before the swap
        return built

    monkeypatch.setattr(compaction, "_build", build_then_write)
    result = compact(registry, "text")
    new = LiveIndex(open_version(registry.version_path("text", result.new_version)))
    assert result.copied_writes == 2
    assert new.record("before") is not None and new.record("during") is not None
    assert new.record("item-0") is None and new.count == COUNT + 1


@pytest.mark.parametrize("share", [0.01, 0.3, 0.6])
def test_a_filter_on_an_approximate_index_keeps_its_recall(
    tmp_path: Path, share: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An IVF version: a filter leaving few rows is scored by brute force, one leaving many is
    searched with nprobe widened by the share left out (brute force stops at 500 rows here);
    either way the filtered top-10 finds what an exhaustive search over the matching items
    finds, at IVF's own bar (0.9)."""
    import indexer.live_index

    monkeypatch.setattr(indexer.live_index, "BRUTE_FORCE_ROWS", 500)
    count = 6000
    mu, logvar = clustered_gaussians(count, DIM, seed=4, clusters=60)
    path = tmp_path / "root" / "text" / "ivf"
    write_synthetic_version(path, mu, logvar, ("w2",), "ivf")
    live = LiveIndex(open_version(path))
    assert live.manifest.index_type == "ivf"
    limit = int(share * count)  # rows are in random cluster order: "i < limit" is a sample
    mu_q, logvar_q = nearby_queries(mu, logvar, 20, seed=9)
    spec = MetadataFilter.parse({"i": {"lt": limit}})
    rows = live.shortlist("w2", mu_q, logvar_q, 100, spec)
    # a full shortlist of matching rows (without the widening, 60 of 100 at a share of 0.3)
    assert ((rows >= 0).sum(axis=1) >= min(100, limit)).all()
    ranked = rerank_batch("w2", mu_q, logvar_q, live.mu, live.logvar, rows, 10, torch.device("cpu"))
    queries = map(torch.from_numpy, (mu_q, logvar_q, mu[:limit], logvar[:limit]))
    distances = pairwise_distance("w2", *queries).numpy()  # (Q, limit)
    want = np.argsort(distances, axis=1, kind="stable")[:, :10]
    recall = np.mean([len(set(ranked.rows[q, :10]) & set(want[q])) / 10 for q in range(20)])
    assert recall >= 0.9, recall
    assert live.matching_count(spec) == limit
