"""Synthetic outliers: seeded uint8 textures whose power falls with frequency like a photograph's,
colour or grey, and nothing like a flat shapes background."""

import numpy as np

from models.datasets.outliers import synthetic_outliers


def radial_power(image: np.ndarray) -> tuple[float, float]:
    """Mean power of the low (|f| < 0.1) and high (|f| > 0.3) frequencies of a grey image."""
    power = np.abs(np.fft.fft2(image - image.mean())) ** 2
    freq = np.hypot(*np.meshgrid(np.fft.fftfreq(image.shape[0]), np.fft.fftfreq(image.shape[1])))
    return float(power[(freq > 0) & (freq < 0.1)].mean()), float(power[freq > 0.3].mean())


def test_outliers_are_seeded_uint8_images_of_the_asked_size() -> None:
    first = synthetic_outliers(6, 32, np.random.default_rng(3))
    again = synthetic_outliers(6, 32, np.random.default_rng(3))
    other = synthetic_outliers(6, 32, np.random.default_rng(4))
    assert first.shape == (6, 3, 32, 32) and first.dtype == np.uint8
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_power_falls_with_frequency_and_every_image_has_texture() -> None:
    images = synthetic_outliers(20, 64, np.random.default_rng(0)).astype(np.float64)
    for image in images:
        low, high = radial_power(image.mean(axis=0))
        assert low > 20 * high  # white noise would give about 1
        assert image.std() > 10  # not a flat background


def test_some_are_grey_and_some_coloured() -> None:
    images = synthetic_outliers(40, 32, np.random.default_rng(1)).astype(np.int16)
    grey = [np.abs(im[0] - im[1]).max() <= 1 and np.abs(im[1] - im[2]).max() <= 1 for im in images]
    assert 0 < sum(grey) < len(grey)
