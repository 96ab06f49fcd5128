"""PVSE losses: MIL triplet loss on the best of K x K pairs, diversity, MMD (paper eq. 5)."""

from __future__ import annotations

import torch

from models.objectives.hinge import Negatives, hinge_triplet_loss
from models.pvse.max_pair import max_pair_similarity
from models.pvse.network import PvseOutput

DEFAULT_DIV_WEIGHT = 0.1  # lambda_1 (the paper sweeps 0.1, 0.01, 0.001)
DEFAULT_MMD_WEIGHT = 0.01  # lambda_2
RBF_GAMMA = 0.5  # kernel exp(-gamma ||a - b||^2) on unit vectors (bandwidth sigma = 1)


def diversity_loss(maps: torch.Tensor) -> torch.Tensor:
    """mean_n ||G_n - I||_F / K^2 with G_n the Gram matrix of item n's K L2-normalised rows.

    maps: (N, K, R), e.g. the K attention maps over R local features. The diagonal of G is 1,
    so this is the norm of the off-diagonal correlations: 0 iff the K rows are orthogonal.
    """
    rows = torch.nn.functional.normalize(maps, dim=-1)  # (N, K, R)
    gram = rows @ rows.transpose(1, 2)  # (N, K, K)
    eye = torch.eye(maps.shape[1], device=maps.device, dtype=maps.dtype)
    return (gram - eye).flatten(1).norm(dim=-1).mean() / maps.shape[1] ** 2


def mmd_rbf(x: torch.Tensor, y: torch.Tensor, gamma: float = RBF_GAMMA) -> torch.Tensor:
    """Squared MMD, biased estimate: mean k(x, x') + mean k(y, y') - 2 mean k(x, y) with the
    RBF kernel k(a, b) = exp(-gamma ||a - b||^2); x (P, D), y (Q, D) samples of each side."""

    def kernel_mean(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.exp(-gamma * torch.cdist(a, b).square()).mean()

    return kernel_mean(x, x) + kernel_mean(y, y) - 2.0 * kernel_mean(x, y)


def pvse_loss(
    image: PvseOutput,
    caption: PvseOutput,
    caption_image: torch.Tensor,
    matches: torch.Tensor | None,
    margin: float,
    negatives: Negatives,
    div_weight: float = DEFAULT_DIV_WEIGHT,
    mmd_weight: float = DEFAULT_MMD_WEIGHT,
    caption_side_matches: bool = True,
) -> torch.Tensor:
    """L_mil + div_weight * L_div + mmd_weight * L_mmd for a batch of B images and M captions.

    L_mil is models.objectives' hinge triplet loss on the best-pair similarity (so negatives
    and plausible `matches` work as for the other types); L_div sums both modalities' attention
    maps' diversity terms (eq. 7; on backbones the K residual heads', PvseOutput.attention);
    L_mmd compares all K * B image and K * M caption embeddings.
    """
    similarity = max_pair_similarity(image.embeddings, caption.embeddings)  # (B, M)
    loss = hinge_triplet_loss(
        similarity, caption_image, margin, negatives, matches, caption_side_matches
    )
    if div_weight > 0:
        diversity = diversity_loss(image.attention) + diversity_loss(caption.attention)
        loss = loss + div_weight * diversity
    if mmd_weight > 0:
        dim = image.embeddings.shape[-1]
        mmd = mmd_rbf(image.embeddings.reshape(-1, dim), caption.embeddings.reshape(-1, dim))
        loss = loss + mmd_weight * mmd
    return loss
