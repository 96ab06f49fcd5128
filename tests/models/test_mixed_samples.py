"""PCME++'s mixed-sample augmentation (models.training.mixed_samples) and the soft-label BCE
of models.objectives.match_probability, against independent computations: the BCE against a
per-pair loop of torch's binary_cross_entropy_with_logits, the mixed images against the
convex combination and the pasted box they must be, the soft labels against a per-pair loop;
each check is also shown to catch a deliberately broken variant. With the option off nothing
changes: the batches are the same and the soft labels are never made."""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from models.datasets.shapes import generate_shapes
from models.networks.model_config import ConfigError, ModelConfig, TrainConfig
from models.objectives.match_probability import (
    balanced_mean,
    pcmepp_loss,
    positive_mask,
    pseudo_positives,
    soft_balanced_bce,
)
from models.training import train as train_module
from models.training.batches import prepare_batch
from models.training.mixed_samples import MixedSamples, mix_images, soft_match_targets
from models.training.train import _refuse_for_backbones, train
from models.training.training_data import epoch_batches, image_batch, load_splits

PCMEPP = {"objective": "pcmepp", "vib_beta": 1e-4}
MSDA = {**PCMEPP, "mixed_sample_fraction": 0.25, "match_label_smoothing": 1e-4}


# ---- the soft-label BCE ---------------------------------------------------------------------


def brute_force_soft_bce(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """sum t (-ln p) / sum t + sum (1 - t) (-ln(1 - p)) / sum (1 - t), pair by pair, with -ln p
    and -ln(1 - p) from torch's BCE at the labels 1 and 0."""
    positive = negative = positive_mass = negative_mass = 0.0
    for i in range(logits.shape[0]):
        for j in range(logits.shape[1]):
            x, t = logits[i, j], float(targets[i, j])
            positive += t * float(F.binary_cross_entropy_with_logits(x, x.new_tensor(1.0)))
            negative += (1 - t) * float(F.binary_cross_entropy_with_logits(x, x.new_tensor(0.0)))
            positive_mass, negative_mass = positive_mass + t, negative_mass + 1 - t
    total = positive / positive_mass if positive_mass > 0 else 0.0
    return total + (negative / negative_mass if negative_mass > 0 else 0.0)


def soft_problem(draw_seed: int, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(draw_seed)
    logits = 8 * torch.randn(rows, cols, generator=generator, dtype=torch.float64)
    targets = torch.rand(rows, cols, generator=generator, dtype=torch.float64)
    return logits, targets


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.integers(1, 6))
def test_soft_bce_is_the_per_pair_loop(seed: int, rows: int, cols: int) -> None:
    logits, targets = soft_problem(seed, rows, cols)
    # some labels exactly 0 or 1, as most of a real batch's are
    targets = torch.where(targets < 0.3, 0.0, torch.where(targets > 0.8, 1.0, targets))
    assert float(soft_balanced_bce(logits, targets)) == pytest.approx(
        brute_force_soft_bce(logits, targets), rel=1e-9, abs=1e-12
    )


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.integers(1, 6))
def test_soft_bce_of_hard_labels_is_the_balanced_mean(seed: int, rows: int, cols: int) -> None:
    """0/1 labels as floats give the balanced BCE of bool labels: the soft loss is its
    generalisation, not another loss."""
    logits, draw = soft_problem(seed, rows, cols)
    hard = draw < 0.3
    per_pair = F.binary_cross_entropy_with_logits(logits, hard.double(), reduction="none")
    torch.testing.assert_close(
        soft_balanced_bce(logits, hard.double()),
        balanced_mean(per_pair, hard),
        rtol=1e-9,
        atol=1e-12,
    )


