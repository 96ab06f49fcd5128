"""Memory-bounded decoding: header check before decoding, draft/reduce, bounded concurrency."""

import asyncio
import io
import subprocess
import sys
import threading
import time

import pytest
from PIL import Image

from models.networks.preprocess import ImageTooLargeError, InvalidImageError
from service import image_decode
from service.image_decode import ImageDecoder, decode_bounded, default_pixel_limit

LIMIT = default_pixel_limit(64)


def encoded(size: tuple[int, int], kind: str = "PNG", mode: str = "RGBA") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size).save(buffer, kind)
    return buffer.getvalue()


def test_default_limit_follows_the_model_input_size() -> None:
    assert default_pixel_limit(64) == 2048 * 2048
    assert default_pixel_limit(224) == (32 * 224) ** 2


def test_png_over_the_limit_is_refused_from_its_header() -> None:
    data = encoded((6000, 6000), mode="L")  # the 105 KB all-zero bomb, in spirit
    with pytest.raises(ImageTooLargeError, match="6000x6000 = 36000000 pixels; the limit is"):
        decode_bounded(data, 64, LIMIT)


def test_png_at_the_limit_is_decoded_and_reduced() -> None:
    image = decode_bounded(encoded((2048, 2048)), 64, LIMIT)
    assert image.mode == "RGB" and image.size == (128, 128)


def test_large_jpeg_is_decoded_at_a_reduced_scale() -> None:
    data = encoded((6000, 4000), "JPEG", "RGB")  # 24 Mpx: over the limit at full scale
    image = decode_bounded(data, 64, LIMIT)
    assert image.mode == "RGB"
    assert min(image.size) >= 128 and max(image.size) <= 6000 // 8


def test_small_images_keep_their_size_and_odd_modes_become_rgb() -> None:
    for mode in ("1", "P", "I;16", "LA", "CMYK"):
        kind = "JPEG" if mode == "CMYK" else "PNG"
        image = decode_bounded(encoded((300, 200), kind, mode), 64, LIMIT)
        assert image.mode == "RGB" and image.size == (300, 200)


@pytest.mark.parametrize("data", [b"", b"not an image", encoded((64, 64))[:40]])
def test_broken_input_is_an_invalid_image(data: bytes) -> None:
    with pytest.raises(InvalidImageError):
        decode_bounded(data, 64, LIMIT)


def test_at_most_max_concurrent_decodes_run_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    running, peak, lock = [0], [0], threading.Lock()

    def slow_decode(data: bytes, image_size: int, max_pixels: int) -> Image.Image:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return Image.new("RGB", (1, 1))

    monkeypatch.setattr(image_decode, "decode_bounded", slow_decode)
    decoder = ImageDecoder(64, LIMIT, max_concurrent=2)

    async def burst() -> list[Image.Image]:
        return await asyncio.gather(*(decoder.decode(b"x") for _ in range(8)))

    try:
        assert len(asyncio.run(burst())) == 8
    finally:
        decoder.close()
    assert peak[0] == 2


BOMB_CHECK = """
import io, sys, warnings
from PIL import Image
from models.networks.preprocess import decode_image
from service.image_decode import decode_bounded

shown = []
warnings.showwarning = lambda message, *rest, **kw: shown.append(str(message))
Image.MAX_IMAGE_PIXELS = 1000  # 40 x 40 = 1600 px: Pillow warns; neither decoder's limit refuses
filters, touched = warnings.filters, []
real_open = Image.open

def watched_open(*args, **kwargs):
    touched.append(warnings.filters is not filters)
    return real_open(*args, **kwargs)

Image.open = watched_open
buffer = io.BytesIO()
Image.new("RGB", (40, 40), "red").save(buffer, "PNG")
for decode in (decode_image, lambda data: decode_bounded(data, 8, 10**6)):
    assert decode(buffer.getvalue()).mode == "RGB"
print(len(touched), sum(touched), len(shown), shown)
"""


def test_decoding_past_pillows_bomb_warning_neither_warns_nor_swaps_the_warning_filters() -> None:
    """Decodes run in threads, and warnings.catch_warnings swaps the process-wide filter list,
    which is not thread-safe; so neither decoder may touch the filters while it decodes, nor
    warn (Pillow's DecompressionBombWarning is silenced once, when preprocess is imported).
    In a process of its own: pytest restores the filters after collecting, which drops the
    import's filter from this one."""
    done = subprocess.run(
        [sys.executable, "-c", BOMB_CHECK], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(maxsplit=3)[:3] == ["2", "0", "0"], done.stdout
