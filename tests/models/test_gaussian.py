"""Every Gaussian distance against an independent implementation, pairwise and elementwise."""

import math

import numpy as np
import ot
import pytest
import torch
from scipy import integrate, optimize, stats
from scipy.spatial.distance import mahalanobis as scipy_mahalanobis
from torch.distributions import Independent, Normal, kl_divergence

from models.distance import gaussian
from models.distance.gaussian import (
    METRICS,
    GaussianInputError,
    UnknownMetricError,
    elementwise_distance,
    match_prob_noise,
    pairwise_distance,
)

LOGVAR_MIN, LOGVAR_MAX = math.log(1e-4), math.log(1e4)


def random_gaussians(n: int, dim: int, seed: int, extreme: bool = True):
    """mu ~ N(0, 2^2); variances log-uniform in [1e-4, 1e4] (extreme) or [e^-2, e^2]."""
    rng = np.random.default_rng(seed)
    low, high = (LOGVAR_MIN, LOGVAR_MAX) if extreme else (-2.0, 2.0)
    mu = torch.from_numpy(rng.normal(0.0, 2.0, size=(n, dim)))
    logvar = torch.from_numpy(rng.uniform(low, high, size=(n, dim)))
    return mu, logvar


def all_pairs(mu_q, logvar_q, mu_g, logvar_g):
    """Expand (Q, D) x (G, D) to aligned (Q*G, D) pairs, query-major."""
    num_q, num_g = mu_q.shape[0], mu_g.shape[0]
    return (
        mu_q.repeat_interleave(num_g, 0),
        logvar_q.repeat_interleave(num_g, 0),
        mu_g.repeat(num_q, 1),
        logvar_g.repeat(num_q, 1),
    )


def torch_kl(mu_a, logvar_a, mu_b, logvar_b) -> torch.Tensor:
    """KL(a || b) by torch.distributions, pairwise (A, B)."""
    a = Independent(Normal(mu_a[:, None], torch.exp(0.5 * logvar_a)[:, None]), 1)
    b = Independent(Normal(mu_b[None], torch.exp(0.5 * logvar_b)[None]), 1)
    return kl_divergence(a, b)


@pytest.fixture(scope="module")
def extreme():
    mu_q, logvar_q = random_gaussians(7, 6, seed=1)
    mu_g, logvar_g = random_gaussians(9, 6, seed=2)
    return mu_q, logvar_q, mu_g, logvar_g


# ---- KL family against torch.distributions ----------------------------------------------------


def test_kl_matches_torch_distributions(extreme):
    expected = torch_kl(*extreme)
    got = pairwise_distance("kl", *extreme)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-7)


def test_kl_reverse_matches_torch_distributions(extreme):
    mu_q, logvar_q, mu_g, logvar_g = extreme
    expected = torch_kl(mu_g, logvar_g, mu_q, logvar_q).T
    got = pairwise_distance("kl_reverse", *extreme)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-7)


def test_js_is_mean_of_both_kls_from_torch_distributions(extreme):
    mu_q, logvar_q, mu_g, logvar_g = extreme
    expected = 0.5 * (torch_kl(*extreme) + torch_kl(mu_g, logvar_g, mu_q, logvar_q).T)
    torch.testing.assert_close(pairwise_distance("js", *extreme), expected, rtol=1e-9, atol=1e-7)


def test_min_kl_matches_brute_force_loop(extreme):
    mu_q, logvar_q, mu_g, logvar_g = extreme
    got = pairwise_distance("min_kl", *extreme)
    for i in range(mu_q.shape[0]):
        for j in range(mu_g.shape[0]):
            q = Independent(Normal(mu_q[i], torch.exp(0.5 * logvar_q[i])), 1)
            g = Independent(Normal(mu_g[j], torch.exp(0.5 * logvar_g[j])), 1)
            expected = min(kl_divergence(q, g).item(), kl_divergence(g, q).item())
            assert got[i, j].item() == pytest.approx(expected, rel=1e-9, abs=1e-7)


# ---- W2 against POT, CSD against Monte Carlo, Mahalanobis against scipy -----------------------


