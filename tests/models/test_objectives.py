"""The probabilistic objectives and regularisers against direct, independent computations."""

import math

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from models.model_config import ModelConfig, TrainConfig
from models.objectives import BatchEmbeddings, batch_loss
from models.objectives.match_probability import (
    log1mexp,
    pcme_loss,
    pcmepp_loss,
    pseudo_positives,
)
from models.objectives.regularizers import uniformity_loss, vib_loss


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


def test_log1mexp_is_accurate_at_both_ends() -> None:
    x = torch.tensor([1e-10, 1e-3, 0.5, 0.7, 5.0, 40.0], dtype=torch.float64)
    expected = [math.log(-math.expm1(-v)) for v in x.tolist()]
    torch.testing.assert_close(log1mexp(x), torch.tensor(expected, dtype=torch.float64))


def test_pcmepp_loss_matches_a_direct_bce() -> None:
    image, caption = gaussians(3, 4, 2), gaussians(5, 4, 3)
    owner = torch.tensor([0, 0, 1, 2, 2])
    matches = torch.arange(3)[:, None] == owner[None, :]
    a, b = torch.tensor(2.0, dtype=torch.float64), torch.tensor(1.5, dtype=torch.float64)
    total = 0.0
    for i in range(3):
        for j in range(5):
            csd = float(((image[0][i] - caption[0][j]) ** 2).sum())
            csd += float(image[1][i].exp().sum() + caption[1][j].exp().sum())
            p = 1 / (1 + math.exp(a.item() * csd - b.item()))
            total -= math.log(p) if matches[i, j] else math.log(1 - p)
    loss = pcmepp_loss(image, caption, matches, owner, a, b, pseudo_positive_weight=0.0)
    assert loss.item() == pytest.approx(total / 15, rel=1e-9)


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
    total = 0.0
    for i in range(2):
        z_i = image[0][i] + (0.5 * image[1][i]).exp() * eps_q  # (J, D)
        for j in range(3):
            z_j = caption[0][j] + (0.5 * caption[1][j]).exp() * eps_g
            d = torch.cdist(z_i, z_j)  # (J, J)
            p = float(torch.sigmoid(-a * d + b).mean())
            total -= math.log(p) if matches[i, j] else math.log(1 - p)
    assert loss.item() == pytest.approx(total / 6, rel=1e-6)


def test_variance_objective_leaves_the_means_alone() -> None:
    """With variance_objective pcmepp, the PCME++ term moves only the variances (and a, b)."""
    mu_i, lv_i = (t.float().requires_grad_() for t in gaussians(3, 4, 6))
    mu_c, lv_c = (t.float().requires_grad_() for t in gaussians(3, 4, 7))
    owner = torch.arange(3)
    batch = BatchEmbeddings(mu_i, lv_i, mu_c, lv_c, owner, owner[None, :] == owner[:, None])
    match = (torch.tensor(2.0), torch.tensor(1.0))
    config = ModelConfig(metric="cosine")
    hinge = batch_loss(batch, config, TrainConfig(), match, "sum", None)
    both = batch_loss(batch, config, TrainConfig(variance_objective="pcmepp"), match, "sum", None)
    grads_hinge = torch.autograd.grad(hinge, [mu_i, mu_c])
    grads_both = torch.autograd.grad(both, [mu_i, mu_c, lv_i], allow_unused=True)
    torch.testing.assert_close(grads_both[0], grads_hinge[0])
    torch.testing.assert_close(grads_both[1], grads_hinge[1])
    assert grads_both[2] is not None and grads_both[2].abs().sum() > 0
