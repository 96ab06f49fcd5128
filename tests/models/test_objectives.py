"""The probabilistic objectives and regularisers against direct, independent computations."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch.distributions import Normal, kl_divergence

from models.networks.model_config import ConfigError, ModelConfig, TrainConfig
from models.objectives import BatchEmbeddings, batch_loss
from models.objectives.hinge import hinge_triplet_loss
from models.objectives.match_probability import (
    log1mexp,
    pcme_loss,
    pcmepp_loss,
    pseudo_positives,
)
from models.objectives.regularizers import (
    SPREAD_FLOOR,
    outlier_ranking_loss,
    partner_spread_loss,
    uniformity_loss,
    vib_loss,
)


def gaussians(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    mu = torch.nn.functional.normalize(torch.randn(n, d, generator=generator), dim=1)
    return mu.double(), (torch.randn(n, d, generator=generator) - 3).double()


def test_vib_is_the_kl_to_a_standard_normal() -> None:
    mu, logvar = gaussians(5, 4, 0)
    expected = kl_divergence(Normal(mu, (0.5 * logvar).exp()), Normal(0.0, 1.0)).sum(1).mean()
    assert vib_loss(mu, logvar).item() == pytest.approx(expected.item(), rel=1e-9)


def test_uniformity_matches_a_loop() -> None:
    mu, _ = gaussians(6, 3, 1)
    terms = [
        math.exp(-2 * float(((mu[i] - mu[j]) ** 2).sum()))
        for i in range(6)
        for j in range(6)
        if i != j
    ]
    assert uniformity_loss(mu).item() == pytest.approx(math.log(sum(terms) / len(terms)))


def _loop_uniformity(mu: torch.Tensor) -> float:
    n = len(mu)
    terms = [math.exp(-2 * float(((mu[i] - mu[j]) ** 2).sum())) for i in range(n) for j in range(n)]
    return math.log((sum(terms) - n) / (n * (n - 1)))  # the diagonal's n terms are exp(0)


@pytest.mark.parametrize(
    ("training", "weight"),
    [
        ({"objective": "pcme"}, 0.1),  # PCME's own term, chosen on shapes val
        ({"objective": "pcme", "uniformity_weight": 0.0}, 0.0),
        ({"objective": "pcme", "uniformity_weight": 2.0}, 2.0),
        ({"objective": "pcmepp"}, 0.0),  # PCME++ has none
        ({"objective": "hinge"}, 0.0),
        ({"objective": "hinge", "uniformity_weight": 0.5}, 0.5),
    ],
)
def test_the_uniformity_term_is_added_with_its_objectives_weight(
    training: dict, weight: float
) -> None:
    mu_i, lv_i = (t.float() for t in gaussians(3, 4, 11))
    mu_c, lv_c = (t.float() for t in gaussians(4, 4, 12))
    owner = torch.tensor([0, 1, 2, 2])
    own = torch.arange(3)[:, None] == owner[None, :]
    batch = BatchEmbeddings(mu_i, lv_i, mu_c, lv_c, owner, own)
    config, match = ModelConfig(metric="cosine"), (torch.tensor(5.0), torch.tensor(7.0))

    def loss(config_training: TrainConfig) -> float:
        generator = torch.Generator().manual_seed(0)  # PCME's sampled match probability
        return batch_loss(batch, config, config_training, match, "sum", generator).item()

    without = loss(TrainConfig(**{**training, "uniformity_weight": 0.0}))
    added = loss(TrainConfig(**training)) - without
    expected = weight * _loop_uniformity(torch.cat([mu_i, mu_c]).double())
    assert added == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_log1mexp_is_accurate_at_both_ends() -> None:
    x = torch.tensor([1e-10, 1e-3, 0.5, 0.7, 5.0, 40.0], dtype=torch.float64)
    expected = [math.log(-math.expm1(-v)) for v in x.tolist()]
    torch.testing.assert_close(log1mexp(x), torch.tensor(expected, dtype=torch.float64))


def test_pcmepp_loss_matches_a_direct_bce() -> None:
    image, caption = gaussians(3, 4, 2), gaussians(5, 4, 3)
    owner = torch.tensor([0, 0, 1, 2, 2])
    matches = torch.arange(3)[:, None] == owner[None, :]
    a, b = torch.tensor(2.0, dtype=torch.float64), torch.tensor(1.5, dtype=torch.float64)
    positive, negative = [], []
    for i in range(3):
        for j in range(5):
            csd = float(((image[0][i] - caption[0][j]) ** 2).sum())
            csd += float(image[1][i].exp().sum() + caption[1][j].exp().sum())
            p = 1 / (1 + math.exp(a.item() * csd - b.item()))
            if matches[i, j]:
                positive.append(-math.log(p))
            else:
                negative.append(-math.log(1 - p))
    loss = pcmepp_loss(image, caption, matches, owner, a, b, pseudo_positive_weight=0.0)
    # positives and negatives weigh the same: the mean of each, added
    expected = sum(positive) / len(positive) + sum(negative) / len(negative)
    assert loss.item() == pytest.approx(expected, rel=1e-9)


def test_pseudo_positives_are_negatives_as_close_as_a_positive() -> None:
    distance = torch.tensor([[1.0, 0.5, 3.0], [0.9, 2.0, 0.2]])
    owner = torch.tensor([0, 1, 1])  # caption 0 -> image 0; captions 1, 2 -> image 1
    positive = torch.arange(2)[:, None] == owner[None, :]
    pseudo = pseudo_positives(distance, positive, owner)
    # image 1 is closer to caption 0 (0.9) than caption 0's own image (1.0); caption 1 is
    # closer to image 0 (0.5) than to its own image (2.0); caption 2 is far from image 0.
    assert pseudo.tolist() == [[False, True, False], [True, False, False]]


def test_pcme_loss_uses_the_sampled_match_probability() -> None:
    image, caption = gaussians(2, 3, 4), gaussians(3, 3, 5)
    matches = torch.tensor([[True, False, False], [False, True, True]])
    a, b = torch.tensor(3.0, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64)
    loss = pcme_loss(image, caption, matches, a, b, 4, torch.Generator().manual_seed(9))
    generator = torch.Generator().manual_seed(9)
    eps_q = torch.randn((4, 3), generator=generator, dtype=torch.float64)
    eps_g = torch.randn((4, 3), generator=generator, dtype=torch.float64)
    positive, negative = [], []
    for i in range(2):
        z_i = image[0][i] + (0.5 * image[1][i]).exp() * eps_q  # (J, D)
        for j in range(3):
            z_j = caption[0][j] + (0.5 * caption[1][j]).exp() * eps_g
            d = torch.cdist(z_i, z_j)  # (J, J)
            p = float(torch.sigmoid(-a * d + b).mean())
            if matches[i, j]:
                positive.append(-math.log(p))
            else:
                negative.append(-math.log(1 - p))
    expected = sum(positive) / len(positive) + sum(negative) / len(negative)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("variance_objective", ["pcmepp", "spread"])
def test_variance_objective_leaves_the_means_alone(variance_objective: str) -> None:
    """With a variance objective, its term moves only the variances (and a, b)."""
    mu_i, lv_i = (t.float().requires_grad_() for t in gaussians(3, 4, 6))
    mu_c, lv_c = (t.float().requires_grad_() for t in gaussians(3, 4, 7))
    owner = torch.arange(3)
    own = owner[None, :] == owner[:, None]
    batch = BatchEmbeddings(mu_i, lv_i, mu_c, lv_c, owner, own, own)
    match = (torch.tensor(2.0), torch.tensor(1.0))
    config = ModelConfig(metric="cosine")
    hinge = batch_loss(batch, config, TrainConfig(), match, "sum", None)
    training = TrainConfig(variance_objective=variance_objective)
    both = batch_loss(batch, config, training, match, "sum", None)
    grads_hinge = torch.autograd.grad(hinge, [mu_i, mu_c])
    grads_both = torch.autograd.grad(both, [mu_i, mu_c, lv_i], allow_unused=True)
    torch.testing.assert_close(grads_both[0], grads_hinge[0])
    torch.testing.assert_close(grads_both[1], grads_hinge[1])
    assert grads_both[2] is not None and grads_both[2].abs().sum() > 0


def test_a_variance_objective_trains_the_means_against_its_variances_as_served() -> None:
    """Metric w2 with a variance objective: the retrieval loss is InfoNCE on -w2 with the
    variances as they are (written out here with torch.distributions' scales) and moves only
    the means; without a variance objective it moves the variances too."""
    mu_i, lv_i = (t.requires_grad_() for t in gaussians(3, 4, 8))
    mu_c, lv_c = (t.requires_grad_() for t in gaussians(3, 4, 9))
    owner = torch.arange(3)
    own = owner[None, :] == owner[:, None]
    batch = BatchEmbeddings(mu_i, lv_i, mu_c, lv_c, owner, own)
    match = (torch.tensor(2.0), torch.tensor(1.0))
    config = ModelConfig(metric="w2")
    training = TrainConfig(objective="infonce", temperature=0.2)
    counted = replace(training, variance_objective="plausible_count")
    loss = batch_loss(batch, config, counted, match, "sum", None)
    sd_i, sd_c = (Normal(mu, (0.5 * lv).exp()).scale for mu, lv in ((mu_i, lv_i), (mu_c, lv_c)))
    w2 = torch.cdist(mu_i, mu_c).pow(2) + torch.cdist(sd_i, sd_c).pow(2)  # (B, M)
    logits = -w2 / 0.2
    cross_entropy = torch.nn.functional.cross_entropy
    expected = cross_entropy(logits, owner) + cross_entropy(logits.T, owner)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-9)
    grads = torch.autograd.grad(loss, [mu_i, lv_i, lv_c], allow_unused=True)
    assert grads[0].abs().sum() > 0
    assert grads[1] is None and grads[2] is None
    plain = batch_loss(batch, config, training, match, "sum", None)
    assert plain.item() == pytest.approx(expected.item(), rel=1e-9)
    assert torch.autograd.grad(plain, lv_i)[0].abs().sum() > 0


def test_spread_loss_is_minimal_at_the_spread_of_the_partners() -> None:
    """The variance that minimises the loss is the partners' variance plus the floor: checked
    by gradient descent against numpy's own variance of the partner means."""
    torch.manual_seed(0)
    image_mu = torch.randn(4, 3, dtype=torch.float64)
    caption_mu = torch.randn(2, 3, dtype=torch.float64)
    partners = torch.tensor([[True, True], [True, False], [True, False], [False, True]])
    image_logvar = torch.zeros(4, 3, dtype=torch.float64, requires_grad=True)
    caption_logvar = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([image_logvar, caption_logvar], lr=0.05)
    for _ in range(3000):
        optimizer.zero_grad()
        loss = partner_spread_loss((image_mu, image_logvar), (caption_mu, caption_logvar), partners)
        loss.backward()
        optimizer.step()
    expected_c0 = image_mu[:3].numpy().var(axis=0) + SPREAD_FLOOR  # caption 0: images 0, 1, 2
    np.testing.assert_allclose(caption_logvar[0].exp().detach().numpy(), expected_c0, rtol=1e-3)
    expected_i0 = caption_mu.numpy().var(axis=0) + SPREAD_FLOOR  # image 0: captions 0 and 1
    np.testing.assert_allclose(image_logvar[0].exp().detach().numpy(), expected_i0, rtol=1e-3)
    single = np.full(3, SPREAD_FLOOR)  # image 3 has one partner: the floor
    np.testing.assert_allclose(image_logvar[3].exp().detach().numpy(), single, rtol=1e-3)


def test_an_outlier_gets_the_spread_of_every_caption_and_partners_nobody() -> None:
    """The last image row is an outlier: its target is the spread of all captions, and the
    captions' targets come from the real images alone; checked against a per-item loop."""
    torch.manual_seed(1)
    image_mu, image_logvar = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4)
    caption_mu, caption_logvar = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4)
    partners = torch.tensor([[True, True, False], [False, True, True], [False, False, False]])
    got = partner_spread_loss(
        (image_mu, image_logvar.double()), (caption_mu, caption_logvar.double()), partners, 1
    )
    everyone = torch.ones(3, dtype=torch.bool)
    image_partners = [partners[0], partners[1], everyone]  # the outlier: every caption
    caption_partners = [partners[:2, c] for c in range(3)]  # real images only
    expected = np.mean(
        [_nll(image_mu[:2][caption_partners[c]], caption_logvar[c]) for c in range(3)]
    ) + np.mean([_nll(caption_mu[image_partners[i]], image_logvar[i]) for i in range(3)])
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_outlier_ranking_is_the_mean_hinge_over_outlier_and_real_pairs() -> None:
    """Checked against a loop over (outlier, real image) pairs with numpy's log-dets; an
    outlier at least D ln 2 above every real image costs nothing."""
    logvar = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    log_det = logvar.sum(-1).numpy()
    margin = 4 * math.log(2.0)
    expected = np.mean(
        [max(0.0, margin - (log_det[o] - log_det[r])) for o in (3, 4) for r in range(3)]
    )
    assert outlier_ranking_loss(logvar, 2).item() == pytest.approx(expected, rel=1e-12)
    lifted = logvar.clone()
    lifted[3:] = logvar[:3].sum(-1).max() / 4 + math.log(2.0) + 0.01
    assert outlier_ranking_loss(lifted, 2).item() == 0.0


