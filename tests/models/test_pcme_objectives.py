"""PCME's and PCME++'s objectives against independent computations: the closed forms against
Monte-Carlo estimates from torch.distributions samples, the gradients against finite
differences, and training on a small separable problem against the loss's trivial value."""

import math

import pytest
import torch
from torch.distributions import Normal

from models.distance.gaussian import pairwise_distance
from models.networks.model_config import ConfigError, ModelConfig, TrainConfig
from models.networks.probabilistic_model import build_model
from models.objectives import INITIAL_MATCH, PCMEPP_MATCH_LR
from models.objectives.match_probability import balanced_mean, pcme_loss, pcmepp_loss
from models.training.train import parameter_groups, start_match

TRIVIAL_BALANCED_BCE = 2 * math.log(2)  # one constant p for every pair: p = 1/2 is best


def gaussians(n: int, d: int, seed: int, shift: float = -3.0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    mu = torch.nn.functional.normalize(torch.randn(n, d, generator=generator), dim=1)
    return mu.double(), (0.5 * torch.randn(n, d, generator=generator) + shift).double()


def samples(mu: torch.Tensor, logvar: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """(count, N, D) draws of N(mu, exp(logvar)) from torch.distributions."""
    torch.manual_seed(seed)
    return Normal(mu, (0.5 * logvar).exp()).sample((count,))


def test_csd_is_the_expected_squared_distance_between_samples() -> None:
    image, caption = gaussians(3, 5, 0, shift=-1.0), gaussians(4, 5, 1, shift=-1.0)
    z_image = samples(*image, 200_000, 2)  # (S, 3, D)
    z_caption = samples(*caption, 200_000, 3)  # (S, 4, D)
    estimate = ((z_image[:, :, None] - z_caption[:, None]) ** 2).sum(-1).mean(0)  # (3, 4)
    torch.testing.assert_close(
        pairwise_distance("csd", *image, *caption), estimate, rtol=0.01, atol=0
    )


def test_match_probability_is_the_expected_sigmoid_between_samples() -> None:
    """-ln of the mean sigmoid over J x J sample pairs (J = 1000, so its own Monte-Carlo
    error, about 0.003, is inside the tolerance) against 10^5 independent draws."""
    image, caption = gaussians(2, 4, 4, shift=-2.0), gaussians(3, 4, 5, shift=-2.0)
    a, b = 2.0, 2.0
    z_image = samples(*image, 100_000, 6)
    z_caption = samples(*caption, 100_000, 7)
    distance = ((z_image[:, :, None] - z_caption[:, None]) ** 2).sum(-1).sqrt()  # (S, 2, 3)
    estimate = torch.sigmoid(-a * distance + b).mean(0)
    closed = pairwise_distance(
        "match_prob", *image, *caption, num_samples=1000, a=a, b=b, seed=0
    )  # fmt: skip  # (2, 3) -ln p
    assert estimate.min() > 0.1 and estimate.max() < 0.9  # a pair of each kind of value
    torch.testing.assert_close((-closed).exp(), estimate, rtol=0, atol=0.01)


def batch(seed: int) -> tuple:
    image, caption = gaussians(3, 4, seed), gaussians(5, 4, seed + 1)
    owner = torch.tensor([0, 0, 1, 2, 2])
    matches = torch.arange(3)[:, None] == owner[None, :]
    return image, caption, owner, matches


@pytest.mark.parametrize("pseudo_positive_weight", [0.0, 0.1])
def test_pcmepp_gradient_matches_finite_differences(pseudo_positive_weight: float) -> None:
    image, caption, owner, matches = batch(10)
    a, b = torch.tensor(2.0, dtype=torch.float64), torch.tensor(1.5, dtype=torch.float64)
    inputs = tuple(t.clone().requires_grad_() for t in (*image, *caption, a, b))

    def loss(mu_i, lv_i, mu_c, lv_c, scale, shift):
        return pcmepp_loss(
            (mu_i, lv_i), (mu_c, lv_c), matches, owner, scale, shift, pseudo_positive_weight
        )

    assert torch.autograd.gradcheck(loss, inputs)


def test_pcme_gradient_matches_finite_differences() -> None:
    image, caption, _, matches = batch(20)
    a, b = torch.tensor(3.0, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64)
    inputs = tuple(t.clone().requires_grad_() for t in (*image, *caption, a, b))

    def loss(mu_i, lv_i, mu_c, lv_c, scale, shift):
        noise = torch.Generator().manual_seed(0)  # the same samples at every evaluation
        return pcme_loss((mu_i, lv_i), (mu_c, lv_c), matches, scale, shift, 3, noise)

    assert torch.autograd.gradcheck(loss, inputs)


def test_balanced_mean_weighs_both_classes_alike() -> None:
    loss = torch.tensor([[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]])
    positive = torch.tensor([[True, False, False], [False, False, False]])
    assert balanced_mean(loss, positive).item() == pytest.approx(1.0 + (3 + 5 + 7 + 9 + 11) / 5)
    assert balanced_mean(loss, torch.zeros_like(positive)).item() == pytest.approx(6.0)


def test_all_pairs_weighting_is_the_plain_mean_bce_of_every_pair() -> None:
    """PCME++'s own weighting: torch's BCE-with-logits mean over every pair, of logits
    -a * csd + b with csd written out here, for hard and for soft labels."""
    image, caption, owner, matches = batch(30)
    a, b = torch.tensor(2.0, dtype=torch.float64), torch.tensor(1.5, dtype=torch.float64)
    csd = (
        ((image[0][:, None] - caption[0][None]) ** 2).sum(-1)
        + image[1].exp().sum(-1)[:, None]
        + caption[1].exp().sum(-1)[None]
    )
    bce = torch.nn.BCEWithLogitsLoss()
    for labels in (matches, 0.8 * matches.double() + 0.1):
        got = pcmepp_loss(image, caption, labels, owner, a, b, 0.0, weighting="all_pairs")
        torch.testing.assert_close(got, bce(-a * csd + b, labels.double()))
    balanced = pcmepp_loss(image, caption, matches, owner, a, b, 0.0)
    assert not torch.isclose(balanced, bce(-a * csd + b, matches.double()))


def test_all_pairs_weighting_of_pcme_is_the_mean_over_every_pair() -> None:
    image, caption, _, matches = batch(40)
    a, b = torch.tensor(3.0, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64)

    def loss(weighting: str) -> torch.Tensor:
        noise = torch.Generator().manual_seed(0)
        return pcme_loss(image, caption, matches, a, b, 3, noise, weighting)

    p = torch.exp(
        -pairwise_distance(
            "match_prob", *image, *caption, num_samples=3, a=a, b=b,
            generator=torch.Generator().manual_seed(0),
        )
    )  # fmt: skip
    per_pair = torch.where(matches, -torch.log(p), -torch.log1p(-p))
    torch.testing.assert_close(loss("all_pairs"), per_pair.mean())
    torch.testing.assert_close(loss("balanced"), balanced_mean(per_pair, matches))


def test_an_unknown_match_weighting_is_refused() -> None:
    with pytest.raises(ConfigError, match="match weighting must be one of balanced, all_pairs"):
        TrainConfig(objective="pcmepp", match_weighting="sum")


class SeparableModel(torch.nn.Module):
    """Linear Gaussian heads on noisy one-hot features of K classes: separable by class."""

    def __init__(self, features: int, dim: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.image = torch.nn.Linear(features, 2 * dim)
        self.caption = torch.nn.Linear(features, 2 * dim)
        self.log_scale = torch.nn.Parameter(torch.tensor(math.log(5.0)))
        self.shift = torch.nn.Parameter(torch.tensor(5.0))

    def embed(self, head: torch.nn.Linear, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mu, logvar = head(x).chunk(2, dim=1)
        return torch.nn.functional.normalize(mu, dim=1), logvar - 4.0


def separable_batch(classes: int, captions_per_image: int, seed: int) -> tuple:
    """One image per class and `captions_per_image` captions each: 1 positive in `classes`."""
    generator = torch.Generator().manual_seed(seed)
    image_x = torch.eye(classes) + 0.1 * torch.randn(classes, classes, generator=generator)
    owner = torch.arange(classes).repeat_interleave(captions_per_image)
    caption_x = torch.eye(classes)[owner] + 0.1 * torch.randn(
        len(owner), classes, generator=generator
    )
    return image_x, caption_x, owner


@pytest.mark.parametrize("objective", ["pcmepp", "pcme"])
def test_loss_falls_well_below_its_trivial_value_on_a_separable_problem(objective: str) -> None:
    """16 classes, 1 positive pair in 16: the trained loss is under a fifth of the best
    constant-probability loss, and every caption's nearest image is its own."""
    torch.set_num_threads(1)
    model = SeparableModel(16, 8)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    image_x, caption_x, owner = separable_batch(16, 2, 0)
    matches = torch.arange(16)[:, None] == owner[None, :]

    def loss(seed: int, pseudo_weight: float) -> tuple[torch.Tensor, tuple, tuple]:
        image = model.embed(model.image, image_x)
        caption = model.embed(model.caption, caption_x)
        scale = model.log_scale.exp()
        if objective == "pcmepp":
            value = pcmepp_loss(image, caption, matches, owner, scale, model.shift, pseudo_weight)
        else:
            noise = torch.Generator().manual_seed(seed)
            value = pcme_loss(image, caption, matches, scale, model.shift, 5, noise)
        return value, image, caption

    for step in range(300):
        optimizer.zero_grad()
        loss(step, 0.1)[0].backward()
        optimizer.step()
    with torch.no_grad():
        final, image, caption = loss(0, 0.0)
        nearest = pairwise_distance("csd", *caption, *image).argmin(dim=1)
    assert final.item() < 0.2 * TRIVIAL_BALANCED_BCE
    assert torch.equal(nearest, owner)


def test_pcme_starts_unrelated_unit_means_at_even_odds() -> None:
    """PCME's initial b puts two unrelated unit means (sqrt 2 apart) at p = 1/2 under the
    default a, the balanced loss's best constant probability."""
    scale, shift = INITIAL_MATCH["pcme"]
    logit = -scale * math.sqrt(2) + shift
    assert abs(torch.sigmoid(torch.tensor(logit)).item() - 0.5) < 0.05


@pytest.mark.parametrize("objective", ["pcme", "pcmepp", "infonce"])
def test_training_starts_the_match_logit_where_the_objective_does(objective: str) -> None:
    model = build_model(ModelConfig(model_type="gcie", metric="csd", vocab_size=20))
    default = (model.match_scale.item(), model.match_shift.item())
    start_match(model, objective)
    scale, shift = INITIAL_MATCH.get(objective, default)
    assert model.match_scale.item() == pytest.approx(scale)
    assert model.match_shift.item() == pytest.approx(shift)


@pytest.mark.parametrize(
    ("training", "expected"),
    [
        ({"objective": "pcme"}, 2e-3),  # the encoders' lr, as the papers
        ({"objective": "pcmepp"}, PCMEPP_MATCH_LR),
        ({"objective": "hinge", "variance_objective": "pcmepp"}, PCMEPP_MATCH_LR),
        ({"objective": "pcme", "match_lr": 0.05}, 0.05),
        ({"objective": "pcmepp", "match_lr": 1e-3}, 1e-3),
    ],
)
def test_the_match_logit_learns_at_its_objectives_rate(training: dict, expected: float) -> None:
    model = build_model(ModelConfig(model_type="gcie", metric="csd", vocab_size=20))
    encoders, match = parameter_groups(model, TrainConfig(lr=2e-3, **training))
    assert encoders["lr"] == 2e-3
    assert match["lr"] == pytest.approx(expected)
    assert {id(p) for p in match["params"]} == {id(model.match_log_scale), id(model.match_shift)}


@pytest.mark.parametrize("match_lr", [0.0, -1e-3])
def test_a_match_lr_that_is_not_positive_is_refused(match_lr: float) -> None:
    with pytest.raises(ConfigError, match="match lr"):
        TrainConfig(objective="pcme", match_lr=match_lr)
