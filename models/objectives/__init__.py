"""Training objectives: what a batch of image and caption embeddings costs.

- hinge: the bidirectional hinge triplet loss of VSE++ / Pishdad et al. on -distance.
- infonce: CLIP's symmetric contrastive cross-entropy on the same similarity, at a temperature.
- pcme: PCME's soft contrastive loss on the sampled match probability.
- pcmepp: PCME++'s BCE on the closed-form sampled distance, with pseudo-positives.
Each can add the VIB term (KL to N(0, I)) for the Gaussian modalities and the uniformity term.
With a variance_objective the means come from the objective alone and the variances from a
loss on the detached means: "pcmepp" fits PCME++'s match probability sigmoid(-a * csd + b);
"spread" makes each variance the spread of the item's plausible matches in the batch (it
needs a dataset that records what each caption names; with own pairs only, every item has
one partner and gets the floor variance); "gallery_spread" the same over the whole training
split, "plausible_count" a target that grows with the item's number of plausible matches
in the training split, and "partner_distance" the mean square distance from the item's mean to
its plausible matches' there; the training loop computes these three each epoch
(models.training.gallery_spread).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.networks.model_config import ModelConfig, TrainConfig
from models.objectives.hinge import (
    counterfactual_hinge_loss,
    hinge_triplet_loss,
    similarity_matrix,
)
from models.objectives.infonce import infonce_loss
from models.objectives.match_probability import pcme_loss, pcmepp_loss
from models.objectives.regularizers import (
    outlier_ranking_loss,
    partner_spread_loss,
    spread_nll,
    uniformity_loss,
    vib_loss,
)

# The match logit's initial scale a and shift b of an objective that does not start from the
# model's default (5, 5).
# PCME: the logit is -a * ||z_i - z_j|| + b, and two unrelated unit means sit about sqrt(2)
# apart, so b = 7 (about 5 sqrt 2) starts them at p = 1/2, where the balanced loss of an
# untrained model is flat. PCME's first epochs pass through a state whose generic captions
# answer every image query (val i2t P@1 74.5 at epoch 1), which the val score rates above
# anything later: from b = 5 (p = 0.11) 2 of 3 seeds learnt too slowly to beat it and stopped
# at epoch 9 with it; from b = 7 all 3 moved past it (best epochs 30, 27, 21).
# PCME++: the logit is -a * csd + b, and a = b = 20 (p = 1/2 at csd 1) learns faster than the
# paper's 5, 5, which still improved at the last of 30 epochs and once stopped early in the
# state above: shapes val score 30.5, 35.0, 36.4 against 26.0, 18.1, 28.5 (seeds 0-2; a = b =
# 10 gave 29.5 on seed 0). a and b are learnt from there (match_learning_rate).
INITIAL_MATCH: dict[str, tuple[float, float]] = {"pcme": (5.0, 7.0), "pcmepp": (20.0, 20.0)}

# PCME++'s a and b (objective or variance objective "pcmepp") learn at this Adam rate unless
# TrainConfig.match_lr names one: at the encoders' 2e-3 its shapes val score was 31.1 +- 1.2
# against 34.0 +- 3.1 (benchmarks/results/pcme_match_lr_val.md).
PCMEPP_MATCH_LR = 0.05


def match_learning_rate(train_config: TrainConfig) -> float:
    """The Adam rate of the match logit's a and b: TrainConfig.match_lr, else PCMEPP_MATCH_LR
    for PCME++, else the encoders' lr, as both papers' code learns them.

    PCME learnt them at 0.05 before: a fell from 5 to 4 in the first epoch while b stayed at 7,
    which moved the loss's flat point (p = 1/2) to distance b / a = 1.76 > sqrt 2, and the
    image and caption means went to opposite sides of the sphere (mean cosine -0.52 on val
    after epoch 1). From there one seed of three climbed more slowly (val score 15.9 against
    18.4 at epoch 6, at the same lr), did not beat its epoch-2 score before the lr was cut at
    epoch 7, and stopped at epoch 10 with it. At the encoders' 2e-3, a stayed at 4.9 and the
    cosine near 0 (benchmarks/results/pcme_geometry.md), and all three seeds trained to epochs
    25-30: val score 26.5 +- 1.1 against 23.7 +- 5.6, no difference in the mean by the spread,
    but no seed stops early (benchmarks/results/pcme_match_lr_val.md)."""
    if train_config.match_lr is not None:
        return train_config.match_lr
    if "pcmepp" in (train_config.objective, train_config.variance_objective):
        return PCMEPP_MATCH_LR
    return train_config.lr


# PCME's uniformity term (supplementary A.1: weight 10 on CUB, 0 on COCO) on the joint batch
# of image and caption means, unless TrainConfig.uniformity_weight names a weight. Without it
# PCME's image queries collapse onto hub captions (one caption was the first answer of 39-77
# of the 200 val images; benchmarks/results/pcme_geometry.md). Chosen on the shapes val split
# by the val score (seeds 0-2): 34.0 +- 2.2 at 0.1, 33.8 +- 0.8 at 1, 28.7 +- 2.0 at 3, 26.5 +-
# 1.1 without, vse 32.2 +- 1.8 (benchmarks/results/pcme_uniformity_val.md). The paper's sum of
# exp(-2 d^2) and this log of its mean (Wang and Isola's form) differ in scale by the mean
# itself, so the weights do not carry over one to one. PCME++ has no such term, and adding it
# did not help there (33.7 +- 4.3 at 1, 29.8 +- 2.7 at 0.1, against 34.0 +- 3.1 without).
PCME_UNIFORMITY = 0.1


def uniformity_weight(train_config: TrainConfig) -> float:
    """The weight of the uniformity term: TrainConfig.uniformity_weight, else PCME_UNIFORMITY
    for PCME, else 0."""
    if train_config.uniformity_weight is not None:
        return train_config.uniformity_weight
    return PCME_UNIFORMITY if train_config.objective == "pcme" else 0.0


@dataclass
class BatchEmbeddings:
    """One training batch, embedded: images (B, D), captions (M, D), owner (M,) image rows;
    `matches` (B, M) bool marks the pairs the objective treats as matching (the own pairs, or
    all plausible ones)."""

    image_mu: torch.Tensor
    image_logvar: torch.Tensor
    caption_mu: torch.Tensor
    caption_logvar: torch.Tensor
    caption_image: torch.Tensor
    matches: torch.Tensor
    partners: torch.Tensor | None = None  # (B, M) plausible matches, for variance "spread"
    outliers: int = 0  # the last `outliers` images are synthetic outliers (no caption is theirs)
    # Swapped captions (K, D) each, and the caption (K,) each one swaps; see
    # models.datasets.counterfactuals.
    counterfactuals: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # Images with one object's shape swapped (K, D) each, one per caption they make miss, and
    # the caption (K,) each one is scored with.
    swapped_images: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # The whole-gallery targets of the batch's images (B, D) and captions (M, D), handed by
    # the training loop for the variance objectives that have them (GALLERY_TARGETS of
    # models.training.gallery_spread) and fitted with spread_nll.
    spread_targets: tuple[torch.Tensor, torch.Tensor] | None = None


def batch_loss(
    batch: BatchEmbeddings,
    model_config: ModelConfig,
    train_config: TrainConfig,
    match: tuple[torch.Tensor, torch.Tensor],
    negatives: str,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """The objective of `train_config` plus its regularisers; `match` is (a, b)."""
    image = (batch.image_mu, batch.image_logvar)
    caption = (batch.caption_mu, batch.caption_logvar)
    if train_config.objective == "pcme":
        loss = pcme_loss(
            image, caption, batch.matches, *match, train_config.match_samples, generator,
            train_config.match_weighting,
        )  # fmt: skip
    elif train_config.objective == "pcmepp":
        loss = pcmepp_loss(
            image,
            caption,
            batch.matches,
            batch.caption_image,
            *match,
            train_config.pseudo_positive_weight,
            train_config.match_weighting,
        )
    else:
        similarity = similarity_matrix(
            model_config.model_type,
            model_config.metric,
            *_retrieval_view(image, train_config),
            *_retrieval_view(caption, train_config),
        )  # (B, M)
        spare_captions = train_config.positives != "plausible_images"
        if train_config.objective == "infonce":
            loss = infonce_loss(
                similarity,
                batch.caption_image,
                train_config.temperature,
                batch.matches,
                caption_side_matches=spare_captions,
            )
        else:
            loss = hinge_triplet_loss(
                similarity,
                batch.caption_image,
                train_config.margin,
                negatives,
                batch.matches,
                caption_side_matches=spare_captions,
            )
    swaps = batch.counterfactuals is not None or batch.swapped_images is not None
    if swaps and train_config.counterfactual_weight > 0:
        loss = loss + train_config.counterfactual_weight * _counterfactual_term(
            batch, model_config, train_config.margin
        )
    frozen_means = ((image[0].detach(), image[1]), (caption[0].detach(), caption[1]))
    if train_config.variance_objective == "spread" and batch.partners is not None:
        loss = loss + partner_spread_loss(*frozen_means, batch.partners, batch.outliers)
    if batch.spread_targets is not None:
        image_target, caption_target = batch.spread_targets
        loss = loss + spread_nll(image_target, image[1]) + spread_nll(caption_target, caption[1])
    if train_config.outlier_ranking_weight > 0:
        loss = loss + train_config.outlier_ranking_weight * outlier_ranking_loss(
            batch.image_logvar, batch.outliers
        )
    if train_config.variance_objective == "pcmepp":
        loss = loss + pcmepp_loss(
            *frozen_means,
            batch.matches,
            batch.caption_image,
            *match,
            train_config.pseudo_positive_weight,
            train_config.match_weighting,
        )
    if train_config.vib_beta > 0:
        if model_config.gaussian_images:
            loss = loss + train_config.vib_beta * vib_loss(*image)
        if model_config.gaussian_captions:
            loss = loss + train_config.vib_beta * vib_loss(*caption)
    if (weight := uniformity_weight(train_config)) > 0:
        joint = torch.cat([batch.image_mu, batch.caption_mu])
        loss = loss + weight * uniformity_loss(joint)
    return loss


def _retrieval_view(
    gaussian: tuple[torch.Tensor, torch.Tensor], train_config: TrainConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mu, logvar) as the retrieval objective sees them: with a variance_objective the
    log-variance is detached, so that objective alone sets the variances, while a distance
    that reads them (metric w2) still trains the means against the variances as served."""
    mu, logvar = gaussian
    return (mu, logvar.detach()) if train_config.variance_objective else (mu, logvar)


