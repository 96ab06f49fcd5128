"""benchmarks/augmented_views_val.py: the views are the drawing, its mirror and crops of it,
and each epoch trains on one view per drawing while other splits pass through unchanged."""

import numpy as np
import pytest
import torch
from PIL import Image

from benchmarks import augmented_views_val as views_module
from models.training import train as train_module
from models.training.training_data import SplitTensors


def _noise_image(width: int = 40, height: int = 30) -> tuple[Image.Image, np.ndarray]:
    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels), pixels


def _offset_in(crop: np.ndarray, whole: np.ndarray) -> tuple[int, int] | None:
    h, w = crop.shape[:2]
    for top in range(whole.shape[0] - h + 1):
        for left in range(whole.shape[1] - w + 1):
            if np.array_equal(whole[top : top + h, left : left + w], crop):
                return top, left
    return None


def test_view_zero_is_the_drawing_and_view_one_its_mirror() -> None:
    image, pixels = _noise_image()
    rng = np.random.default_rng(1)
    assert np.array_equal(np.asarray(views_module.augmented(image, rng, 0)), pixels)
    assert np.array_equal(np.asarray(views_module.augmented(image, rng, 1)), pixels[:, ::-1])


@pytest.mark.parametrize("seed", range(6))
def test_a_crop_view_is_a_piece_of_the_drawing_of_the_allowed_area(seed: int) -> None:
    image, pixels = _noise_image()
    crop = np.asarray(views_module.augmented(image, np.random.default_rng(seed), 2))
    found = _offset_in(crop, pixels) or _offset_in(crop[:, ::-1], pixels)
    assert found is not None
    low, high = views_module.CROP_SCALE
    share = crop.shape[0] * crop.shape[1] / pixels.shape[0] / pixels.shape[1]
    assert low * 0.8 <= share <= high


def _split(images: int, dim: int = 3) -> SplitTensors:
    empty = torch.zeros(0, dtype=torch.int64)
    return SplitTensors(torch.zeros(images, dim), empty, empty, empty)


def test_each_epoch_trains_on_one_view_of_each_drawing(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[torch.Tensor] = []
    monkeypatch.setattr(
        train_module, "train_epoch", lambda m, o, split, c, epoch: seen.append(split.pixels)
    )
    views = torch.arange(3 * 50 * 2, dtype=torch.float32).reshape(3, 50, 2)  # all distinct
    wrapped = views_module._with_views(views, seed=0)
    for epoch in range(4):
        wrapped(None, None, _split(50, 2), None, epoch)
    picks = []
    for pixels in seen:
        assert pixels.shape == (50, 2)
        matches = (pixels[None] == views).all(dim=2)  # (views, rows): which view each row is
        assert matches.sum(dim=0).tolist() == [1] * 50
        picks.append(matches.int().argmax(dim=0))
    assert len({tuple(p.tolist()) for p in picks}) == 4  # a new draw each epoch
    assert set(torch.cat(picks).tolist()) == {0, 1, 2}


def test_a_split_of_another_size_passes_through(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[SplitTensors] = []
    monkeypatch.setattr(train_module, "train_epoch", lambda m, o, split, c, e: seen.append(split))
    val = _split(7, 2)
    views_module._with_views(torch.ones(3, 50, 2), seed=0)(None, None, val, None, 0)
    assert seen == [val]