def test_w2_matches_pot_bures_wasserstein(extreme):
    mu_q, logvar_q, mu_g, logvar_g = extreme
    cov_q = np.stack([np.diag(v) for v in torch.exp(logvar_q).numpy()])  # (Q, D, D)
    cov_g = np.stack([np.diag(v) for v in torch.exp(logvar_g).numpy()])  # (G, D, D)
    w = ot.gaussian.bures_wasserstein_distance(mu_q.numpy(), mu_g.numpy(), cov_q, cov_g)
    got = pairwise_distance("w2", *extreme).numpy()
    np.testing.assert_allclose(got, w**2, rtol=1e-7, atol=1e-6)


def test_w2_uses_standard_deviations_not_variances():
    mu = torch.zeros(1, 1, dtype=torch.float64)
    var_q, var_g = 4.0, 9.0  # sigma 2 and 3: W2^2 = (3 - 2)^2 = 1, not (9 - 4)^2 = 25
    got = pairwise_distance(
        "w2", mu, torch.tensor([[math.log(var_q)]]), mu, torch.tensor([[math.log(var_g)]])
    )
    assert got.item() == pytest.approx(1.0)


def test_csd_matches_monte_carlo_expectation(extreme):
    mu_q, logvar_q, mu_g, logvar_g = (t[:6] for t in extreme)
    rng = np.random.default_rng(3)
    num_draws = 200_000
    got = elementwise_distance("csd", mu_q, logvar_q, mu_g, logvar_g).numpy()
    for i in range(mu_q.shape[0]):
        z_q = mu_q[i].numpy() + np.exp(0.5 * logvar_q[i].numpy()) * rng.standard_normal(
            (num_draws, mu_q.shape[1])
        )
        z_g = mu_g[i].numpy() + np.exp(0.5 * logvar_g[i].numpy()) * rng.standard_normal(
            (num_draws, mu_g.shape[1])
        )
        sq = ((z_q - z_g) ** 2).sum(axis=1)
        standard_error = sq.std() / math.sqrt(num_draws)
        assert abs(sq.mean() - got[i]) < 5 * standard_error, (i, sq.mean(), got[i])


def test_mahalanobis_matches_scipy_and_ignores_query_logvar(extreme):
    mu_q, logvar_q, mu_g, logvar_g = extreme
    got = pairwise_distance("mahalanobis", *extreme)
    other_logvar = pairwise_distance(
        "mahalanobis", mu_q, torch.zeros_like(logvar_q), mu_g, logvar_g
    )
    torch.testing.assert_close(got, other_logvar)
    for i in range(mu_q.shape[0]):
        for j in range(mu_g.shape[0]):
            inverse_cov = np.diag(np.exp(-logvar_g[j].numpy()))
            root = scipy_mahalanobis(mu_q[i].numpy(), mu_g[j].numpy(), inverse_cov)
            assert got[i, j].item() == pytest.approx(root**2, rel=1e-9)


def test_query_mahalanobis_is_the_gallery_mean_under_the_query_by_torch_log_prob(extreme):
    """-2 ln N(mu_g; mu_q, S_q) minus its normaliser, by torch.distributions."""
    mu_q, logvar_q, mu_g, logvar_g = extreme
    query = Independent(Normal(mu_q[:, None], torch.exp(0.5 * logvar_q)[:, None]), 1)
    log_prob = query.log_prob(mu_g[None])  # (Q, G)
    normaliser = 0.5 * (logvar_q.sum(-1) + mu_q.shape[1] * math.log(2 * math.pi))  # (Q,)
    expected = -2.0 * (log_prob + normaliser[:, None])
    got = pairwise_distance("query_mahalanobis", *extreme)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-7)
    moved = pairwise_distance("query_mahalanobis", mu_q, logvar_q, mu_g, logvar_g + 3.0)
    torch.testing.assert_close(moved, got)


# ---- Bhattacharyya and ELK against 1-D numerical integration ----------------------------------


def log_integral_1d(log_integrand, mu_a: float, mu_b: float, sigma_min: float) -> float:
    """ln of the integral of exp(log_integrand) over the real line, by scipy quad.

    The integrand is scaled by its maximum (found numerically between the two means), so the
    logarithm stays accurate where the integral itself underflows.
    """
    low, high = min(mu_a, mu_b), max(mu_a, mu_b)
    if high - low < 1e-12:
        peak = low
    else:
        found = optimize.minimize_scalar(
            lambda x: -log_integrand(x),
            bounds=(low, high),
            method="bounded",
            options={"xatol": 1e-4 * sigma_min},
        )
        peak = found.x
    log_peak = log_integrand(peak)
    width = 60.0 * sigma_min  # the integrand's spread is at most sqrt(2) * sigma_min
    value, _ = integrate.quad(
        lambda x: math.exp(log_integrand(x) - log_peak),
        peak - width,
        peak + width,
        points=[peak],
        epsabs=0.0,
        epsrel=1e-11,
        limit=200,
    )
    return log_peak + math.log(value)


