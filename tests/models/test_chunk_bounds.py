"""models.onnx.encoder_runtime.chunk_bounds: the cut of a caption batch into graph calls is the
cheapest one, found by trying every cut (a brute force over all compositions of the batch)."""

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from models.onnx.encoder_runtime import chunk_bounds


def cost(lengths: list[int], bounds: list[tuple[int, int]], call_cost: float) -> float:
    return sum(call_cost + (stop - start) * max(lengths[start:stop]) for start, stop in bounds)


def every_cut(count: int, most: int):
    """Every way to cut items 0..count-1 into consecutive chunks of at most `most` items."""
    for cuts in itertools.product([False, True], repeat=max(0, count - 1)):
        edges = [0, *[i + 1 for i, cut in enumerate(cuts) if cut], count]
        bounds = list(itertools.pairwise(edges))
        if all(stop - start <= most for start, stop in bounds):
            yield bounds


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 90), min_size=1, max_size=9),
    most=st.integers(1, 9),
    call_cost=st.sampled_from([0.0, 1.0, 8.0, 30.0]),
)
def test_the_cut_is_the_cheapest_of_all_cuts(lengths, most, call_cost) -> None:
    bounds = chunk_bounds(np.array(lengths), most, call_cost)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(lengths)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    assert all(0 < stop - start <= most for start, stop in bounds)
    cheapest = min(cost(lengths, cut, call_cost) for cut in every_cut(len(lengths), most))
    assert cost(lengths, bounds, call_cost) == cheapest


def test_equal_lengths_are_cut_every_most_items_and_an_outlier_gets_its_own_call() -> None:
    assert chunk_bounds(np.full(100, 10), 32) == [(0, 32), (32, 64), (64, 96), (96, 100)]
    assert chunk_bounds(np.array([], dtype=int), 32) == []
    sorted_batch = np.array([6] * 15 + [87])  # the demo's captions: one very long one
    assert chunk_bounds(sorted_batch, 32) == [(0, 15), (15, 16)]
