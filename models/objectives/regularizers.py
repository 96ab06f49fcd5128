"""Regularisers of PCME (Chun et al., supplementary A): the variational information bottleneck
KL(N(mu, sigma^2) || N(0, I)) and the uniformity of the means on the unit sphere; the variance
objectives that fit a variance to the spread of an item's partners (or to how many it has)
and rank synthetic outliers above real images."""

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


SPREAD_FLOOR = 1e-3  # per-dimension variance of an item with one partner (or tight ones)


def partner_spread_loss(
    image: tuple[torch.Tensor, torch.Tensor],
    caption: tuple[torch.Tensor, torch.Tensor],
    partners: torch.Tensor,
    outliers: int = 0,
) -> torch.Tensor:
    """Gaussian NLL that makes each item's variance the spread of its partners' means.

    partners (N_img, N_cap) bool marks the plausible matches of the batch. A caption's
    partners are the images it plausibly describes; their per-dimension variance around their
    own mean, plus SPREAD_FLOOR, is the target t, and 0.5 * sum(t / sigma^2 + ln sigma^2) is
    minimal exactly at sigma^2 = t. So "a red circle", true of images that differ in
    everything else, gets a large variance; a caption that names every object of one scene a
    small one. Images likewise, over the captions that describe them. Means are used as given
    (pass them detached to leave them to the retrieval objective).

    The last `outliers` image rows are synthetic outliers (models.datasets.outliers): every
    caption of the batch is theirs, so their target is the spread of all captions (an image
    that shows none of the data's kinds is as vague as an image can be), and they are no
    caption's partner.
    """
    weights = partners.to(image[0].dtype)
    image_weights = weights.clone()
    if outliers:
        weights[-outliers:] = 0.0
        image_weights[-outliers:] = 1.0

    caption_target = spread_target(image[0], weights)
    image_target = spread_target(caption[0], image_weights.T)
    return spread_nll(caption_target, caption[1]) + spread_nll(image_target, image[1])