def test_outlier_ranking_moves_only_the_variances_and_needs_outliers() -> None:
    mu_i, lv_i = (t.float().requires_grad_() for t in gaussians(4, 3, 8))
    mu_c, lv_c = (t.float().requires_grad_() for t in gaussians(3, 3, 9))
    owner = torch.arange(3)
    own = torch.cat([owner[None, :] == owner[:, None], torch.zeros(1, 3, dtype=torch.bool)])
    batch = BatchEmbeddings(mu_i, lv_i, mu_c, lv_c, owner, own, own, outliers=1)
    match = (torch.tensor(2.0), torch.tensor(1.0))
    config = ModelConfig(metric="cosine")
    plain = batch_loss(batch, config, TrainConfig(outlier_fraction=0.25), match, "sum", None)
    ranked = TrainConfig(outlier_fraction=0.25, outlier_ranking_weight=2.0)
    both = batch_loss(batch, config, ranked, match, "sum", None)
    assert (both - plain).item() == pytest.approx(2.0 * outlier_ranking_loss(lv_i, 1).item())
    grads = torch.autograd.grad(both - plain, [mu_i, lv_i], allow_unused=True)
    assert grads[0].abs().sum() == 0 and grads[1].abs().sum() > 0
    with pytest.raises(ConfigError, match="needs outlier fraction"):
        TrainConfig(outlier_ranking_weight=1.0)


