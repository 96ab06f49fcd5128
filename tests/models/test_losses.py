"""Hinge triplet losses against a loop over triplets, and the similarity of each model type
against closed forms written out here."""

import pytest
import torch

from models.objectives.hinge import (
    counterfactual_hinge_loss,
    hinge_triplet_loss,
    similarity_matrix,
)


def loop_triplet_loss(similarity, caption_image, margin, negatives, matches=None, both=True):
    """Reference: enumerate pairs and their negatives one by one; matches[k][c] spares image k
    as a negative of caption c and (if `both`) caption c as a negative of image k."""
    num_images, num_captions = len(similarity), len(caption_image)
    matches = matches or [[False] * num_captions for _ in range(num_images)]
    total = 0.0
    for j in range(num_captions):  # pair (image i, caption j)
        i = caption_image[j]
        matched = similarity[i][j]
        image_costs = [
            max(0.0, margin + similarity[k][j] - matched)
            for k in range(num_images)
            if k != i and not matches[k][j]
        ]
        caption_costs = [
            max(0.0, margin + similarity[i][c] - matched)
            for c in range(num_captions)
            if caption_image[c] != i and not (both and matches[i][c])
        ]
        for costs in (image_costs, caption_costs):
            total += max(costs, default=0.0) if negatives == "hardest" else sum(costs)
    return total / num_captions


@pytest.mark.parametrize("negatives", ["hardest", "sum"])
@pytest.mark.parametrize("caption_image", [[0, 1, 2, 3, 4], [0, 1, 1, 2, 0, 3, 4, 2]])
def test_hinge_loss_matches_loop_reference(negatives: str, caption_image: list[int]) -> None:
    generator = torch.Generator().manual_seed(0)
    similarity = torch.randn(5, len(caption_image), generator=generator, dtype=torch.float64)
    loss = hinge_triplet_loss(similarity, torch.tensor(caption_image), 0.3, negatives)
    expected = loop_triplet_loss(similarity.tolist(), caption_image, 0.3, negatives)
    assert loss.item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("negatives", ["hardest", "sum"])
@pytest.mark.parametrize("both", [True, False])
def test_plausible_matches_are_spared_as_the_loop_says(negatives: str, both: bool) -> None:
    generator = torch.Generator().manual_seed(1)
    caption_image = [0, 1, 1, 2, 0, 3, 4, 2]
    similarity = torch.randn(5, 8, generator=generator, dtype=torch.float64)
    matches = torch.rand(5, 8, generator=generator) < 0.3
    loss = hinge_triplet_loss(
        similarity, torch.tensor(caption_image), 0.3, negatives, matches, caption_side_matches=both
    )
    expected = loop_triplet_loss(
        similarity.tolist(), caption_image, 0.3, negatives, matches.tolist(), both
    )
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_loss_is_zero_when_every_match_wins_by_the_margin_and_positive_otherwise() -> None:
    similarity = torch.eye(4) * 0.25
    diagonal = torch.arange(4)
    assert hinge_triplet_loss(similarity, diagonal, margin=0.2).item() == 0.0
    assert hinge_triplet_loss(similarity, diagonal, margin=0.3).item() == pytest.approx(0.1)
    assert hinge_triplet_loss(similarity, diagonal, 0.3, "sum").item() == pytest.approx(0.3)


def test_other_captions_of_the_same_image_are_not_negatives() -> None:
    # captions 0 and 1 both belong to image 0; caption 1 scores higher with image 0 than
    # caption 0 does, which must not count as a violation
    similarity = torch.tensor([[0.5, 0.9, -1.0], [-1.0, -1.0, 0.5]])
    assert hinge_triplet_loss(similarity, torch.tensor([0, 0, 1]), margin=0.2).item() == 0.0


def test_hardest_negative_gradient_reaches_only_the_hardest_pair() -> None:
    similarity = torch.tensor(
        [[1.0, 0.9, 0.1], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], requires_grad=True
    )
    hinge_triplet_loss(similarity, torch.arange(3), margin=0.2).backward()
    grad = similarity.grad
    assert grad[0, 1] > 0 and grad[0, 2] == 0  # (0, 1) violates, (0, 2) does not


