"""Input preprocessing shared by training, the indexer and the service: image decode, resize,
normalise; caption tokenisation (models.networks.tokenizer)."""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from models.networks.image_integrity import TruncatedImageError, check_pixel_data
from models.networks.model_config import ModelConfig
from models.networks.tokenizer import Tokenizer

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "ImageTooLargeError",
    "InvalidImageError",
    "Tokenizer",
    "decode_image",
    "images_to_array",
    "load_image",
]

DEFAULT_MAX_PIXELS = 50_000_000

# Pillow warns past Image.MAX_IMAGE_PIXELS (about 89 Mpx) and raises past twice that. Every
# decoder of the project (decode_image here, service.image_decode) refuses an image over its
# own, lower, limit from the header, so the warning adds nothing; it is silenced once, for the
# process, when this module is imported. Silencing it around each decode with
# warnings.catch_warnings would swap the process-wide filter list from the decode threads,
# which is not thread-safe: a filter could be lost or left behind.
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


class InvalidImageError(ValueError):
    """The bytes are not a decodable image (wrong format, truncated, corrupt)."""


class ImageTooLargeError(InvalidImageError):
    """The image has more pixels than allowed (this includes decompression bombs)."""


def decode_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Decode image bytes to an RGB PIL image.

    The pixel count is checked from the header before any pixel is decoded, so a small file
    that claims a huge canvas (a decompression bomb) costs nothing.
    Raises InvalidImageError for non-images and broken files, ImageTooLargeError over the limit.
    """
    if not data:
        raise InvalidImageError("empty file: expected image bytes (PNG, JPEG, ...)")
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > max_pixels:
            raise ImageTooLargeError(
                f"image is {width}x{height} = {width * height} pixels; the limit is {max_pixels}"
            )
        check_pixel_data(data)  # a PNG of fewer rows than its header says
        image.load()
    except Image.DecompressionBombError as e:
        raise ImageTooLargeError(f"image exceeds the pixel limit: {e}") from e
    except UnidentifiedImageError as e:
        raise InvalidImageError("not a recognised image format") from e
    except TruncatedImageError as e:
        raise InvalidImageError(str(e)) from e
    except (OSError, SyntaxError, ValueError) as e:
        if isinstance(e, InvalidImageError):
            raise
        raise InvalidImageError(f"image could not be decoded (truncated or corrupt): {e}") from e
    return image.convert("RGB")


def load_image(path: Path | str, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Read and decode an image file; errors name the file."""
    path = Path(path)
    try:
        return decode_image(path.read_bytes(), max_pixels=max_pixels)
    except FileNotFoundError as e:
        raise InvalidImageError(f"{path}: file not found") from e
    except InvalidImageError as e:
        raise type(e)(f"{path}: {e}") from e


def resize_to_uint8(image: Image.Image, size: int) -> np.ndarray:
    """Resize to size x size (bilinear, anti-aliased) -> uint8 (3, size, size)."""
    if image.mode != "RGB":
        image = image.convert("RGB")
    if image.size != (size, size):
        image = image.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(image, dtype=np.uint8).transpose(2, 0, 1).copy()  # (3, H, W)


def backbone_pixels(images: Sequence[Image.Image], size: int, dtype: type = np.uint8) -> np.ndarray:
    """A pretrained backbone's input for a batch of images: (N, 3, size, size) 0..255 values in
    `dtype` (the backbone's graph does its own scaling)."""
    if not images:
        return np.zeros((0, 3, size, size), dtype=dtype)
    return np.stack([resize_to_uint8(image, size) for image in images]).astype(dtype, copy=False)


def normalize_uint8(pixels: np.ndarray, config: ModelConfig) -> np.ndarray:
    """uint8 (N, 3, H, W) -> float32 (N, 3, H, W) scaled to [0, 1] then standardised."""
    mean = np.asarray(config.image_mean, dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(config.image_std, dtype=np.float32).reshape(1, 3, 1, 1)
    return (pixels.astype(np.float32) / 255.0 - mean) / std


def images_to_array(images: Sequence[Image.Image], config: ModelConfig) -> np.ndarray:
    """Model input for a batch of images: float32 (N, 3, image_size, image_size)."""
    size = config.image_size
    if not images:
        return np.zeros((0, 3, size, size), dtype=np.float32)
    pixels = np.stack([resize_to_uint8(image, size) for image in images])  # (N, 3, H, W)
    return normalize_uint8(pixels, config)
