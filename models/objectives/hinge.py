"""Hinge triplet losses (VSE++ hardest negative, or sum over negatives) on the similarity of
each model type: -distance from models.distance.gaussian, or cosine for the point baseline."""

from __future__ import annotations

from typing import Literal

import torch

from models.distance.gaussian import pairwise_distance

Negatives = Literal["hardest", "sum"]
NEGATIVES: tuple[str, ...] = ("hardest", "sum")
DEFAULT_MARGIN = 0.2


def similarity_matrix(
    model_type: str,
    metric: str,
    image_mu: torch.Tensor,
    image_logvar: torch.Tensor,
    caption_mu: torch.Tensor,
    caption_logvar: torch.Tensor,
    **params: object,
) -> torch.Tensor:
    """Similarity of every image to every caption, (N_img, D) x (N_cap, D) -> (N_img, N_cap).

    "cosine" is the dot product of the (unit) means; any other metric gives
    -pairwise_distance(metric, image, caption), so kl is -KL(image || caption) as in
    Pishdad et al. For mahalanobis the Gaussian modality supplies the variance: captions
    for gce, images for gie. `params` go to models.distance.gaussian (match_prob's a, b, seed).
    """
    if metric == "cosine":
        return image_mu @ caption_mu.T  # (N_img, N_cap)
    if metric == "mahalanobis" and model_type == "gie":
        return -pairwise_distance(metric, caption_mu, caption_logvar, image_mu, image_logvar).T
    return -pairwise_distance(metric, image_mu, image_logvar, caption_mu, caption_logvar, **params)


def hinge_triplet_loss(
    similarity: torch.Tensor,
    caption_image: torch.Tensor,
    margin: float = DEFAULT_MARGIN,
    negatives: Negatives = "hardest",
    matches: torch.Tensor | None = None,
    caption_side_matches: bool = True,
) -> torch.Tensor:
    """Bidirectional hinge triplet loss over the matching pairs of a batch (VSE++).

    Args:
        similarity: (N_img, N_cap), images of the batch (all distinct) against its captions.
        caption_image: (N_cap,) int64, the row of each caption's own image; every caption j
            forms one matching pair (caption_image[j], j). With one caption per image
            (caption_image = arange(N)) this is exactly the loss of VSE++.
        margin: the hinge margin alpha.
        negatives: "hardest" keeps only the most violating negative of each pair and
            direction (max violation); "sum" adds the violations of all negatives.

    Negatives of a pair are the other images (for its caption) and the captions of other
    images (for its image); another caption of the same image is never a negative. With
    `matches` (N_img, N_cap) bool, no matching pair is a negative either (e.g. a caption that
    plausibly describes another image of the batch); with `caption_side_matches` False only the
    images of a caption are spared, and an image still ranks its own captions above every
    other caption (so a vague caption that fits many images does not rise to the top).
    Returns the mean over pairs of the two directions' hinge terms.
    """
    if negatives not in NEGATIVES:
        raise ValueError(f"unknown negatives {negatives!r}; choose one of {', '.join(NEGATIVES)}")
    num_images = similarity.shape[0]
    own = torch.arange(num_images, device=similarity.device)[:, None] == caption_image
    positive = own if matches is None else own | matches
    matched = similarity.gather(0, caption_image[None, :]).squeeze(0)  # (N_cap,)
    image_cost = (margin + similarity - matched[None, :]).clamp(min=0)  # (N_img, N_cap)
    image_cost = image_cost.masked_fill(positive, 0.0)
    pair_rows = similarity[caption_image]  # (N_cap, N_cap): s(image of pair j, caption j')
    caption_cost = (margin + pair_rows - matched[:, None]).clamp(min=0)
    own_or_match = positive if caption_side_matches else own
    caption_cost = caption_cost.masked_fill(own_or_match[caption_image], 0.0)
    if negatives == "hardest":
        per_pair = image_cost.max(dim=0).values + caption_cost.max(dim=1).values  # (N_cap,)
    else:
        per_pair = image_cost.sum(dim=0) + caption_cost.sum(dim=1)  # (N_cap,)
    return per_pair.mean()


def counterfactual_hinge_loss(
    own: torch.Tensor, swapped: torch.Tensor, margin: float = DEFAULT_MARGIN
) -> torch.Tensor:
    """Mean over (image, caption, swapped caption) triples of max(0, margin + s(image,
    swapped) - s(image, caption)): an image ranks its caption above the same caption with one
    attribute swapped (models.datasets.counterfactuals). own, swapped: (K,); 0 when K = 0."""
    if own.shape != swapped.shape:
        raise ValueError(f"need matching shapes, got {tuple(own.shape)} and {tuple(swapped.shape)}")
    if own.numel() == 0:
        return own.sum()
    return (margin + swapped - own).clamp(min=0).mean()
