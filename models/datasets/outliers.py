"""Synthetic outliers for outlier exposure: textured images that are not scenes of shapes.

Natural images have power spectra that fall as 1/f^alpha (alpha about 2 for the amplitude
squared) and strongly correlated colour channels, often none at all (greyscale). These images
are random fields with that spectrum, mixed into colour by a random matrix, sometimes grey.
They are drawn from those two facts alone, never fitted to the photographs the dataset-shift
test uses, so a model trained to find them uncertain is judged on photographs it never saw.
"""

from __future__ import annotations

import numpy as np

ALPHA_RANGE = (0.8, 1.6)  # amplitude exponent: power falls as 1/f^(2 alpha)
GREY_PROBABILITY = 0.3


def synthetic_outliers(count: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 (count, 3, size, size) random 1/f textures, each with its own colour mix."""
    freq = np.sqrt(np.fft.fftfreq(size)[:, None] ** 2 + np.fft.rfftfreq(size)[None, :] ** 2)
    freq[0, 0] = 1.0 / size  # keeps the mean finite
    out = np.empty((count, 3, size, size), dtype=np.uint8)
    for n in range(count):
        alpha = rng.uniform(*ALPHA_RANGE)
        spectrum = freq ** (-alpha) * np.exp(2j * np.pi * rng.random((3, *freq.shape)))
        fields = np.fft.irfft2(spectrum, s=(size, size))  # (3, size, size)
        fields = (fields - fields.mean(axis=(1, 2), keepdims=True)) / (
            fields.std(axis=(1, 2), keepdims=True) + 1e-8
        )
        grey = rng.random() < GREY_PROBABILITY
        mix = np.full((3, 3), 1.0) if grey else rng.normal(size=(3, 3))
        pixels = np.einsum("ck,khw->chw", mix, fields) / np.sqrt(3.0)
        contrast = rng.uniform(25.0, 70.0)
        brightness = rng.uniform(60.0, 190.0, size=(1 if grey else 3, 1, 1))
        out[n] = np.clip(brightness + contrast * pixels, 0, 255).astype(np.uint8)
    return out
