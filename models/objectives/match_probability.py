"""The probabilistic matching objectives: PCME (Chun et al.) and PCME++.

Both turn a distance between an image's and a caption's Gaussians into a match probability
p = sigmoid(-a * d + b), with a > 0 and b learned, and fit it to the batch's match matrix
with binary cross-entropy:

- PCME: d is the Euclidean distance between samples, and p the mean of the sigmoid over J x J
  sample pairs (models.distance.gaussian's match_prob, which returns -ln p). The variance matters
  because a vague embedding spreads its samples, and the mean sigmoid of a spread pair is
  neither near 1 nor near 0: the loss of an ambiguous pair falls when its variance grows.
- PCME++: d is the closed-form sampled distance csd = ||mu_i - mu_j||^2 + sum sigma_i^2 +
  sum sigma_j^2 (its expectation over samples). Pseudo-positives, negatives that sit at least
  as close as the pair's own positive, are pushed towards "match" with a small weight: they
  are usually plausible matches the dataset did not pair (Chun, PCME++).

The positive and the negative pairs weigh the same in all: the loss is the mean over the
positives plus the mean over the negatives (`balanced_mean`). The papers' code sums (PCME) or
averages (PCME++) over every pair, so with one positive in B pairs the positives weigh 1/B;
fine-tuned from pretrained backbones that works, but trained from scratch on shapes (1 positive
in 32) it stayed at its trivial value (every p at the base rate, BCE 0.137 against 0.139):
a, b and the per-item sum of variances, which shifts all of an item's logits at once, reached
that value faster than the means learnt to tell the pairs apart (docs/results-pcme.md).
`weighting="all_pairs"` (TrainConfig.match_weighting) takes PCME++'s mean over every pair
instead, to compare with the papers.

PCME++'s labels can also be soft (its mixed-sample augmentation and label smoothing,
models.training.mixed_samples): a pair with label t in [0, 1] is a positive with weight t and
a negative with weight 1 - t, and each class is averaged over its weights (`soft_balanced_bce`).
With 0/1 labels that is the balanced mean above; with soft ones each class still weighs 1 in
all, and a pair's optimum keeps the balanced loss's shift of the odds: p / (1 - p) =
t / (1 - t) x (negatives' weight / positives' weight), as a hard pair's does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from models.distance.gaussian import pairwise_distance


def positive_mask(num_images: int, caption_image: torch.Tensor) -> torch.Tensor:
    """(N_img, N_cap) True where caption j belongs to image i."""
    rows = torch.arange(num_images, device=caption_image.device)
    return rows[:, None] == caption_image[None, :]


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """ln(1 - exp(-x)) for x > 0, accurate at both ends (Maechler's two branches)."""
    return torch.where(x < math.log(2.0), torch.log(-torch.expm1(-x)), torch.log1p(-torch.exp(-x)))


def balanced_mean(pair_loss: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """Mean of `pair_loss` over the positive pairs plus its mean over the others; a class the
    batch has no pair of adds 0. (N_img, N_cap) -> ()."""
    total = pair_loss.new_zeros(())
    for mask in (positive, ~positive):
        if mask.any():
            total = total + pair_loss[mask].mean()
    return total


def pair_mean(pair_loss: torch.Tensor, positive: torch.Tensor, weighting: str) -> torch.Tensor:
    """The loss of a batch from each pair's: `balanced_mean`, or the mean over every pair
    ("all_pairs", PCME++'s code)."""
    if weighting == "all_pairs":
        return pair_loss.mean()
    return balanced_mean(pair_loss, positive)


def _pair_mean(
    positive_loss: torch.Tensor, negative_loss: torch.Tensor, positive: torch.Tensor, weighting: str
) -> torch.Tensor:
    """pair_mean of the positive loss where `positive`, else the negative loss."""
    return pair_mean(torch.where(positive, positive_loss, negative_loss), positive, weighting)


def pcme_loss(
    image: tuple[torch.Tensor, torch.Tensor],
    caption: tuple[torch.Tensor, torch.Tensor],
    matches: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    num_samples: int,
    generator: torch.Generator | None,
    weighting: str = "balanced",
) -> torch.Tensor:
    """PCME's soft contrastive loss of a batch: images (B, D) x captions (M, D).

    -ln p for the matching pairs (`matches`, (B, M) bool), -ln(1 - p) for the others, with p
    the J x J sampled match probability (J = num_samples; noise from `generator`); the mean
    over the matching pairs plus the mean over the others (`weighting`: pair_mean).
    """
    neg_log_p = pairwise_distance(
        "match_prob", *image, *caption,
        num_samples=num_samples, a=scale, b=shift, generator=generator,
    )  # fmt: skip  # (B, M)
    neg_log_p = neg_log_p.clamp_min(1e-6)
    return _pair_mean(neg_log_p, -log1mexp(neg_log_p), matches, weighting)


def pcmepp_loss(
    image: tuple[torch.Tensor, torch.Tensor],
    caption: tuple[torch.Tensor, torch.Tensor],
    matches: torch.Tensor,
    caption_image: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    pseudo_positive_weight: float,
    weighting: str = "balanced",
) -> torch.Tensor:
    """PCME++'s loss of a batch: BCE of sigmoid(-a * csd + b) against `matches`, plus
    `pseudo_positive_weight` x the same BCE with the pseudo-positives counted as matches; each
    BCE the mean over its matching pairs plus the mean over the others (`weighting`:
    pair_mean).

    `matches` (B, M) is bool, or float soft labels in [0, 1] (mixed samples, label smoothing:
    models.training.mixed_samples), then the BCE is `soft_balanced_bce` and a pseudo-positive
    gets its row's largest label, as PCME++'s code gives it its row's ground-truth label."""
    csd = pairwise_distance("csd", *image, *caption)  # (B, M)
    logits = -scale * csd + shift
    loss = _bce(logits, matches, weighting)
    if pseudo_positive_weight <= 0:
        return loss
    own = positive_mask(image[0].shape[0], caption_image)
    pseudo = pseudo_positives(csd.detach(), own, caption_image)
    if matches.dtype == torch.bool:
        relabelled = matches | pseudo
    else:
        relabelled = torch.where(pseudo, matches.amax(dim=1, keepdim=True), matches)
    return loss + pseudo_positive_weight * _bce(logits, relabelled, weighting)


def _bce(logits: torch.Tensor, matches: torch.Tensor, weighting: str) -> torch.Tensor:
    """Binary cross-entropy of match logits (B, M) against `matches` (B, M), bool or float
    soft labels, weighted by `weighting` (balanced: `soft_balanced_bce` for soft labels)."""
    if matches.dtype != torch.bool:
        if weighting == "all_pairs":
            return F.binary_cross_entropy_with_logits(logits, matches)
        return soft_balanced_bce(logits, matches)
    per_pair = F.binary_cross_entropy_with_logits(
        logits, matches.to(logits.dtype), reduction="none"
    )
    return pair_mean(per_pair, matches, weighting)


def soft_balanced_bce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The balanced BCE of logits (B, M) against soft labels `targets` (B, M) in [0, 1]:
    sum t (-ln p) / sum t + sum (1 - t) (-ln(1 - p)) / sum (1 - t), p = sigmoid(logit); a class
    with no weight in the batch adds 0.

    Each pair is a positive with weight t and a negative with weight 1 - t, so with 0/1 labels
    this is `balanced_mean` of the BCE (the mean of -ln p over the positives plus that of
    -ln(1 - p) over the negatives). Not chosen (by argument, not measured): averaging the
    per-pair soft BCE within the hard classes would put a mixed image's pairs with its
    partner's captions (label 1 - lambda) among the negatives and weigh their "match" part as
    a negative's; thresholding t would drop what the soft label says. Label smoothing s moves
    a weight of s x (number of negatives) into the positive class: 0.5 of about 160 for a
    shapes batch at PCME++'s s = 1e-4."""
    weights = (targets, 1.0 - targets)
    losses = (-F.logsigmoid(logits), -F.logsigmoid(-logits))  # -ln p, -ln(1 - p)
    total = logits.new_zeros(())
    for weight, loss in zip(weights, losses, strict=True):
        mass = weight.sum()
        if mass > 0:
            total = total + (weight * loss).sum() / mass
    return total


def pseudo_positives(
    distance: torch.Tensor, positive: torch.Tensor, caption_image: torch.Tensor
) -> torch.Tensor:
    """Negatives (i, j) at least as close as a positive of their row or column: image i is as
    close to caption j as caption j's own image, or caption j as close to image i as the
    farthest caption of image i. (N_img, N_cap) bool."""
    own = distance.gather(0, caption_image[None, :])  # (1, N_cap) caption j to its image
    farthest_own = torch.where(positive, distance, -torch.inf).amax(dim=1, keepdim=True)
    closer = (distance <= own) | (distance <= farthest_own)
    return closer & ~positive
