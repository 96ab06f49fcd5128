"""Property tests (hypothesis) of the Gaussian distances and the mutual information."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models.distance.gaussian import (
    METRICS,
    broadcast_distance,
    elementwise_distance,
    pairwise_distance,
)
from models.scoring.uncertainty import mutual_information

LOGVAR_MIN, LOGVAR_MAX = math.log(1e-4), math.log(1e4)
NON_NEGATIVE = ("kl", "kl_reverse", "js", "min_kl", "w2", "bhattacharyya")

means = st.floats(-10.0, 10.0, allow_nan=False)
logvars = st.floats(LOGVAR_MIN, LOGVAR_MAX, allow_nan=False)


@st.composite
def gaussian_batches(draw, count: int, max_items: int = 4):
    """`count` batches of diagonal Gaussians (mu, logvar), each (N, D) float64, shared N and D."""
    dim = draw(st.integers(1, 6))
    items = draw(st.integers(1, max_items))
    batches = []
    for _ in range(count):
        mu = draw(
            st.lists(st.lists(means, min_size=dim, max_size=dim), min_size=items, max_size=items)
        )
        logvar = draw(
            st.lists(st.lists(logvars, min_size=dim, max_size=dim), min_size=items, max_size=items)
        )
        batches.append(
            (torch.tensor(mu, dtype=torch.float64), torch.tensor(logvar, dtype=torch.float64))
        )
    return batches


def root_w2(a, b) -> torch.Tensor:
    return torch.sqrt(elementwise_distance("w2", *a, *b))


@settings(max_examples=100, deadline=None)
@given(gaussian_batches(count=2))
def test_root_w2_is_symmetric(batches):
    a, b = batches
    torch.testing.assert_close(root_w2(a, b), root_w2(b, a), rtol=1e-12, atol=1e-12)
    forward = pairwise_distance("w2", *a, *b)
    torch.testing.assert_close(forward, pairwise_distance("w2", *b, *a).T, rtol=1e-9, atol=1e-8)


@settings(max_examples=100, deadline=None)
@given(gaussian_batches(count=3))
def test_root_w2_obeys_the_triangle_inequality(batches):
    a, b, c = batches
    direct = root_w2(a, c)
    via_b = root_w2(a, b) + root_w2(b, c)
    assert bool((direct <= via_b + 1e-9 * (1.0 + via_b)).all())


@pytest.mark.parametrize("metric", NON_NEGATIVE)
@settings(max_examples=40, deadline=None)
@given(batches=gaussian_batches(count=2))
def test_divergences_are_non_negative(metric, batches):
    a, b = batches
    assert bool((pairwise_distance(metric, *a, *b) >= 0).all())
    assert bool((elementwise_distance(metric, *a, *b) >= 0).all())


@pytest.mark.parametrize("metric", NON_NEGATIVE)
@settings(max_examples=40, deadline=None)
@given(batches=gaussian_batches(count=1))
def test_divergences_vanish_on_identical_inputs(metric, batches):
    ((mu, logvar),) = batches
    assert elementwise_distance(metric, mu, logvar, mu, logvar).abs().max().item() < 1e-9
    # The matmul expansion loses a few ulps of the terms it cancels: squared mean differences
    # (at most `spread` per dim) weighted by precisions up to 1e4, variances, log-variances.
    diagonal = torch.diagonal(pairwise_distance(metric, mu, logvar, mu, logvar))
    spread = (mu.max(0).values - mu.min(0).values) ** 2  # (D,)
    var = torch.exp(logvar)
    terms = (spread + var) * (1.0 + 1.0 / var) + logvar.abs()  # (N, D)
    scale = 1.0 + terms.sum(1)
    assert bool((diagonal.abs() <= 1e-12 * scale).all())


@st.composite
def draw_distances(draw):
    """Distances (L, Q, M) of L MC draws, Q queries, M candidates."""
    draws, queries, candidates = (
        draw(st.integers(1, 5)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 6)),
    )
    values = draw(
        st.lists(
            st.floats(0.0, 50.0, allow_nan=False),
            min_size=draws * queries * candidates,
            max_size=draws * queries * candidates,
        )
    )
    return torch.tensor(values, dtype=torch.float64).reshape(draws, queries, candidates)


temperatures = st.floats(0.05, 20.0, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(draw_distances(), temperatures)
def test_mutual_information_is_between_zero_and_log_m(distances, temperature):
    mi = mutual_information(distances, temperature)
    assert mi.shape == (distances.shape[1],)
    assert bool((mi >= 0).all())
    assert bool((mi <= math.log(distances.shape[2]) + 1e-12).all())


@settings(max_examples=100, deadline=None)
@given(draw_distances(), temperatures, st.integers(1, 6))
def test_mutual_information_is_zero_when_all_draws_agree(distances, temperature, num_draws):
    agreeing = distances[:1].expand(num_draws, -1, -1)  # the same posterior in every draw
    assert mutual_information(agreeing, temperature).abs().max().item() < 1e-12


@settings(max_examples=60, deadline=None)
@given(gaussian_batches(2), st.sampled_from(METRICS), st.integers(1, 3))
def test_broadcast_distance_is_elementwise_over_the_broadcast_pairs(batches, metric, draws):
    """(L, 1, N, D) draws against (1, N, D)-shaped items: each pair as elementwise gives it."""
    (mu_q, logvar_q), (mu_g, logvar_g) = batches
    mc_mu = torch.stack([mu_q + 0.1 * i for i in range(draws)])[:, None]  # (L, 1, N, D)
    mc_logvar = logvar_q.expand(draws, 1, *logvar_q.shape)
    params = {"seed": 3} if metric == "match_prob" else {}
    got = broadcast_distance(metric, mc_mu, mc_logvar, mu_g[:, None], logvar_g[:, None], **params)
    n = mu_q.shape[0]
    assert got.shape == (draws, n, n)
    for i in range(draws):
        for a in range(n):
            want = elementwise_distance(
                metric, mc_mu[i, 0], mc_logvar[i, 0], mu_g[a].expand(n, -1),
                logvar_g[a].expand(n, -1), **params,
            )  # fmt: skip
            torch.testing.assert_close(got[i, a], want, rtol=1e-12, atol=1e-12)