def _nll(partner_mu: torch.Tensor, logvar: torch.Tensor) -> float:
    """0.5 * sum(t / sigma^2 + ln sigma^2) with t the partners' variance (numpy) + the floor."""
    mine = partner_mu.numpy()
    target = (mine.var(axis=0) if len(mine) else np.zeros(mine.shape[1])) + SPREAD_FLOOR
    return float(0.5 * (target * np.exp(-logvar.double().numpy()) + logvar.double().numpy()).sum())


def test_hinge_never_uses_a_matching_pair_as_a_negative() -> None:
    similarity = torch.tensor([[0.9, 0.8, 0.1], [0.85, 0.2, 0.7]])
    owner = torch.tensor([0, 0, 1])
    base = hinge_triplet_loss(similarity, owner, 0.2, "sum")
    # caption 0 also describes image 1: that pair stops being a negative, so the loss drops by
    # exactly its two hinge terms (image 1 for caption 0, caption 0 for image 1).
    matches = torch.tensor([[True, True, False], [True, False, True]])
    loss = hinge_triplet_loss(similarity, owner, 0.2, "sum", matches)
    term_image = max(0.0, 0.2 + 0.85 - 0.9)  # image 1 vs own image 0, caption 0
    term_caption = max(0.0, 0.2 + 0.85 - 0.7)  # caption 0 vs own caption 2, image 1
    assert (base - loss).item() == pytest.approx((term_image + term_caption) / 3)