def _counterfactual_term(
    batch: BatchEmbeddings, model_config: ModelConfig, margin: float
) -> torch.Tensor:
    """The counterfactual hinges of the batch: the image a caption belongs to ranks the caption
    above its swapped captions, and the caption ranks that image above its swapped image."""

    def paired(image: tuple[torch.Tensor, ...], caption: tuple[torch.Tensor, ...]) -> torch.Tensor:
        similarity = similarity_matrix(
            model_config.model_type, model_config.metric, *image, *caption
        )
        return similarity.diagonal()

    def image_of(of: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = batch.caption_image[of]
        return batch.image_mu[rows], batch.image_logvar[rows]

    def caption(of: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return batch.caption_mu[of], batch.caption_logvar[of]

    loss = batch.image_mu.new_zeros(())
    if batch.counterfactuals is not None:
        mu, logvar, of = batch.counterfactuals
        own = paired(image_of(of), caption(of))
        loss = loss + counterfactual_hinge_loss(own, paired(image_of(of), (mu, logvar)), margin)
    if batch.swapped_images is not None:
        mu, logvar, of = batch.swapped_images
        own = paired(image_of(of), caption(of))
        loss = loss + counterfactual_hinge_loss(own, paired((mu, logvar), caption(of)), margin)
    return loss
