"""The read side: device placement of a loaded index (GPU only when FAISS sees one), and the
expansion of duplicate embeddings' groups into their rows."""

import faiss
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from indexer.read_index import DuplicateGroups, to_device


def test_to_device_keeps_the_cpu_index_without_a_gpu() -> None:
    index = faiss.IndexFlatL2(4)
    index.add(np.eye(4, dtype=np.float32))
    assert to_device(index, "cpu") is index
    if faiss.get_num_gpus() == 0:
        assert to_device(index, "auto") is index
        with pytest.raises(ValueError, match="sees no GPU"):
            to_device(index, "cuda")
    else:  # a GPU machine: auto moves it there, and the search is unchanged
        moved = to_device(index, "auto")
        assert moved is not index
        np.testing.assert_array_equal(
            moved.search(np.eye(4, dtype=np.float32), 1)[1].ravel(), range(4)
        )


def expanded_by_loop(
    representatives: np.ndarray, distances: np.ndarray, rows: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The expansion spelt out: each representative in turn, its group's rows in row order,
    until k rows or the query's first -1."""
    out_distances = np.full((len(rows), k), np.inf, np.float32)
    out_rows = np.full((len(rows), k), -1, np.int64)
    for q in range(len(rows)):
        kept: list[tuple[float, int]] = []
        for distance, row in zip(distances[q], rows[q], strict=True):
            if row < 0:
                break
            kept += [
                (distance, r) for r in range(len(representatives)) if representatives[r] == row
            ]
        for slot, (distance, row) in enumerate(kept[:k]):
            out_distances[q, slot], out_rows[q, slot] = distance, row
    return out_distances, out_rows


@st.composite
def searches(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Groups of rows (each row's representative: the first row of its group), and a FAISS
    answer over the representatives: k' of them per query, sorted, some cut short by -1."""
    groups = draw(st.lists(st.integers(0, 5), min_size=1, max_size=30))  # a group label per row
    first: dict[int, int] = {}
    representatives = np.array([first.setdefault(g, r) for r, g in enumerate(groups)])
    unique = np.unique(representatives)
    queries, width = draw(st.integers(0, 4)), draw(st.integers(0, len(unique)))
    rows = np.full((queries, width), -1, np.int64)
    for q in range(queries):
        found = draw(st.integers(0, width))
        rows[q, :found] = draw(st.permutations(unique.tolist()))[:found]
    distances = np.sort(np.arange(rows.size, dtype=np.float32).reshape(rows.shape) * 0.5, axis=1)
    return representatives, distances, rows, draw(st.integers(1, 12))


@settings(max_examples=200, deadline=None)
@given(searches())
def test_expand_gives_each_groups_rows_in_order_up_to_k(
    search: tuple[np.ndarray, np.ndarray, np.ndarray, int],
) -> None:
    representatives, distances, rows, k = search
    got = DuplicateGroups(representatives).expand(distances, rows, k)
    want = expanded_by_loop(representatives, distances, rows, k)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


def test_members_are_a_groups_rows_in_row_order() -> None:
    groups = DuplicateGroups(np.array([0, 1, 0, 3, 1, 0]))
    assert groups.members(0).tolist() == [0, 2, 5]
    assert groups.members(1).tolist() == [1, 4]
    assert groups.members(3).tolist() == [3]
    assert groups.unique_rows.tolist() == [0, 1, 3]
