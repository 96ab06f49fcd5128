"""Regularisers of PCME (Chun et al., supplementary A): the variational information bottleneck
KL(N(mu, sigma^2) || N(0, I)) and the uniformity of the means on the unit sphere."""

from __future__ import annotations

import math

import torch


def vib_loss(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """Mean over items of KL(N(mu, diag(exp(logvar))) || N(0, I)), summed over dims: (N, D) -> ().

    This is what gives the variance a job: without it nothing in a matching loss keeps the
    variance away from whatever value makes the loss flat.
    """
    kl = 0.5 * (logvar.exp() + mu.pow(2) - 1.0 - logvar).sum(dim=-1)  # (N,)
    return kl.mean()


def uniformity_loss(mu: torch.Tensor, t: float = 2.0) -> torch.Tensor:
    """Wang and Isola's uniformity, ln mean_{i != j} exp(-t ||mu_i - mu_j||^2): (N, D) -> ()."""
    count = mu.shape[0]
    if count < 2:
        return mu.new_zeros(())
    sq = torch.cdist(mu, mu).pow(2)  # (N, N)
    off_diagonal = ~torch.eye(count, dtype=torch.bool, device=mu.device)
    return torch.logsumexp(-t * sq[off_diagonal], dim=0) - math.log(count * (count - 1))