def spread_nll(target: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """Mean over items of 0.5 * sum over dims of (t / sigma^2 + ln sigma^2), (N, D) -> ():
    the Gaussian NLL of the variance alone, minimal exactly at sigma^2 = target."""
    return 0.5 * (target * torch.exp(-logvar) + logvar).sum(-1).mean()


def spread_target(partner_mu: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The variance the spread objectives fit: for each column of weights (P, N), the
    per-dimension variance of the partners' means (P, D) it weights, plus SPREAD_FLOOR (the
    floor alone for an item with one partner or none). (N, D).

    `weights` may be a sparse COO tensor: the whole-gallery objective
    (variance_objective "gallery_spread", models.training.gallery_spread) passes every
    caption's plausible images among thousands, of which a caption has a handful."""
    return partner_variance(partner_mu, weights) + SPREAD_FLOOR


def partner_count(weights: torch.Tensor) -> torch.Tensor:
    """How many partners each column of weights (P, N), dense or sparse COO, has (its sum):
    (N, 1). A sparse matrix's entries are summed by column index rather than multiplied by a
    column of ones: the whole-gallery objectives count clip art's 1.9 million plausible pairs
    both ways every epoch, 0.17 s a time that way and 0.04 s this way (one thread)."""
    if weights.is_sparse:
        columns, values = weights._indices()[1], weights._values()
        count = torch.bincount(columns, weights=values, minlength=weights.shape[1])
        return count.to(weights.dtype)[:, None]
    ones = torch.ones(weights.shape[0], 1, dtype=weights.dtype, device=weights.device)
    return weights.t() @ ones


def partner_variance(partner_mu: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """For each column of weights (P, N), dense or sparse COO, the per-dimension variance of
    the partners' means (P, D) it weights (ddof 0; 0 for one partner or none): (N, D)."""
    by_item = weights.t()  # (N, P)
    count = partner_count(weights).clamp_min(1.0)  # (N, 1) partners per item
    mean = (by_item @ partner_mu) / count  # (N, D)
    spread = (by_item @ partner_mu.pow(2)) / count - mean.pow(2)  # (N, D)
    return spread.clamp_min(0.0)


def residual_target(
    item_mu: torch.Tensor, partner_mu: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """The variance variance_objective "partner_distance" fits: for each item (N, D) and the
    column of weights (P, N), dense or sparse COO, that picks its partners among partner_mu
    (P, D), the per-dimension mean of (mu_partner - mu_item)^2 over them, plus SPREAD_FLOOR
    (the floor alone for an item with no partner). (N, D).

    It is the heteroscedastic regression target of ProbVLM-style adapters: the variance a
    Gaussian centred on the item needs to hold its partners, so a query whose right answers lie
    far from it gets a large variance. The mean square splits as the partners' spread plus the
    square of their centre's offset from the item."""
    count = partner_count(weights)  # (N, 1)
    centre = (weights.t() @ partner_mu) / count.clamp_min(1.0)  # (N, D)
    offset = torch.where(count > 0, (centre - item_mu).pow(2), torch.zeros_like(item_mu))
    return partner_variance(partner_mu, weights) + offset + SPREAD_FLOOR


def count_target(count: torch.Tensor, total: int, gallery: torch.Tensor) -> torch.Tensor:
    """The variance variance_objective "plausible_count" fits (models.training.gallery_spread):
    geometrically between SPREAD_FLOOR and the gallery's spread by the share of the log count,

        ln t_{n,d} = ln SPREAD_FLOOR + (ln n / ln total) * (ln g_d - ln SPREAD_FLOOR),

    for count (N,) partners of each item (clamped to >= 1) out of `total` candidates and
    gallery (D,) the per-dimension variance of every candidate's mean (clamped to >=
    SPREAD_FLOOR): an item with one partner gets the floor, one with every candidate the
    gallery's spread, monotone in between. (N, D).

    Why not the partners' spread: under InfoNCE with plausible positives the means of a
    generic caption's many partners are pulled together, so their spread hardly follows
    ambiguity (clip art: Spearman +0.34 with ln(#plausible) on train), while the count itself
    is what the caption's text predicts (a ridge map from its MiniLM features: +0.79 on val;
    benchmarks/results/spread_gallery_clipart.md)."""
    share = count.clamp_min(1.0).log() / math.log(max(total, 2))  # (N,)
    floor = math.log(SPREAD_FLOOR)
    span = gallery.clamp_min(SPREAD_FLOOR).log() - floor  # (D,)
    return torch.exp(floor + share[:, None] * span[None, :])


OUTLIER_LOG_DET_MARGIN_PER_DIM = math.log(2.0)


def outlier_ranking_loss(image_logvar: torch.Tensor, outliers: int) -> torch.Tensor:
    """Outlier exposure (Hendrycks et al., 2019) on the image log-det: the mean over (outlier,
    real image) pairs of relu(margin - (log_det(outlier) - log_det(real))).

    The last `outliers` rows of image_logvar (N, D) are synthetic outliers. The margin, D ln 2,
    asks each outlier's variance to be at least twice every real image's, in geometric mean
    over the dimensions. The spread NLL alone gives an outlier the spread of all captions as
    its target, which the vaguest real images nearly reach, so it ranked the synthetic
    outliers well above real images but real photographs barely (AUROC 0.70 against 0.96);
    this term asks for the ranking itself.
    """
    if outliers <= 0 or outliers >= len(image_logvar):
        return image_logvar.new_zeros(())
    log_det = image_logvar.sum(-1)
    margin = OUTLIER_LOG_DET_MARGIN_PER_DIM * image_logvar.shape[-1]
    gap = log_det[-outliers:, None] - log_det[None, :-outliers]  # (outliers, real)
    return torch.relu(margin - gap).mean()
