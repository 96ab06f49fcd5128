"""The whole-gallery variance targets, recomputed by the training loop at the start of each
epoch from the heads' detached means over the training split (one pass of the heads, cheap on
cached backbone features; the means belong to the retrieval objective).

- "gallery_spread": each caption's variance is fitted to the spread of its plausible images'
  means over the whole training split, and each image's to the spread of its plausible
  captions' means, rather than over the images of one batch ("spread"). Why: on clip art a
  caption has a median of 4 plausible drawings among ~5900, so a batch of 128 almost never
  holds two and the batch objective trains most captions towards SPREAD_FLOOR; its caption
  log-det then ran against ambiguity (val Spearman with ln(#plausible) about -0.2), while the
  same target over the whole gallery follows it (+0.62;
  benchmarks/results/spread_target_clipart.md).
- "plausible_count": each caption's target grows with how many plausible images it has in
  the training split, geometrically from SPREAD_FLOOR (one image) to the spread of every
  image's mean (all of them) (regularizers.count_target); images likewise over their
  plausible captions. Why: "gallery_spread" fell short (val -0.32): InfoNCE with plausible
  positives pulls a generic caption's many images together, so the spread of their means
  hardly follows ambiguity on train (+0.34), while the caption's text features predict the
  count itself (+0.79 on val with a ridge map;
  benchmarks/results/spread_gallery_clipart.md). Only the gallery's spread, which sets the
  scale, comes from the means.
- "partner_distance": each caption's variance is fitted to the mean square distance from its
  mean to its plausible images' means (regularizers.residual_target), and each image's to
  its plausible captions': the heteroscedastic target of ProbVLM-style adapters, a variance
  that grows where the right answers lie far from the query. Why: the variances above follow
  ambiguity, and a vague query's first answer is more often right, so no score read from them
  tells a wrong answer from a right one better than the distance of the means
  (benchmarks/results/reject_means_clipart.md); this one is fitted to how far the answers are.
  On clip-art val its log-det does refuse wrong answers, but no better than the distance of the
  means, and the caption log-det turns against ambiguity
  (benchmarks/results/partner_distance_val.md), so the demo keeps "plausible_count".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from models.objectives.regularizers import (
    count_target,
    partner_count,
    partner_variance,
    residual_target,
    spread_target,
)


@dataclass(frozen=True)
class GallerySpread:
    """One epoch's targets: images (N_img, D), captions (N_cap, D), and `outlier` (D,), the
    target of a synthetic outlier: that of an image every caption matches (an image that shows
    none of the data's kinds is as vague as an image can be, as in "spread")."""

    images: torch.Tensor
    captions: torch.Tensor
    outlier: torch.Tensor

    def of_batch(
        self, image_rows: torch.Tensor, caption_rows: torch.Tensor, outliers: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(image targets (B + outliers, D), caption targets (M, D)) of one batch's rows."""
        images = self.images[image_rows]
        if outliers:
            images = torch.cat([images, self.outlier.expand(outliers, -1)])
        return images, self.captions[caption_rows]


def _detached(
    image_mu: torch.Tensor, caption_mu: torch.Tensor, plausible: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The means detached and plausible (N_cap, N_img) on their device and dtype."""
    image_mu, caption_mu = image_mu.detach(), caption_mu.detach()
    return image_mu, caption_mu, plausible.to(image_mu.device, image_mu.dtype)


def gallery_spread(
    image_mu: torch.Tensor, caption_mu: torch.Tensor, plausible: torch.Tensor
) -> GallerySpread:
    """The "gallery_spread" targets from the split's means, image_mu (N_img, D) and caption_mu
    (N_cap, D), and its plausible matches (N_cap, N_img), dense or sparse
    (SplitTensors.plausible_pairs)."""
    image_mu, caption_mu, plausible = _detached(image_mu, caption_mu, plausible)
    every_caption = caption_mu.new_ones(len(caption_mu), 1)
    return GallerySpread(
        images=spread_target(caption_mu, plausible),
        captions=spread_target(image_mu, plausible.t()),
        outlier=spread_target(caption_mu, every_caption)[0],
    )


def plausible_count(
    image_mu: torch.Tensor, caption_mu: torch.Tensor, plausible: torch.Tensor
) -> GallerySpread:
    """The "plausible_count" targets, with the arguments of gallery_spread: a caption's from
    its number of plausible images out of N_img and the per-dimension variance of every image
    mean, an image's from its number of plausible captions out of N_cap and that of every
    caption mean; the outlier's is the caption gallery's spread (every caption its partner)."""
    image_mu, caption_mu, plausible = _detached(image_mu, caption_mu, plausible)
    image_gallery = partner_variance(image_mu, image_mu.new_ones(len(image_mu), 1))[0]  # (D,)
    caption_gallery = partner_variance(caption_mu, caption_mu.new_ones(len(caption_mu), 1))[0]
    per_image = partner_count(plausible)[:, 0]  # (N_img,) plausible captions of each image
    per_caption = partner_count(plausible.t())[:, 0]  # (N_cap,)
    every_caption = caption_mu.new_full((1,), float(len(caption_mu)))
    return GallerySpread(
        images=count_target(per_image, len(caption_mu), caption_gallery),
        captions=count_target(per_caption, len(image_mu), image_gallery),
        outlier=count_target(every_caption, len(caption_mu), caption_gallery)[0],
    )


def partner_distance(
    image_mu: torch.Tensor, caption_mu: torch.Tensor, plausible: torch.Tensor
) -> GallerySpread:
    """The "partner_distance" targets, with the arguments of gallery_spread; the outlier's is
    the caption gallery's spread, as there."""
    image_mu, caption_mu, plausible = _detached(image_mu, caption_mu, plausible)
    every_caption = caption_mu.new_ones(len(caption_mu), 1)
    return GallerySpread(
        images=residual_target(image_mu, caption_mu, plausible),
        captions=residual_target(caption_mu, image_mu, plausible.t()),
        outlier=spread_target(caption_mu, every_caption)[0],
    )


# (image_mu, caption_mu, plausible) -> the epoch's targets
GalleryTargets = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], GallerySpread]
# The variance objectives whose targets the training loop computes each epoch, and how; the
# batch loss fits whatever targets it is handed with spread_nll (models.objectives).
GALLERY_TARGETS: dict[str, GalleryTargets] = {
    "gallery_spread": gallery_spread,
    "plausible_count": plausible_count,
    "partner_distance": partner_distance,
}