def integrated_distances(mu_q, logvar_q, mu_g, logvar_g):
    """(Bhattacharyya, -ln ELK) of aligned pairs, each a sum of 1-D integrals over dims."""
    bhattacharyya, elk = [], []
    for i in range(mu_q.shape[0]):
        total_b = total_e = 0.0
        for d in range(mu_q.shape[1]):
            m_q, m_g = mu_q[i, d].item(), mu_g[i, d].item()
            s_q, s_g = math.exp(0.5 * logvar_q[i, d].item()), math.exp(0.5 * logvar_g[i, d].item())
            p = stats.norm(m_q, s_q)
            g = stats.norm(m_g, s_g)
            sigma_min = min(s_q, s_g)
            total_b -= log_integral_1d(
                lambda x, p=p, g=g: 0.5 * (p.logpdf(x) + g.logpdf(x)), m_q, m_g, sigma_min
            )
            total_e -= log_integral_1d(
                lambda x, p=p, g=g: p.logpdf(x) + g.logpdf(x), m_q, m_g, sigma_min
            )
        bhattacharyya.append(total_b)
        elk.append(total_e)
    return np.array(bhattacharyya), np.array(elk)


@pytest.fixture(scope="module")
def integration_case():
    mu_q, logvar_q = random_gaussians(10, 3, seed=4)
    mu_g, logvar_g = random_gaussians(10, 3, seed=5)
    # one pair with identical Gaussians, one with identical variances and distinct means
    mu_g[0], logvar_g[0] = mu_q[0], logvar_q[0]
    logvar_g[1] = logvar_q[1]
    pairs = (mu_q, logvar_q, mu_g, logvar_g)
    return pairs, integrated_distances(*pairs)


def test_bhattacharyya_matches_numerical_integration(integration_case):
    pairs, (expected, _) = integration_case
    got = elementwise_distance("bhattacharyya", *pairs).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-7)


def test_elk_matches_numerical_integration(integration_case):
    pairs, (_, expected) = integration_case
    got = elementwise_distance("elk", *pairs).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-7)


# ---- PCME match probability against a brute-force loop ----------------------------------------


def brute_force_match_prob(mu_q, logvar_q, mu_g, logvar_g, num_samples, a, b, seed):
    """-ln mean_{j,k} sigmoid(-a ||z_q^j - z_g^k|| + b), one pair at a time, in Python floats."""
    eps_q, eps_g = match_prob_noise(num_samples, mu_q.shape[1], seed=seed)
    out = np.zeros((mu_q.shape[0], mu_g.shape[0]))
    for i in range(mu_q.shape[0]):
        z_q = [mu_q[i] + torch.exp(0.5 * logvar_q[i]) * e for e in eps_q]
        for j in range(mu_g.shape[0]):
            z_g = [mu_g[j] + torch.exp(0.5 * logvar_g[j]) * e for e in eps_g]
            total = 0.0
            for zq in z_q:
                for zg in z_g:
                    distance = math.sqrt(
                        sum((x - y) ** 2 for x, y in zip(zq.tolist(), zg.tolist(), strict=True))
                    )
                    total += 1.0 / (1.0 + math.exp(a * distance - b))
            out[i, j] = -math.log(total / num_samples**2)
    return out


def test_match_prob_matches_brute_force_loop():
    mu_q, logvar_q = random_gaussians(4, 5, seed=6, extreme=False)
    mu_g, logvar_g = random_gaussians(5, 5, seed=7, extreme=False)
    params = {"num_samples": 6, "a": 1.5, "b": 4.0, "seed": 11}
    got = pairwise_distance("match_prob", mu_q, logvar_q, mu_g, logvar_g, **params).numpy()
    expected = brute_force_match_prob(mu_q, logvar_q, mu_g, logvar_g, **params)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)


