"""The symmetric InfoNCE objective against a per-row loop of torch.log_softmax, on a separable
toy problem, wired through batch_loss, and its temperature's validation."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models.networks.model_config import ConfigError, ModelConfig, TrainConfig
from models.objectives import BatchEmbeddings, batch_loss
from models.objectives.hinge import similarity_matrix
from models.objectives.infonce import DEFAULT_TEMPERATURE, infonce_loss


def brute_force(
    similarity: torch.Tensor,
    caption_image: list[int],
    temperature: float,
    matches: torch.Tensor | None,
    caption_side_matches: bool,
) -> float:
    """The documented loss, one softmax per caption and per (image, own caption) pair."""
    num_images, num_captions = similarity.shape
    logits = similarity / temperature

    def positive(i: int, j: int) -> bool:
        return caption_image[j] == i or (matches is not None and bool(matches[i, j]))

    t2i = []
    for j in range(num_captions):
        kept = [i for i in range(num_images) if i == caption_image[j] or not positive(i, j)]
        column = torch.stack([logits[i, j] for i in kept])
        t2i.append(-float(torch.log_softmax(column, dim=0)[kept.index(caption_image[j])]))
    i2t = []
    for i in range(num_images):
        terms = []
        for j in (j for j in range(num_captions) if caption_image[j] == i):
            excluded = positive if caption_side_matches else (lambda i, k: caption_image[k] == i)
            negatives = [logits[i, k] for k in range(num_captions) if not excluded(i, k)]
            row = torch.stack([logits[i, j], *negatives])
            terms.append(-float(torch.log_softmax(row, dim=0)[0]))
        if terms:
            i2t.append(sum(terms) / len(terms))
    return sum(t2i) / len(t2i) + sum(i2t) / len(i2t)


@st.composite
def batches(draw: st.DrawFn) -> tuple[torch.Tensor, list[int], torch.Tensor | None, int]:
    """A similarity matrix, each caption's image (some images may have none, like synthetic
    outliers; some several), an optional matches mask, and a seed."""
    num_images = draw(st.integers(1, 6))
    caption_image = draw(st.lists(st.integers(0, num_images - 1), min_size=1, max_size=9))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    shape = (num_images, len(caption_image))
    similarity = torch.randn(shape, generator=generator, dtype=torch.float64)
    matches = None
    if draw(st.booleans()):
        matches = torch.rand(shape, generator=generator) < draw(st.sampled_from([0.2, 0.5, 1.0]))
    return similarity, caption_image, matches, seed


@settings(max_examples=150, deadline=None)
@given(batches(), st.sampled_from([0.02, 0.1, 1.0]), st.booleans())
def test_the_loss_equals_a_loop_of_log_softmax(
    batch: tuple[torch.Tensor, list[int], torch.Tensor | None, int],
    temperature: float,
    caption_side_matches: bool,
) -> None:
    similarity, caption_image, matches, _ = batch
    loss = infonce_loss(
        similarity, torch.tensor(caption_image), temperature, matches, caption_side_matches
    )
    expected = brute_force(similarity, caption_image, temperature, matches, caption_side_matches)
    assert loss.item() == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_gradients_stay_finite_when_every_caption_is_a_match() -> None:
    similarity = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    owner = torch.tensor([0, 0, 1, 2, 2])
    loss = infonce_loss(similarity, owner, 0.05, torch.ones(3, 5, dtype=torch.bool))
    (grad,) = torch.autograd.grad(loss, similarity)
    assert loss.item() == pytest.approx(0.0) and torch.isfinite(grad).all()


def test_one_caption_per_image_is_clips_loss_times_two() -> None:
    """With own pairs only and caption_image = arange(B), the sum of the two cross-entropies
    of CLIP (open_clip's ClipLoss averages them)."""
    similarity = torch.randn(6, 6, dtype=torch.float64)
    labels = torch.arange(6)
    logits = similarity / 0.07
    clip = torch.nn.functional.cross_entropy(logits, labels) + torch.nn.functional.cross_entropy(
        logits.T, labels
    )
    assert infonce_loss(similarity, labels, 0.07).item() == pytest.approx(clip.item())


def test_training_on_a_separable_problem_drives_the_loss_far_below_log_b() -> None:
    """Two linear heads on features where each caption is its image's vector plus noise."""
    generator = torch.Generator().manual_seed(0)
    num_images, dim = 16, 24
    owner = torch.arange(num_images).repeat_interleave(2)  # two captions per image
    image_x = torch.randn(num_images, dim, generator=generator)
    caption_x = image_x[owner] + 0.3 * torch.randn(len(owner), dim, generator=generator)
    torch.manual_seed(0)
    image_head, caption_head = torch.nn.Linear(dim, 16), torch.nn.Linear(dim, 16)
    params = [*image_head.parameters(), *caption_head.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-2)

    def loss() -> torch.Tensor:
        image = torch.nn.functional.normalize(image_head(image_x), dim=1)
        caption = torch.nn.functional.normalize(caption_head(caption_x), dim=1)
        return infonce_loss(image @ caption.T, owner, 0.1)

    initial = loss().item()
    assert initial > math.log(num_images)  # chance level in each direction, summed
    for _ in range(300):
        optimizer.zero_grad()
        value = loss()
        value.backward()
        optimizer.step()
    assert loss().item() < 0.1 * math.log(num_images)


def test_batch_loss_uses_infonce_on_the_models_similarity() -> None:
    generator = torch.Generator().manual_seed(1)
    mu_i = torch.nn.functional.normalize(torch.randn(4, 8, generator=generator), dim=1)
    mu_c = torch.nn.functional.normalize(torch.randn(6, 8, generator=generator), dim=1)
    lv_i, lv_c = torch.randn(4, 8, generator=generator), torch.randn(6, 8, generator=generator)
    owner = torch.tensor([0, 0, 1, 2, 3, 3])
    matches = torch.zeros(4, 6, dtype=torch.bool)
    matches[1, 0] = True
    batch = BatchEmbeddings(mu_i, lv_i, mu_c, lv_c, owner, matches)
    match = (torch.tensor(1.0), torch.tensor(0.0))
    for metric, temperature in (("cosine", 0.05), ("w2", 0.5)):
        config = ModelConfig(metric=metric)
        training = TrainConfig(objective="infonce", temperature=temperature)
        got = batch_loss(batch, config, training, match, "sum", None)
        similarity = similarity_matrix("gcie", metric, mu_i, lv_i, mu_c, lv_c)
        assert got.item() == pytest.approx(
            infonce_loss(similarity, owner, temperature, matches).item()
        )
        hinge = batch_loss(batch, config, TrainConfig(), match, "sum", None)
        assert got.item() != pytest.approx(hinge.item())


@pytest.mark.parametrize("temperature", [0.0, -0.1, float("nan")])
def test_a_temperature_that_is_not_positive_is_refused(temperature: float) -> None:
    with pytest.raises(ConfigError, match="temperature must be > 0"):
        TrainConfig(objective="infonce", temperature=temperature)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        infonce_loss(torch.zeros(2, 2), torch.arange(2), temperature)


def test_an_unknown_objective_names_infonce_among_the_choices() -> None:
    with pytest.raises(ConfigError, match="infonce"):
        TrainConfig(objective="nce")
    assert TrainConfig().temperature == DEFAULT_TEMPERATURE