def test_a_bce_averaged_within_hard_classes_fails_the_loop() -> None:
    """The check above catches the natural wrong generalisation: the per-pair soft BCE
    averaged within the classes of the thresholded labels."""
    logits, targets = soft_problem(3, 4, 5)

    def broken(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return balanced_mean(F.binary_cross_entropy_with_logits(x, t, reduction="none"), t > 0.5)

    expected = brute_force_soft_bce(logits, targets)
    assert float(soft_balanced_bce(logits, targets)) == pytest.approx(expected, rel=1e-9)
    assert float(broken(logits, targets)) != pytest.approx(expected, rel=1e-3)


def gaussians(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    mu = F.normalize(torch.randn(n, d, generator=generator, dtype=torch.float64), dim=1)
    return mu, 0.5 * torch.randn(n, d, generator=generator, dtype=torch.float64) - 3.0


def pcmepp_problem(seed: int) -> tuple:
    """4 images, 2 captions each, PCME++'s initial a = b = 5."""
    owner = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    five = torch.tensor(5.0, dtype=torch.float64)
    return gaussians(4, 6, seed), gaussians(8, 6, seed + 1), owner, five, five


@pytest.mark.parametrize("weight", [0.0, 0.1])
def test_pcmepp_loss_of_float_hard_labels_is_the_bool_one(weight: float) -> None:
    image, caption, owner, scale, shift = pcmepp_problem(0)
    matches = positive_mask(4, owner)
    hard = pcmepp_loss(image, caption, matches, owner, scale, shift, weight)
    soft = pcmepp_loss(image, caption, matches.double(), owner, scale, shift, weight)
    torch.testing.assert_close(soft, hard, rtol=1e-9, atol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pseudo_positives_get_their_rows_largest_soft_label(seed: int) -> None:
    image, caption, owner, scale, shift = pcmepp_problem(seed)
    targets = soft_match_targets(positive_mask(4, owner), mixed_pairs(), 1e-4).double()
    csd = ((image[0][:, None] - caption[0][None]) ** 2).sum(-1)
    csd = csd + image[1].exp().sum(1)[:, None] + caption[1].exp().sum(1)[None]
    logits = -scale * csd + shift
    pseudo = pseudo_positives(csd, positive_mask(4, owner), owner)
    relabelled = targets.clone()
    for i in range(4):
        for j in range(8):
            if pseudo[i, j]:
                relabelled[i, j] = max(float(t) for t in targets[i])
    expected = brute_force_soft_bce(logits, targets) + 0.1 * brute_force_soft_bce(
        logits, relabelled
    )
    loss = pcmepp_loss(image, caption, targets, owner, scale, shift, 0.1)
    assert float(loss) == pytest.approx(expected, rel=1e-9)


# ---- the mixed images -----------------------------------------------------------------------


def mixed_pairs() -> MixedSamples:
    """Image 1 is 0.7 itself and 0.3 image 3 (mixup); image 2 0.6 itself, 0.4 image 0 (cutmix)."""
    return MixedSamples(
        torch.tensor([1, 2]), torch.tensor([3, 0]), torch.tensor([0.7, 0.6]),
        torch.tensor([False, True]),
    )  # fmt: skip


def mix_problems(images: torch.Tensor, result: torch.Tensor, mixed: MixedSamples) -> list[str]:
    """What is wrong with `result` as `images` mixed as `mixed` says: unmixed images changed, a
    mixup image that is not lambda x its own + (1 - lambda) x its partner's pixels, a cutmix
    image whose changed pixels are not one box of the partner's covering 1 - lambda."""
    problems = []
    rows = mixed.rows.tolist()
    others = [r for r in range(len(images)) if r not in rows]
    if not torch.equal(result[others], images[others]):
        problems.append("an unmixed image changed")
    height, width = images.shape[-2:]
    for row, partner, weight, cut in zip(
        rows, mixed.partners.tolist(), mixed.weights.tolist(), mixed.cutmix.tolist(), strict=True
    ):
        own, other, got = images[row], images[partner], result[row]
        if row == partner or not 0.0 < weight <= 1.0:
            problems.append(f"image {row}: partner {partner}, lambda {weight}")
        elif not cut:
            if not torch.allclose(got, weight * own + (1 - weight) * other, rtol=0, atol=1e-5):
                problems.append(f"image {row} is no mixup with lambda {weight}")
        else:
            changed = (got != own).any(dim=0)  # (H, W)
            ys, xs = changed.nonzero(as_tuple=True)
            box = torch.zeros_like(changed)
            if len(ys):
                box[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1] = True
            if not torch.equal(box, changed) or not torch.equal(got[:, box], other[:, box]):
                problems.append(f"image {row}: the changed pixels are no box of image {partner}")
            area = float(changed.sum()) / (height * width)
            if not math.isclose(1 - area, weight, abs_tol=1e-6):
                problems.append(f"image {row}: box covers {area}, lambda {weight}")
    return problems


def distinct_images(count: int, seed: int) -> torch.Tensor:
    """(count, 3, 12, 10) images with no pixel value shared between two images."""
    generator = torch.Generator().manual_seed(seed)
    return (
        torch.rand(count, 3, 12, 10, generator=generator) + torch.arange(count)[:, None, None, None]
    )


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 12), st.floats(0.0, 1.0))
def test_mixed_images_are_mixups_and_pasted_boxes(seed: int, size: int, fraction: float) -> None:
    images = distinct_images(size, seed)
    before = images.clone()
    result, mixed = mix_images(images, fraction, np.random.default_rng(seed))
    assert torch.equal(images, before)  # the input is left alone
    count = round(fraction * size)
    if count == 0:
        assert mixed is None and result is images
        return
    assert mixed is not None and len(set(mixed.rows.tolist())) == count
    assert mix_problems(images, result, mixed) == []


def test_both_kinds_are_drawn_about_half_the_time() -> None:
    rng = np.random.default_rng(0)
    kinds = [mix_images(distinct_images(32, 0), 0.25, rng)[1].cutmix for _ in range(100)]
    assert 0.4 < float(torch.cat(kinds).double().mean()) < 0.6


def test_the_image_check_catches_swapped_and_uncorrected_lambdas() -> None:
    images = distinct_images(16, 1)
    result, mixed = mix_images(images, 0.5, np.random.default_rng(1))
    assert mixed is not None and mixed.cutmix.any() and (~mixed.cutmix).any()
    assert mix_problems(images, result, mixed) == []
    swapped = dataclasses.replace(mixed, weights=1 - mixed.weights)
    assert len(mix_problems(images, result, swapped)) >= len(mixed.rows) - 1  # lambda 1/2 passes
    # cutmix's lambda left at its Beta draw instead of the box's area
    uncorrected = dataclasses.replace(
        mixed, weights=torch.where(mixed.cutmix, mixed.weights + 0.05, mixed.weights)
    )
    problems = mix_problems(images, result, uncorrected)
    assert len(problems) == int(mixed.cutmix.sum()) and all("box covers" in p for p in problems)
    wrong_partner = dataclasses.replace(mixed, partners=(mixed.partners + 1) % 16)
    assert len(mix_problems(images, result, wrong_partner)) == len(mixed.rows)


def test_features_cannot_be_mixed() -> None:
    with pytest.raises(ValueError, match="images"):
        mix_images(torch.zeros(8, 5), 0.25, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="mixed_sample_fraction"):
        _refuse_for_backbones(TrainConfig(**MSDA))


# ---- the soft labels ------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 8), st.sampled_from([0.0, 1e-4, 0.1]))
def test_soft_labels_mix_the_two_images_rows(seed: int, size: int, smoothing: float) -> None:
    """Per pair: lambda where the caption is the mixed image's, 1 - lambda where it is its
    partner's, 0 elsewhere (1 or 0 for an unmixed image's row), then smoothed."""
    rng = np.random.default_rng(seed)
    owner = torch.from_numpy(rng.integers(0, size, 3 * size))
    _, mixed = mix_images(distinct_images(size, seed), 0.5, rng)
    targets = soft_match_targets(positive_mask(size, owner), mixed, smoothing)
    mix = {} if mixed is None else dict(zip(mixed.rows.tolist(), zip(
        mixed.partners.tolist(), mixed.weights.tolist(), strict=True), strict=True))  # fmt: skip
    for i in range(size):
        for j, image in enumerate(owner.tolist()):
            if i in mix:
                partner, weight = mix[i]
                label = weight * (image == i) + (1 - weight) * (image == partner)
            else:
                label = float(image == i)
            label = (1 - smoothing) * label + smoothing * (1 - label)
            assert float(targets[i, j]) == pytest.approx(label, abs=1e-6)


def test_soft_labels_of_a_plausible_match_matrix_mix_its_rows() -> None:
    plausible = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)
    mixed = MixedSamples(
        torch.tensor([0]), torch.tensor([1]), torch.tensor([0.75]), torch.tensor([False])
    )
    expected = torch.tensor([[0.75, 1.0, 0.25, 0.0], [0, 1, 1, 0], [0, 0, 0, 1]])
    torch.testing.assert_close(soft_match_targets(plausible, mixed, 0.0), expected)


