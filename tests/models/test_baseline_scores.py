"""The training-free baselines (models.scoring.baseline_scores) against plain per-query loops
over sorted() shortlists, with +inf padding and exact ties; properties with hypothesis."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.scoring.baseline_scores import (
    BASELINE_NAMES,
    baseline_scores,
    top1_distance,
    top1_instability,
    top1_margin,
    top1_mean_distance,
)


def loop_first(row: list[float]) -> int:
    """The index of a row's first result: smallest distance, the earlier index on a tie."""
    return sorted(range(len(row)), key=lambda m: (row[m], m))[0]


def loop_baselines(
    distances: np.ndarray, mc_distances: np.ndarray | None, means: tuple | None = None
) -> dict[str, list]:
    """Each baseline of each query by a loop over its sorted finite distances."""
    out: dict[str, list] = {"top1_distance": [], "top1_margin": []}
    if mc_distances is not None:
        out["top1_instability"] = []
    if means is not None:
        out["top1_mean_distance"] = []
    for q, row in enumerate(distances.tolist()):
        ranked = sorted(row)
        finite = [d for d in ranked if math.isfinite(d)]
        out["top1_distance"].append(ranked[0])
        out["top1_margin"].append(-(finite[1] - finite[0]) if len(finite) >= 2 else 0.0)
        if mc_distances is not None:
            first = loop_first(row)
            draws = [loop_first(draw[q].tolist()) for draw in mc_distances]
            out["top1_instability"].append(1.0 - sum(f == first for f in draws) / len(draws))
        if means is not None:
            query_mu, candidate_mu = means
            first_mu = candidate_mu[q][loop_first(row)]
            out["top1_mean_distance"].append(
                sum((float(a) - float(b)) ** 2 for a, b in zip(query_mu[q], first_mu, strict=True))
            )
    return out


def random_case(rng: np.random.Generator, q: int, m: int, draws: int):
    """Distances rounded to 1 decimal (many exact ties, also at the top), some +inf padding at
    the end of rows (each row keeps >= 1 finite), and draws that perturb them."""
    distances = np.round(rng.uniform(0, 2, (q, m)), 1)
    for row in range(q):
        distances[row, rng.integers(1, m + 1) :] = np.inf
    noise = np.round(rng.normal(0, 0.2, (draws, q, m)), 1)
    return distances, distances[None] + noise  # inf + noise stays inf


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("shape", [(7, 1, 3), (9, 2, 1), (20, 6, 5), (30, 12, 8)])
def test_baselines_match_a_sorted_loop(seed: int, shape: tuple[int, int, int]) -> None:
    rng = np.random.default_rng(seed)
    distances, mc = random_case(rng, *shape)
    q, m = shape[:2]
    means = (rng.normal(size=(q, 4)), rng.normal(size=(q, m, 4)))
    got = baseline_scores(distances, mc, means)
    expected = loop_baselines(distances, mc, means)
    assert list(got) == list(BASELINE_NAMES)
    for name in BASELINE_NAMES:
        assert got[name].dtype == np.float64 and got[name].shape == (shape[0],)
        np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=1e-12, err_msg=name)


def test_ties_and_padding_by_hand() -> None:
    inf = math.inf
    distances = np.array(
        [
            [0.3, 0.3, 0.9],  # exact tie at the top: margin 0
            [0.5, inf, inf],  # one finite candidate: margin 0 (no second result)
            [0.9, 0.2, 0.7],  # first is row 1, margin -(0.7 - 0.2)
        ]
    )
    draws = np.array(
        [
            [[0.3, 0.3, 0.9], [0.5, inf, inf], [0.1, 0.2, 0.7]],  # tie -> index 0 agrees
            [[0.4, 0.3, 0.9], [0.5, inf, inf], [0.9, 0.2, 0.7]],  # row 0 moves to index 1
        ]
    )
    scores = baseline_scores(distances, draws)
    np.testing.assert_allclose(scores["top1_distance"], [0.3, 0.5, 0.2])
    np.testing.assert_allclose(scores["top1_margin"], [0.0, 0.0, -0.5])
    np.testing.assert_allclose(scores["top1_instability"], [0.5, 0.0, 0.5])


def test_the_mean_distance_reads_the_first_result_and_no_variance() -> None:
    distances = np.array([[0.9, 0.2, 0.7], [0.4, 0.4, 0.1]])  # first results: 1 and 2
    query_mu = np.array([[0.0, 0.0], [1.0, 1.0]])
    candidate_mu = np.array(
        [[[5.0, 5.0], [3.0, 4.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0], [1.0, 3.0]]]
    )
    np.testing.assert_allclose(top1_mean_distance(query_mu, candidate_mu, distances), [25, 4])
    tie = np.array([[0.3, 0.3, 0.9]])  # an exact tie goes to the earlier candidate
    np.testing.assert_allclose(top1_mean_distance(query_mu[:1], candidate_mu[:1], tie), [50])
    assert "top1_mean_distance" not in baseline_scores(distances)


def test_without_draws_there_is_no_instability() -> None:
    distances = np.array([[0.1, 0.4]])
    assert set(baseline_scores(distances)) == {"top1_distance", "top1_margin"}
    assert set(baseline_scores(distances, np.zeros((0, 1, 2)))) == {"top1_distance", "top1_margin"}
    np.testing.assert_array_equal(top1_margin(np.array([[0.7], [0.2]])), [0.0, 0.0])
    with pytest.raises(ValueError, match="do not match"):
        top1_instability(distances, np.zeros((3, 1, 3)))


@st.composite
def cases(draw):
    q, m, draws = draw(st.integers(1, 6)), draw(st.integers(1, 8)), draw(st.integers(1, 5))
    values = st.one_of(st.sampled_from([0.0, 0.5, 1.0, math.inf]), st.floats(-5, 5))
    distances = np.array(draw(st.lists(values, min_size=q * m, max_size=q * m))).reshape(q, m)
    mc = np.array(draw(st.lists(values, min_size=draws * q * m, max_size=draws * q * m)))
    return distances, mc.reshape(draws, q, m)


@settings(max_examples=200, deadline=None)
@given(cases())
def test_baseline_properties(case) -> None:
    distances, mc = case
    scores = baseline_scores(distances, mc)
    instability = scores["top1_instability"]
    assert ((instability >= 0) & (instability <= 1)).all()
    assert (scores["top1_margin"] <= 0).all() and np.isfinite(scores["top1_margin"]).all()
    np.testing.assert_array_equal(scores["top1_distance"], top1_distance(distances))
    np.testing.assert_array_equal(scores["top1_distance"], np.sort(distances, axis=1)[:, 0])
    same = np.repeat(distances[None], mc.shape[0], axis=0)
    np.testing.assert_array_equal(top1_instability(distances, same), 0.0)
    for name, values in loop_baselines(distances, mc).items():
        np.testing.assert_allclose(scores[name], values, rtol=0, atol=1e-12, err_msg=name)
