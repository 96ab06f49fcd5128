"""Real photographs for the dataset-shift test: scikit-image's bundled photographs, each also as
a few square crops, written as 64x64-ready PNGs. Nothing is downloaded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

# Photographs only (no drawings, logos, text or microscope slides), all shipped in the wheel.
PHOTOGRAPHS: tuple[str, ...] = (
    "astronaut",
    "camera",
    "cat",
    "coffee",
    "coins",
    "grass",
    "gravel",
    "hubble_deep_field",
    "moon",
    "rocket",
    "brick",
    "retina",
)
CROPS = ("full", "left", "right", "centre")
SIDE = 256  # written size; the encoder resizes to its own input size


def _photos() -> Iterator[tuple[str, Image.Image]]:
    from skimage import data

    for name in PHOTOGRAPHS:
        array = np.asarray(getattr(data, name)())
        if array.ndim == 2:
            array = np.stack([array] * 3, axis=-1)
        yield name, Image.fromarray(array[..., :3].astype(np.uint8))


def _crops(image: Image.Image) -> Iterator[tuple[str, Image.Image]]:
    """The whole photo and three square crops of its shorter side."""
    width, height = image.size
    side = min(width, height)
    boxes = {
        "full": (0, 0, width, height),
        "left": (0, 0, side, side),
        "right": (width - side, height - side, width, height),
        "centre": ((width - side) // 2, (height - side) // 2,
                   (width + side) // 2, (height + side) // 2),
    }  # fmt: skip
    for name in CROPS:
        yield name, image.crop(boxes[name]).resize((SIDE, SIDE), Image.Resampling.BILINEAR)


def write_photos(out: Path | str) -> list[Path]:
    """Write every photograph and its crops as out/<photo>-<crop>.png; returns the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for photo, image in _photos():
        for crop, view in _crops(image):
            path = out / f"{photo}-{crop}.png"
            view.save(path, format="PNG")
            written.append(path)
    return written
