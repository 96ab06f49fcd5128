"""The targets of variance_objective "gallery_spread": each caption's variance is fitted to the
spread of its plausible images' means over the whole training split, and each image's to the
spread of its plausible captions' means, rather than over the images of one batch ("spread").

Why: on clip art a caption has a median of 4 plausible drawings among ~5900, so a batch of
128 almost never holds two and the batch objective trains most captions towards
SPREAD_FLOOR; its caption log-det then ran against ambiguity (val Spearman with
ln(#plausible) about -0.2), while the same target over the whole gallery follows it (+0.62;
benchmarks/results/spread_target_clipart.md). The gallery's means are recomputed from the
current heads at the start of each epoch, detached (the means belong to the retrieval
objective): one pass of the heads over the split, cheap on cached backbone features.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.objectives.regularizers import spread_target


@dataclass(frozen=True)
class GallerySpread:
    """One epoch's targets: images (N_img, D), captions (N_cap, D), and `outlier` (D,), the
    spread of every caption's mean, the target of a synthetic outlier (an image that shows
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


def gallery_spread(
    image_mu: torch.Tensor, caption_mu: torch.Tensor, plausible: torch.Tensor
) -> GallerySpread:
    """The targets from the split's means, image_mu (N_img, D) and caption_mu (N_cap, D), and
    its plausible matches (N_cap, N_img), dense or sparse (SplitTensors.plausible_pairs)."""
    image_mu, caption_mu = image_mu.detach(), caption_mu.detach()
    plausible = plausible.to(image_mu.device, image_mu.dtype)
    every_caption = caption_mu.new_ones(len(caption_mu), 1)
    return GallerySpread(
        images=spread_target(caption_mu, plausible),
        captions=spread_target(image_mu, plausible.t()),
        outlier=spread_target(caption_mu, every_caption)[0],
    )
