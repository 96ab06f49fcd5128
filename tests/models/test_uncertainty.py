"""Uncertainty measures against direct numpy/scipy/torch.distributions computations."""

import math

import numpy as np
import pytest
import torch
from scipy.special import softmax
from torch.distributions import Independent, Normal

from models.scoring.uncertainty import (
    UncertaintyInputError,
    entropy,
    feature_uncertainty,
    log_det,
    mutual_information,
    retrieval_posterior,
    sample_gaussian,
    total_variance,
)


@pytest.fixture(scope="module")
def logvar():
    return torch.from_numpy(np.random.default_rng(0).uniform(-9.0, 9.0, size=(5, 7)))


def test_log_det_is_log_of_the_covariance_determinant(logvar):
    expected = np.log(np.linalg.det(np.stack([np.diag(np.exp(row)) for row in logvar.numpy()])))
    np.testing.assert_allclose(log_det(logvar).numpy(), expected, rtol=1e-10)


def test_entropy_matches_torch_distributions(logvar):
    normal = Independent(Normal(torch.zeros_like(logvar), torch.exp(0.5 * logvar)), 1)
    torch.testing.assert_close(entropy(logvar), normal.entropy())


def test_total_variance_is_the_trace_of_the_covariance(logvar):
    normal = Independent(Normal(torch.zeros_like(logvar), torch.exp(0.5 * logvar)), 1)
    torch.testing.assert_close(total_variance(logvar), normal.variance.sum(dim=-1))
    assert total_variance(logvar.half()).dtype == torch.float32


def test_float16_inputs_are_computed_in_float32(logvar):
    assert log_det(logvar.half()).dtype == torch.float32
    assert entropy(logvar.half()).dtype == torch.float32
    torch.testing.assert_close(entropy(logvar.half()), entropy(logvar.half().float()))


def test_feature_uncertainty_is_summed_variance_across_draws():
    mc_mu = np.random.default_rng(1).normal(size=(6, 4, 3))
    expected = mc_mu.var(axis=0).sum(axis=1)
    np.testing.assert_allclose(feature_uncertainty(torch.from_numpy(mc_mu)).numpy(), expected)
    assert feature_uncertainty(torch.from_numpy(mc_mu[:1])).abs().max() == 0
    with pytest.raises(UncertaintyInputError, match=r"\(L, N, D\)"):
        feature_uncertainty(torch.zeros(4, 3))


def test_retrieval_posterior_is_softmax_of_negative_distance_over_temperature():
    distances = np.random.default_rng(2).uniform(0, 10, size=(3, 4, 6))
    got = retrieval_posterior(torch.from_numpy(distances), temperature=0.7).numpy()
    np.testing.assert_allclose(got, softmax(-distances / 0.7, axis=-1), rtol=1e-12)


def test_retrieval_posterior_gives_padded_candidates_zero_probability():
    distances = torch.tensor([[1.0, 2.0, math.inf]])
    posterior = retrieval_posterior(distances, temperature=1.0)
    assert posterior[0, 2] == 0 and posterior.sum().item() == pytest.approx(1.0)
    with pytest.raises(UncertaintyInputError, match="at least one finite"):
        retrieval_posterior(torch.full((1, 3), math.inf), temperature=1.0)
    with pytest.raises(UncertaintyInputError, match="NaN"):
        retrieval_posterior(torch.tensor([[1.0, math.nan]]), temperature=1.0)


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.inf, math.nan])
def test_temperature_must_be_positive_and_finite(temperature):
    with pytest.raises(UncertaintyInputError, match="temperature"):
        retrieval_posterior(torch.zeros(2, 3), temperature)


def loop_mutual_information(distances: np.ndarray, temperature: float) -> np.ndarray:
    """H(mean_l p_l) - mean_l H(p_l) with plain loops, for one query at a time."""
    draws, queries, _ = distances.shape
    out = np.zeros(queries)
    for q in range(queries):
        posteriors = [softmax(-distances[l, q] / temperature) for l in range(draws)]  # noqa: E741
        mean = np.mean(posteriors, axis=0)
        entropy_of_mean = -sum(p * math.log(p) for p in mean if p > 0)
        mean_entropy = np.mean([-sum(p * math.log(p) for p in row if p > 0) for row in posteriors])
        out[q] = entropy_of_mean - mean_entropy
    return out


def test_mutual_information_matches_a_loop():
    distances = np.random.default_rng(3).uniform(0, 5, size=(8, 4, 10))
    got = mutual_information(torch.from_numpy(distances), temperature=0.5).numpy()
    np.testing.assert_allclose(got, loop_mutual_information(distances, 0.5), rtol=1e-10)
    assert (got > 0).all()


def test_mutual_information_reaches_log_m_for_confident_disagreeing_draws():
    # M draws, each sure of a different candidate: mean posterior uniform, each entropy 0.
    m = 5
    distances = torch.full((m, 1, m), 1e3, dtype=torch.float64)
    for draw in range(m):
        distances[draw, 0, draw] = 0.0
    mi = mutual_information(distances, temperature=1.0)
    assert mi.item() == pytest.approx(math.log(m), abs=1e-12)


def test_mutual_information_needs_three_dims():
    with pytest.raises(UncertaintyInputError, match="L draws, Q queries, M candidates"):
        mutual_information(torch.zeros(3, 4), temperature=1.0)


def test_sample_gaussian_is_seeded_and_has_the_right_moments():
    mu = torch.tensor([[0.0, 5.0], [-3.0, 1.0]])
    logvar = torch.log(torch.tensor([[1.0, 4.0], [0.01, 100.0]]))
    draws = sample_gaussian(mu, logvar, 20_000, torch.Generator().manual_seed(1))
    assert draws.shape == (20_000, 2, 2) and draws.dtype == torch.float32
    again = sample_gaussian(mu, logvar, 20_000, torch.Generator().manual_seed(1))
    torch.testing.assert_close(draws, again)
    other = sample_gaussian(mu, logvar, 20_000, torch.Generator().manual_seed(2))
    assert not torch.allclose(draws, other)
    std = torch.exp(0.5 * logvar)
    standard_error = std / math.sqrt(20_000)
    assert bool(((draws.mean(0) - mu).abs() < 5 * standard_error).all())
    torch.testing.assert_close(draws.std(0), std, rtol=0.03, atol=0.0)


def test_sample_gaussian_rejects_bad_input():
    with pytest.raises(UncertaintyInputError, match="num_samples"):
        sample_gaussian(torch.zeros(2, 3), torch.zeros(2, 3), 0)
    with pytest.raises(UncertaintyInputError, match=r"\(N, D\)"):
        sample_gaussian(torch.zeros(2, 3), torch.zeros(2, 2), 4)


def test_mutual_information_keeps_its_precision_at_high_temperature():
    """float32 distances at T=10: MI ~1e-6 nats must still match the float64 loop closely."""
    distances = np.random.default_rng(4).uniform(0, 0.1, size=(16, 20, 100)).astype(np.float32)
    got = mutual_information(torch.from_numpy(distances), temperature=10.0).numpy()
    expected = loop_mutual_information(distances.astype(np.float64), 10.0)
    assert expected.max() < 1e-5
    np.testing.assert_allclose(got, expected, rtol=1e-3)
    assert len(np.unique(got)) == len(got)