def test_unknown_negatives_is_refused() -> None:
    with pytest.raises(ValueError, match="hardest"):
        hinge_triplet_loss(torch.zeros(2, 2), torch.arange(2), 0.2, "softmax")


def gaussians(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    mu = torch.randn(n, 5, generator=generator, dtype=torch.float64)
    logvar = torch.randn(n, 5, generator=generator, dtype=torch.float64) * 0.5
    return mu, logvar


def test_similarity_is_minus_kl_of_image_given_caption() -> None:
    image_mu, image_logvar = gaussians(3, 1)
    caption_mu, caption_logvar = gaussians(4, 2)
    got = similarity_matrix("gcie", "kl", image_mu, image_logvar, caption_mu, caption_logvar)
    for i in range(3):
        for j in range(4):
            var_i, var_c = image_logvar[i].exp(), caption_logvar[j].exp()
            kl = 0.5 * torch.sum(
                var_i / var_c
                + (image_mu[i] - caption_mu[j]) ** 2 / var_c
                - 1
                + caption_logvar[j]
                - image_logvar[i]
            )
            assert got[i, j].item() == pytest.approx(-kl.item(), rel=1e-9)


def test_similarity_is_minus_w2_with_standard_deviations() -> None:
    image_mu, image_logvar = gaussians(3, 3)
    caption_mu, caption_logvar = gaussians(2, 4)
    got = similarity_matrix("gcie", "w2", image_mu, image_logvar, caption_mu, caption_logvar)
    sigma_i, sigma_c = (0.5 * image_logvar).exp(), (0.5 * caption_logvar).exp()
    expected = -(
        ((image_mu[:, None] - caption_mu[None]) ** 2).sum(-1)
        + ((sigma_i[:, None] - sigma_c[None]) ** 2).sum(-1)
    )
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("model_type", ["gce", "gie"])
def test_mahalanobis_uses_the_variance_of_the_gaussian_modality(model_type: str) -> None:
    image_mu, image_logvar = gaussians(3, 5)
    caption_mu, caption_logvar = gaussians(4, 6)
    got = similarity_matrix(
        model_type, "mahalanobis", image_mu, image_logvar, caption_mu, caption_logvar
    )
    logvar = caption_logvar[None] if model_type == "gce" else image_logvar[:, None]  # broadcast
    expected = -(((image_mu[:, None] - caption_mu[None]) ** 2) / logvar.exp()).sum(-1)
    assert got.shape == (3, 4)
    torch.testing.assert_close(got, expected)


def test_cosine_is_the_dot_product_of_unit_means() -> None:
    image_mu = torch.nn.functional.normalize(torch.randn(3, 4), dim=1)
    caption_mu = torch.nn.functional.normalize(torch.randn(2, 4), dim=1)
    got = similarity_matrix(
        "vse", "cosine", image_mu, torch.zeros(3, 4), caption_mu, torch.zeros(2, 4)
    )
    expected = torch.nn.functional.cosine_similarity(image_mu[:, None], caption_mu[None], dim=-1)
    torch.testing.assert_close(got, expected)


def test_counterfactual_hinge_matches_a_loop() -> None:
    own, swapped = torch.tensor([0.9, 0.1, 0.5]), torch.tensor([0.2, 0.3, 0.45])
    expected = (
        sum(max(0.0, 0.2 + s - o) for o, s in zip(own.tolist(), swapped.tolist(), strict=True)) / 3
    )
    assert counterfactual_hinge_loss(own, swapped, 0.2).item() == pytest.approx(expected)
    assert counterfactual_hinge_loss(torch.zeros(0), torch.zeros(0)).item() == 0.0
    with pytest.raises(ValueError, match="matching shapes"):
        counterfactual_hinge_loss(own, swapped[:2])