@pytest.mark.parametrize("metric", ["cosine", "w2"])
def test_counterfactual_term_scores_each_swap_with_its_captions_image(metric: str) -> None:
    """batch_loss adds weight x the hinge of s(image, swap) against s(image, caption), where
    the image is the one owning the swapped caption (checked against a loop over swaps)."""
    mu_i, lv_i = (t.float() for t in gaussians(3, 4, 1))
    mu_c, lv_c = (t.float() for t in gaussians(4, 4, 2))
    mu_s, lv_s = (t.float() for t in gaussians(2, 4, 3))
    owner, of = torch.tensor([0, 1, 2, 2]), torch.tensor([3, 0])
    own = torch.arange(3)[:, None] == owner[None, :]
    config = ModelConfig(metric=metric)
    plain = BatchEmbeddings(mu_i, lv_i, mu_c, lv_c, owner, own)
    swapped = BatchEmbeddings(mu_i, lv_i, mu_c, lv_c, owner, own, counterfactuals=(mu_s, lv_s, of))
    training = TrainConfig(counterfactual_weight=2.5)
    match = (torch.tensor(1.0), torch.tensor(0.0))
    added = batch_loss(swapped, config, training, match, "sum", None) - batch_loss(
        plain, config, training, match, "sum", None
    )

    def score(i: int, mu: torch.Tensor, lv: torch.Tensor) -> float:
        if metric == "cosine":
            return float(mu_i[i] @ mu)
        var_i, var = lv_i[i].exp(), lv.exp()
        return -float(((mu_i[i] - mu) ** 2).sum() + ((var_i.sqrt() - var.sqrt()) ** 2).sum())

    terms = [
        max(
            0.0,
            0.2 + score(int(owner[c]), mu_s[k], lv_s[k]) - score(int(owner[c]), mu_c[c], lv_c[c]),
        )
        for k, c in enumerate(of.tolist())
    ]
    assert added.item() == pytest.approx(2.5 * sum(terms) / 2, rel=1e-5, abs=1e-6)
    assert sum(terms) > 0


