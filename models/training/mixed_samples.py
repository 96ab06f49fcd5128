"""PCME++'s mixed-sample data augmentation (MSDA): some images of a batch are mixed with
another image of the batch, and their match labels become soft.

PCME++ (Chun, naver-ai/pcmepp, configs/pcmepp.yaml) mixes a quarter of a batch's images,
each with another image of the batch: by mixup (a convex combination of the pixels) or by
cutmix (a box of the other image pasted in), half of the time each, with lambda ~ Beta(2, 2).
A mixed image then matches its own captions with weight lambda and its partner's with
1 - lambda (for cutmix, lambda is the share of the image left uncovered). The paper's reading:
a mixed image is partly about two things, which is what the probabilistic match should
express, and the soft labels give the BCE pairs between "match" and "no match" to learn the
variances from; PCME++ fine-tunes pretrained backbones, here the encoders train from scratch.

Differences from the paper's code, each a choice, not a necessity:
- exactly round(fraction x B) images are mixed per batch (the code draws each image with
  probability 1/4, so the count varies);
- the partner is another image of the batch drawn at random (the code uses the image at the
  mirrored batch position, B - 1 - i, which with an odd batch would mix the middle image
  with itself); the pixels pasted or blended are always the partner's unmixed ones;
- a caption matches through its image, so a batch of B images with several captions each
  gets a soft row per mixed image over all its captions: lambda x the row of the image's own
  matches + (1 - lambda) x its partner's row. With `positives` "plausible" these rows hold
  the plausible matches, and the mixture is of those.

Only pixels can be mixed this way: on a pretrained backbone's cached features a mixture of
two feature vectors is not the feature of a mixed image (the paper's code refuses MSDA on
pre-computed features too), so models.training.train refuses the option for such models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

# The paper's configuration (naver-ai/pcmepp configs/pcmepp.yaml: mixup 2, cutmix 2,
# mixup_switch_prob 0.5).
MIXUP_ALPHA = 2.0  # lambda ~ Beta(alpha, alpha) for mixup
CUTMIX_ALPHA = 2.0  # and for the box size of cutmix
CUTMIX_SHARE = 0.5  # share of the mixed images that get cutmix instead of mixup


@dataclass(frozen=True)
class MixedSamples:
    """Which images of a batch were mixed: rows (K,) their batch positions, partners (K,) the
    image mixed into each, weights (K,) lambda, the share of each that is still its own image
    (mixup's blend weight; cutmix's uncovered area), cutmix (K,) bool which ones were boxes."""

    rows: torch.Tensor
    partners: torch.Tensor
    weights: torch.Tensor
    cutmix: torch.Tensor


def cutmix_box(
    height: int, width: int, weight: float, rng: np.random.Generator
) -> tuple[int, int, int, int]:
    """A box (y0, y1, x0, x1) covering about 1 - `weight` of the image: sides sqrt(1 - weight)
    of the image's, centred at a uniform pixel, clipped to the image (so it can be smaller)."""
    side = math.sqrt(1.0 - weight)
    box_h, box_w = round(height * side), round(width * side)
    cy, cx = int(rng.integers(height)), int(rng.integers(width))
    y0, y1 = max(cy - box_h // 2, 0), min(cy - box_h // 2 + box_h, height)
    x0, x1 = max(cx - box_w // 2, 0), min(cx - box_w // 2 + box_w, width)
    return y0, max(y0, y1), x0, max(x0, x1)


def mix_images(
    images: torch.Tensor, fraction: float, rng: np.random.Generator
) -> tuple[torch.Tensor, MixedSamples | None]:
    """Mix round(fraction x B) of the images (B, C, H, W), each with another one of the batch
    (see the module doc); returns the new images (the input is not changed) and what was mixed,
    or the input itself and None when nothing is."""
    if images.dim() != 4:
        raise ValueError(f"mixed samples need images (B, C, H, W), got shape {tuple(images.shape)}")
    size = len(images)
    count = round(fraction * size) if size > 1 else 0
    if count == 0:
        return images, None
    rows = np.sort(rng.choice(size, count, replace=False))
    partners = (rows + rng.integers(1, size, count)) % size  # never the image itself
    cutmix = rng.random(count) < CUTMIX_SHARE
    weights = np.where(
        cutmix,
        rng.beta(CUTMIX_ALPHA, CUTMIX_ALPHA, count),
        rng.beta(MIXUP_ALPHA, MIXUP_ALPHA, count),
    )
    mixed = images.clone()
    height, width = images.shape[-2:]
    for k, (row, partner) in enumerate(zip(rows, partners, strict=True)):
        if cutmix[k]:
            y0, y1, x0, x1 = cutmix_box(height, width, float(weights[k]), rng)
            mixed[row, :, y0:y1, x0:x1] = images[partner, :, y0:y1, x0:x1]
            weights[k] = 1.0 - (y1 - y0) * (x1 - x0) / (height * width)
        else:
            mixed[row] = weights[k] * images[row] + (1.0 - weights[k]) * images[partner]
    return mixed, MixedSamples(
        torch.from_numpy(rows),
        torch.from_numpy(partners),
        torch.from_numpy(weights).float(),
        torch.from_numpy(cutmix),
    )


def soft_match_targets(
    matches: torch.Tensor, mixed: MixedSamples | None, smoothing: float
) -> torch.Tensor:
    """The match labels (B', M) float of a batch whose hard labels are `matches` (B', M) bool:
    a mixed image's row is lambda x its own row + (1 - lambda) x its partner's, then every
    label t becomes (1 - smoothing) t + smoothing (1 - t) (PCME++'s label smoothing, 1e-4).
    Rows past the mixed ones (synthetic outliers) keep their labels."""
    hard = matches.to(torch.float32)
    targets = hard.clone()
    if mixed is not None:
        rows, partners = mixed.rows.to(matches.device), mixed.partners.to(matches.device)
        weight = mixed.weights.to(matches.device)[:, None]
        targets[rows] = weight * hard[rows] + (1.0 - weight) * hard[partners]
    if smoothing > 0:
        targets = (1.0 - smoothing) * targets + smoothing * (1.0 - targets)
    return targets
