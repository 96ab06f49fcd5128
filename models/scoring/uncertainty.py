"""Uncertainty of diagonal Gaussian embeddings and of retrieval over MC draws (DESIGN section 3)."""

import math

import torch
from torch import Tensor


class UncertaintyInputError(ValueError):
    """Tensors or parameters that an uncertainty measure cannot use."""


def log_det(logvar: Tensor) -> Tensor:
    """ln det(diag(sigma^2)) = sum of logvar over the last dim: (..., D) -> (...,)."""
    return _float(logvar).sum(dim=-1)


def entropy(logvar: Tensor) -> Tensor:
    """Differential entropy in nats, 0.5 * (D * (1 + ln 2pi) + log_det): (..., D) -> (...,)."""
    logvar = _float(logvar)
    dim = logvar.shape[-1]
    return 0.5 * (dim * (1.0 + math.log(2.0 * math.pi)) + logvar.sum(dim=-1))


def total_variance(logvar: Tensor) -> Tensor:
    """Trace of diag(sigma^2), the sum of the variances over the last dim: (..., D) -> (...,).

    PCME++'s own uncertainty (its csd adds it to every distance); the log-det weighs each
    dimension's variance by its log instead, so a few small variances can outweigh it.
    """
    return _float(logvar).exp().sum(dim=-1)


def feature_uncertainty(mc_mu: Tensor) -> Tensor:
    """Sum over dims of the variance of mu across MC draws: (L, N, D) -> (N,).

    The population variance (divide by L), so a single draw gives 0.
    """
    mc_mu = _float(mc_mu)
    if mc_mu.ndim != 3 or mc_mu.shape[0] == 0:
        raise UncertaintyInputError(
            f"mc_mu must be (L, N, D) with L >= 1 draws; got shape {tuple(mc_mu.shape)}"
        )
    return mc_mu.var(dim=0, correction=0).sum(dim=-1)


def retrieval_posterior(distances: Tensor, temperature: float) -> Tensor:
    """softmax(-d / T) over the candidates (last dim): (..., M) -> (..., M).

    An infinite distance (a padded candidate) gets probability 0; every row needs at least one
    finite distance.
    """
    distances = _float(distances)
    _check_temperature(temperature)
    if distances.shape[-1] == 0:
        raise UncertaintyInputError("distances need at least one candidate (last dim M >= 1)")
    if torch.isnan(distances).any():
        raise UncertaintyInputError("distances contain NaN")
    if not torch.isfinite(distances).any(dim=-1).all():
        raise UncertaintyInputError("every row of distances needs at least one finite value")
    return torch.softmax(-distances / temperature, dim=-1)


def mutual_information(distances: Tensor, temperature: float) -> Tensor:
    """Mutual information of the retrieval posterior across MC draws: (L, Q, M) -> (Q,) nats.

    With p_l = softmax(-d_l / T): MI = H(mean_l p_l) - mean_l H(p_l), in [0, ln M]; 0 when all
    draws give the same posterior.
    """
    if distances.ndim != 3:
        raise UncertaintyInputError(
            f"distances must be (L draws, Q queries, M candidates); got {tuple(distances.shape)}"
        )
    retrieval_posterior(distances, temperature)  # validates the input
    # MI = mean_l KL(p_l || mean p), a mean of non-negative terms, in float64: at high T the
    # posteriors differ by less than float32's resolution and H(mean) - mean H cancels to noise.
    log_p = torch.log_softmax(-distances.double() / temperature, dim=-1)  # (L, Q, M)
    log_mean = torch.logsumexp(log_p, dim=0) - math.log(distances.shape[0])  # (Q, M)
    terms = torch.where(log_p > -math.inf, log_p.exp() * (log_p - log_mean), 0.0)  # (L, Q, M)
    # The mean over draws runs along a contiguous last dim, as it does for a single query:
    # torch sums an outer dim in another order, which would move a query's last bit with Q.
    mi = terms.sum(dim=-1).T.contiguous().mean(dim=-1)  # (Q,)
    # Exact MI lies in [0, ln M]; remove round-off outside it.
    dtype = distances.dtype if distances.is_floating_point() else torch.float32
    return mi.clamp(min=0.0, max=math.log(distances.shape[-1])).to(dtype)


def sample_gaussian(
    mu: Tensor, logvar: Tensor, num_samples: int, generator: torch.Generator | None = None
) -> Tensor:
    """Draws mu + sigma * eps from each Gaussian: (N, D) -> (L, N, D), L = num_samples.

    Noise comes from `generator` (a fresh one seeded with 0 when None) on the generator's
    device and is moved to mu's device, so the same seed gives the same draws on any device.
    """
    mu, logvar = _float(mu), _float(logvar)
    if mu.shape != logvar.shape or mu.ndim != 2:
        raise UncertaintyInputError(
            f"mu and logvar must both be (N, D); got {tuple(mu.shape)} and {tuple(logvar.shape)}"
        )
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise UncertaintyInputError(f"num_samples must be an integer >= 1; got {num_samples!r}")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    eps = torch.randn(
        (num_samples, *mu.shape), generator=generator, dtype=mu.dtype, device=generator.device
    ).to(mu.device)  # (L, N, D)
    return mu[None] + torch.exp(0.5 * logvar)[None] * eps


def _check_temperature(temperature: float) -> None:
    if not math.isfinite(float(temperature)) or float(temperature) <= 0:
        raise UncertaintyInputError(f"temperature must be a finite number > 0; got {temperature}")


def _float(tensor: Tensor) -> Tensor:
    """float64 stays float64; anything else (float16, bfloat16, ints) is computed in float32."""
    tensor = torch.as_tensor(tensor)
    return tensor if tensor.dtype == torch.float64 else tensor.to(torch.float32)