@pytest.mark.parametrize("metric", ["cosine", "w2"])
def test_swapped_image_term_scores_each_caption_with_its_image_and_its_swap(metric: str) -> None:
    """With swapped images, batch_loss adds weight x the hinge of s(swapped image, caption)
    against s(caption's own image, caption), one triple per caption a swap misses (checked
    against a loop); with both kinds the two hinges add up."""
    mu_i, lv_i = (t.float() for t in gaussians(3, 4, 1))
    mu_c, lv_c = (t.float() for t in gaussians(4, 4, 2))
    mu_w, lv_w = (t.float() for t in gaussians(3, 4, 5))
    owner, of = torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 3])
    own = torch.arange(3)[:, None] == owner[None, :]
    config = ModelConfig(metric=metric)
    training = TrainConfig(counterfactual_weight=1.5)
    match = (torch.tensor(1.0), torch.tensor(0.0))
    plain = batch_loss(BatchEmbeddings(mu_i, lv_i, mu_c, lv_c, owner, own), config, training,
                       match, "sum", None)  # fmt: skip
    swapped = BatchEmbeddings(mu_i, lv_i, mu_c, lv_c, owner, own, swapped_images=(mu_w, lv_w, of))
    added = batch_loss(swapped, config, training, match, "sum", None) - plain

    def score(image: tuple[torch.Tensor, torch.Tensor], c: int) -> float:
        if metric == "cosine":
            return float(image[0] @ mu_c[c])
        var_i, var = image[1].exp(), lv_c[c].exp()
        return -float(((image[0] - mu_c[c]) ** 2).sum() + ((var_i.sqrt() - var.sqrt()) ** 2).sum())

    own = [score((mu_i[owner[c]], lv_i[owner[c]]), c) for c in of.tolist()]
    terms = [
        max(0.0, 0.2 + score((mu_w[k], lv_w[k]), c) - own[k]) for k, c in enumerate(of.tolist())
    ]
    assert sum(terms) > 0
    assert added.item() == pytest.approx(1.5 * sum(terms) / 3, rel=1e-5, abs=1e-6)
    mu_s, lv_s = (t.float() for t in gaussians(1, 4, 3))
    both = replace(swapped, counterfactuals=(mu_s, lv_s, torch.tensor([0])))
    caption_only = replace(swapped, swapped_images=None, counterfactuals=both.counterfactuals)
    combined = batch_loss(both, config, training, match, "sum", None) - plain
    separate = batch_loss(caption_only, config, training, match, "sum", None) - plain + added
    assert combined.item() == pytest.approx(separate.item(), rel=1e-5, abs=1e-6)