def test_match_prob_is_seeded():
    mu_q, logvar_q = random_gaussians(3, 4, seed=8, extreme=False)
    mu_g, logvar_g = random_gaussians(4, 4, seed=9, extreme=False)
    args = (mu_q, logvar_q, mu_g, logvar_g)
    first = pairwise_distance("match_prob", *args, seed=5)
    torch.testing.assert_close(pairwise_distance("match_prob", *args, seed=5), first)
    generator = torch.Generator().manual_seed(5)
    torch.testing.assert_close(pairwise_distance("match_prob", *args, generator=generator), first)
    assert not torch.allclose(pairwise_distance("match_prob", *args, seed=6), first)


def test_match_prob_converges_to_the_sampled_probability():
    # With many samples the estimate approaches an independent Monte Carlo estimate.
    mu_q, logvar_q = random_gaussians(2, 3, seed=10, extreme=False)
    mu_g, logvar_g = random_gaussians(2, 3, seed=11, extreme=False)
    got = elementwise_distance(
        "match_prob", mu_q, logvar_q, mu_g, logvar_g, num_samples=300, a=1.0, b=2.0
    ).numpy()
    rng = np.random.default_rng(12)
    for i in range(2):
        z_q = mu_q[i].numpy() + np.exp(0.5 * logvar_q[i].numpy()) * rng.standard_normal(
            (200_000, 3)
        )
        z_g = mu_g[i].numpy() + np.exp(0.5 * logvar_g[i].numpy()) * rng.standard_normal(
            (200_000, 3)
        )
        p = 1.0 / (1.0 + np.exp(np.linalg.norm(z_q - z_g, axis=1) - 2.0))
        assert math.exp(-got[i]) == pytest.approx(p.mean(), abs=0.03)


def test_match_prob_rejects_bad_parameters():
    mu, logvar = random_gaussians(2, 3, seed=13)
    with pytest.raises(GaussianInputError, match="num_samples"):
        pairwise_distance("match_prob", mu, logvar, mu, logvar, num_samples=0)
    with pytest.raises(GaussianInputError, match="a must be > 0"):
        pairwise_distance("match_prob", mu, logvar, mu, logvar, a=-1.0)
    with pytest.raises(GaussianInputError, match="unknown match_prob parameters"):
        pairwise_distance("match_prob", mu, logvar, mu, logvar, temperature=1.0)
    with pytest.raises(GaussianInputError, match="not both"):
        pairwise_distance("match_prob", mu, logvar, mu, logvar, seed=1, generator=torch.Generator())


# ---- shared behaviour of all metrics ---------------------------------------------------------


@pytest.mark.parametrize("metric", METRICS)
def test_pairwise_equals_elementwise_on_all_pairs(metric, extreme):
    pairwise = pairwise_distance(metric, *extreme)  # (Q, G)
    elementwise = elementwise_distance(metric, *all_pairs(*extreme))  # (Q*G,)
    scale = pairwise.abs().max().item()
    torch.testing.assert_close(
        elementwise.reshape(pairwise.shape), pairwise, rtol=1e-9, atol=1e-11 * scale
    )


@pytest.mark.parametrize("metric", METRICS)
def test_float32_agrees_with_float64(metric, extreme):
    exact = pairwise_distance(metric, *extreme)
    single = pairwise_distance(metric, *(t.float() for t in extreme))
    assert single.dtype == torch.float32
    torch.testing.assert_close(single.double(), exact, rtol=1e-4, atol=1e-6 * exact.abs().max())