# ---- in training ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_shapes(tmp_path_factory) -> Path:
    return generate_shapes(
        tmp_path_factory.mktemp("small") / "shapes", 40, seed=1, progress=False, workers=1
    )


def test_the_option_is_off_by_default_and_refused_where_it_cannot_work() -> None:
    assert (TrainConfig().mixed_sample_fraction, TrainConfig().match_label_smoothing) == (0, 0)
    for bad in (
        {"mixed_sample_fraction": 0.25},  # the hinge objective takes no soft labels
        {"match_label_smoothing": 1e-4},
        {**PCMEPP, "mixed_sample_fraction": 1.5},
        {**PCMEPP, "match_label_smoothing": 0.5},
        {**MSDA, "counterfactual_weight": 0.1},
        {**MSDA, "label_weight": 0.1},
    ):
        with pytest.raises(ConfigError):
            TrainConfig(**bad)


def test_a_batch_at_fraction_zero_is_the_unmixed_one(small_shapes) -> None:
    model_config = ModelConfig(embed_dim=8)
    split, _, _ = load_splits(small_shapes, model_config)
    rows = next(iter(epoch_batches(split, 8, 0, 0, 0)))
    outliers = np.random.default_rng(0)
    off = prepare_batch(rows, split, TrainConfig(**PCMEPP), model_config, outliers)
    assert off.mixed is None and torch.equal(off.images, image_batch(split, rows[0], model_config))
    on = TrainConfig(**MSDA)
    mixed = prepare_batch(rows, split, on, model_config, outliers, np.random.default_rng(0))
    assert mixed.mixed is not None and len(mixed.mixed.rows) == 2  # a quarter of 8
    assert mix_problems(off.images, mixed.images, mixed.mixed) == []


def history(out: Path) -> list[dict]:
    return json.loads((out / "history.json").read_text())


def test_training_with_mixed_samples_is_seeded_and_off_by_default(
    small_shapes, tmp_path, monkeypatch
) -> None:
    model_config = ModelConfig(model_type="gcie", metric="csd", embed_dim=8)
    quick = {"epochs": 1, "batch_size": 16, "seed": 0}
    quiet = {"progress": False, "export": False, "log": lambda line: None}
    for name in ("msda", "again"):
        train(small_shapes, tmp_path / name, model_config, TrainConfig(**MSDA, **quick), **quiet)
    assert history(tmp_path / "msda")[0]["loss"] == history(tmp_path / "again")[0]["loss"]

    def refuse(*args, **kwargs):
        raise AssertionError("soft labels made with the option off")

    monkeypatch.setattr(train_module, "soft_match_targets", refuse)
    train(small_shapes, tmp_path / "off", model_config, TrainConfig(**PCMEPP, **quick), **quiet)
    assert history(tmp_path / "off")[0]["loss"] != history(tmp_path / "msda")[0]["loss"]
