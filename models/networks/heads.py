"""Mean and log-variance heads (duplicated, no shared parameters) and the MC-dropout masks."""

from __future__ import annotations

import math

import torch
from torch import nn

from models.networks.model_config import ModelConfig


def dropout_masks(
    shape: tuple[int, ...],
    p: float,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Inverted-dropout multipliers: each entry is 0 with probability p, else 1 / (1 - p).

    A mask of ones is the deterministic (no dropout) pass. Encoders multiply by the mask,
    so no randomness lives inside a forward pass or an exported graph.
    """
    if p == 0.0:
        return torch.ones(shape, device=device)
    keep = torch.rand(shape, generator=generator, device=device) >= p
    return keep.float() / (1.0 - p)


class GaussianHeads(nn.Module):
    """Maps features (M, F) to (mu, logvar), each (M, D).

    The mean head and the log-variance head have the same architecture and separate
    parameters (Pishdad et al.). The log-variance is the head's output, offset so that a new
    model starts at `logvar_init`, passed through soft_clamp: the identity inside
    [ln var_min, ln var_max] with a gradient that fades only at those safety bounds. (A
    sigmoid spanning a narrow [0.1, 10] froze at its lower bound in the first epoch: the
    objective, e.g. a VIB term, must set the variance, not the parameterisation.) Covariance
    shapes:
    "ellipsoidal" (D values), "spherical-avgpool" (mean of D raw outputs, broadcast) and
    "spherical-one-value" (one raw output, broadcast). A point head (gaussian=False) has no
    variance head and returns the constant `point_logvar`.
    """

    def __init__(
        self,
        in_features: int,
        config: ModelConfig,
        gaussian: bool,
        variance_in_features: int | None = None,
    ) -> None:
        super().__init__()
        dim = config.embed_dim
        self.embed_dim = dim
        self.normalize_mu = config.normalize_mu
        self.gaussian = gaussian
        self.covariance = config.covariance
        self.logvar_min, self.logvar_max = config.logvar_bounds
        self.logvar_init = config.logvar_init
        self.variance_reads_only = config.variance_reads_only
        self.point_logvar = config.point_logvar
        self.mu_head = nn.Linear(in_features, dim)
        if gaussian:
            out = 1 if config.covariance == "spherical-one-value" else dim
            variance_in = variance_in_features or in_features
            self.logvar_head: nn.Linear | None = nn.Linear(variance_in, out)
        else:
            self.logvar_head = None

    def mean(self, features: torch.Tensor) -> torch.Tensor:
        """features (M, F) -> mu (M, D), without the log-variance head."""
        mu = self.mu_head(features)
        return nn.functional.normalize(mu, dim=-1) if self.normalize_mu else mu

    def forward(
        self, features: torch.Tensor, variance_features: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """features (M, F) -> mu, logvar (M, D); the log-variance head reads
        `variance_features` (M, F') instead when given."""
        mu = self.mean(features)  # (M, D)
        if self.logvar_head is None:
            return mu, torch.full_like(mu, self.point_logvar)
        if variance_features is not None:
            features = variance_features
        if self.variance_reads_only:
            features = features.detach()
        raw = self.logvar_head(features)  # (M, D) or (M, 1)
        if self.covariance == "spherical-avgpool":
            raw = raw.mean(dim=-1, keepdim=True)  # (M, 1)
        logvar = soft_clamp(raw + self.logvar_init, self.logvar_min, self.logvar_max)
        return mu, logvar.expand_as(mu)


def soft_clamp(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """low + softplus(x - low) - softplus(x - high): about x well inside (low, high), never
    outside it, with gradient sigmoid(x - low) - sigmoid(x - high). (The final clamp only
    removes float round-off for huge |x|.)"""
    soft = low + nn.functional.softplus(x - low) - nn.functional.softplus(x - high)
    return soft.clamp(low, high)


def fraction_at_bound(
    logvar: torch.Tensor, low: float, high: float, tolerance: float = 0.05
) -> float:
    """Fraction of items (rows of (N, D)) with a log-variance within `tolerance` of a bound."""
    near = (logvar <= low + tolerance) | (logvar >= high - tolerance)  # (N, D)
    return float(near.any(dim=-1).float().mean()) if logvar.numel() else 0.0


def init_linear(module: nn.Module) -> None:
    """Xavier-uniform weights and zero biases for every Linear layer (VSE++ style)."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            bound = math.sqrt(6.0 / (layer.in_features + layer.out_features))
            nn.init.uniform_(layer.weight, -bound, bound)
            nn.init.zeros_(layer.bias)