@pytest.mark.parametrize("metric", METRICS)
def test_float16_inputs_are_upcast_and_agree_with_float32(metric):
    mu_q, logvar_q = random_gaussians(6, 8, seed=14, extreme=False)
    mu_g, logvar_g = random_gaussians(7, 8, seed=15, extreme=False)
    half = [t.half() for t in (mu_q, logvar_q, mu_g, logvar_g)]
    got = pairwise_distance(metric, *half)
    assert got.dtype == torch.float32
    # exactly the float32 computation on the rounded inputs ...
    torch.testing.assert_close(got, pairwise_distance(metric, *(t.float() for t in half)))
    # ... and close to the float32 result: rounding mu and logvar to float16 moves it by ~1e-3
    full = pairwise_distance(metric, *(t.float() for t in (mu_q, logvar_q, mu_g, logvar_g)))
    torch.testing.assert_close(got, full, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("metric", METRICS)
def test_chunked_pairwise_equals_single_block(metric, extreme, monkeypatch):
    whole = pairwise_distance(metric, *extreme)
    monkeypatch.setattr(gaussian, "_MAX_CHUNK_ELEMENTS", 1)  # one query per block
    torch.testing.assert_close(pairwise_distance(metric, *extreme), whole)


@pytest.mark.parametrize("metric", METRICS)
def test_distances_are_differentiable(metric):
    mu_q, logvar_q = (t.float().requires_grad_() for t in random_gaussians(3, 4, seed=16))
    mu_g, logvar_g = (t.float().requires_grad_() for t in random_gaussians(5, 4, seed=17))
    pairwise_distance(metric, mu_q, logvar_q, mu_g, logvar_g).sum().backward()
    read_logvar = logvar_q if metric == "query_mahalanobis" else logvar_g  # one reads only q's
    for tensor in (mu_q, mu_g, read_logvar):
        assert tensor.grad is not None and torch.isfinite(tensor.grad).all()


def test_empty_inputs_give_empty_outputs():
    mu, logvar = random_gaussians(3, 4, seed=18)
    empty = torch.zeros(0, 4, dtype=torch.float64)
    assert pairwise_distance("kl", empty, empty, mu, logvar).shape == (0, 3)
    assert pairwise_distance("match_prob", mu, logvar, empty, empty).shape == (3, 0)
    assert elementwise_distance("elk", empty, empty, empty, empty).shape == (0,)


def test_unknown_metric_names_the_choices():
    mu, logvar = random_gaussians(2, 3, seed=19)
    with pytest.raises(UnknownMetricError, match="unknown metric 'cosine'; choose one of w2"):
        pairwise_distance("cosine", mu, logvar, mu, logvar)
    assert issubclass(UnknownMetricError, ValueError)


def test_bad_shapes_and_parameters_are_rejected():
    mu, logvar = random_gaussians(3, 4, seed=20)
    with pytest.raises(GaussianInputError, match="same shape"):
        pairwise_distance("w2", mu, logvar[:, :3], mu, logvar)
    with pytest.raises(GaussianInputError, match="dimensions differ"):
        pairwise_distance("w2", mu, logvar, mu[:, :3], logvar[:, :3])
    with pytest.raises(GaussianInputError, match="use pairwise_distance"):
        elementwise_distance("w2", mu, logvar, mu[:2], logvar[:2])
    with pytest.raises(GaussianInputError, match="2-D"):
        pairwise_distance("w2", mu[0], logvar[0], mu, logvar)
    with pytest.raises(GaussianInputError, match="takes no parameters"):
        pairwise_distance("kl", mu, logvar, mu, logvar, num_samples=3)


@pytest.mark.parametrize("metric", [m for m in METRICS if m != "match_prob"])
def test_matmul_pairwise_is_each_problems_elementwise_distance(metric: str) -> None:
    """B independent (P x R) problems at once against elementwise_distance of every pair of
    each, in float64 (moderate variances: the expansions' round-off is tested on extremes by
    the pairwise tests above)."""
    mu, logvar = random_gaussians(3 * (4 + 5), 6, seed=11, extreme=False)
    mu_q, mu_g = mu[:12].reshape(3, 4, 6), mu[12:].reshape(3, 5, 6)
    logvar_q, logvar_g = logvar[:12].reshape(3, 4, 6), logvar[12:].reshape(3, 5, 6)
    got = gaussian.matmul_pairwise_distance(metric, mu_q, logvar_q, mu_g, logvar_g)
    assert got.shape == (3, 4, 5) and got.dtype == torch.float64
    for b in range(3):
        pairs = all_pairs(mu_q[b], logvar_q[b], mu_g[b], logvar_g[b])
        expected = elementwise_distance(metric, *pairs).reshape(4, 5)
        torch.testing.assert_close(got[b], expected, rtol=1e-9, atol=1e-9)


def test_matmul_pairwise_refuses_match_prob() -> None:
    mu, logvar = random_gaussians(4, 3, seed=0)
    with pytest.raises(GaussianInputError, match="match_prob samples"):
        gaussian.matmul_pairwise_distance(
            "match_prob", mu[None], logvar[None], mu[None], logvar[None]
        )
