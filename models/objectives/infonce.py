"""Symmetric InfoNCE (CLIP's contrastive cross-entropy) on a batch's similarity matrix, with
several captions per image and plausible matches kept out of the denominators."""

from __future__ import annotations

import torch

DEFAULT_TEMPERATURE = 0.1  # TrainConfig.temperature's default


def infonce_loss(
    similarity: torch.Tensor,
    caption_image: torch.Tensor,
    temperature: float = DEFAULT_TEMPERATURE,
    matches: torch.Tensor | None = None,
    caption_side_matches: bool = True,
) -> torch.Tensor:
    """t2i cross-entropy over images plus i2t cross-entropy over captions, at `temperature`.

    Args:
        similarity: (N_img, N_cap), images of the batch (all distinct) against its captions
            (models.objectives.hinge.similarity_matrix: cosine, or -distance, whose scale the
            temperature must suit).
        caption_image: (N_cap,) int64, the row of each caption's own image.
        temperature: tau > 0; the logits are similarity / tau.
        matches: (N_img, N_cap) bool, pairs that are never negatives (as in
            hinge_triplet_loss); the own pairs are positives whatever it says.
        caption_side_matches: False spares only the images of a caption: an image's
            denominator then still holds every caption but its own.

    t2i: for caption j, -log softmax over the images at its own image, the images that
    `matches` pairs with j left out of the softmax; mean over captions.
    i2t (multi-positive, each positive against the negatives alone): for image i and each own
    caption j, -log(exp(l_ij) / (exp(l_ij) + sum_k exp(l_ik))), k over the captions that are
    neither i's own nor matched to i; mean over i's own captions, then over the images that
    have captions (synthetic outliers have none). Returns the sum of the two means.
    """
    if not temperature > 0:  # nan too
        raise ValueError(f"temperature must be > 0, got {temperature}")
    num_images = similarity.shape[0]
    logits = similarity / temperature  # (N_img, N_cap)
    own = torch.arange(num_images, device=similarity.device)[:, None] == caption_image
    positive = own if matches is None else own | matches
    # A value exp() takes to 0 without the nan gradients of an all -inf row.
    floor = torch.finfo(logits.dtype).min
    t2i_logits = logits.masked_fill(positive & ~own, floor)
    t2i = -t2i_logits.log_softmax(dim=0).gather(0, caption_image[None, :]).squeeze(0)  # (N_cap,)
    excluded = positive if caption_side_matches else own
    negatives_lse = logits.masked_fill(excluded, floor).logsumexp(dim=1)  # (N_img,)
    matched = logits.gather(0, caption_image[None, :]).squeeze(0)  # (N_cap,)
    per_pair = torch.logaddexp(matched, negatives_lse[caption_image]) - matched  # (N_cap,)
    counts = torch.bincount(caption_image, minlength=num_images).to(logits.dtype)  # (N_img,)
    per_image = logits.new_zeros(num_images).index_add(0, caption_image, per_pair)
    has_captions = counts > 0
    i2t = (per_image[has_captions] / counts[has_captions]).mean()
    return t2i.mean() + i2t
