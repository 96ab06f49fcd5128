"""Memory-bounded decoding of uploaded images.

The encoder reads image_size x image_size pixels, so an upload never needs to be held at full
resolution for long. Three bounds keep a burst of large images from taking the process down:

- the pixel limit (derived from the model's input size unless configured) is checked from the
  header, before a single pixel is decoded, so a small file that claims a huge canvas is cheap;
- JPEG is decoded at a reduced scale (Pillow's draft: 1/2, 1/4 or 1/8 in the decoder itself)
  and every image is shrunk by an integer factor (Image.reduce) right after decoding, so only
  one full-size copy exists and only for a moment;
- at most `max_concurrent` images decode at once, in a dedicated thread pool; the others wait
  in its queue holding only their compressed bytes. On Linux the pool's threads run at a lower
  CPU priority (`nice`, per thread), so a burst of large decodes delays other queries little.

When the last decode of a burst ends, glibc is asked to return its free memory to the system
(malloc_trim): decode threads allocate from malloc arenas of their own, which glibc keeps
mapped otherwise (measured: +211 MiB RSS left after a burst with 8 decode threads).
"""

import asyncio
import contextlib
import ctypes
import ctypes.util
import io
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from PIL import Image, UnidentifiedImageError

from models.networks.image_integrity import TruncatedImageError, check_pixel_data
from models.networks.preprocess import ImageTooLargeError, InvalidImageError

# Default pixel limit: an image side of up to PIXEL_LIMIT_SIDE_FACTOR x the model's input side,
# i.e. (32 * 64)^2 = 4.2 Mpx for a 64 x 64 model. JPEGs are limited after the draft reduction.
PIXEL_LIMIT_SIDE_FACTOR = 32
# Images are kept at no less than this multiple of the model's side after reduction, so the
# final (anti-aliased) resize in models.networks.preprocess still sees enough pixels.
KEEP_SIDE_FACTOR = 2


def default_concurrent_decodes() -> int:
    """A quarter of the CPUs this process may use, at least one."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (usable or 1) // 4)


def default_pixel_limit(image_size: int) -> int:
    """The pixel limit when none is configured: (PIXEL_LIMIT_SIDE_FACTOR * image_size)^2."""
    return (PIXEL_LIMIT_SIDE_FACTOR * image_size) ** 2


def decode_bounded(data: bytes, image_size: int, max_pixels: int) -> Image.Image:
    """Decode image bytes to an RGB image of at least KEEP_SIDE_FACTOR * image_size per side
    (smaller images stay as they are), never decoding more than `max_pixels` pixels.

    Raises InvalidImageError for non-images and broken files, ImageTooLargeError over the limit.
    """
    if not data:
        raise InvalidImageError("empty file: expected image bytes (PNG, JPEG, ...)")
    keep = KEEP_SIDE_FACTOR * image_size
    try:
        # Pillow's DecompressionBombWarning is silenced by models.networks.preprocess's import.
        with Image.open(io.BytesIO(data)) as image:
            image.draft("RGB", (keep, keep))  # JPEG: decode at 1/2..1/8 scale; others: no-op
            _check_pixels(image, max_pixels)
            check_pixel_data(data)  # a PNG of fewer rows than its header says
            image.load()
            return _shrink(image, keep).convert("RGB")
    except Image.DecompressionBombError as error:
        raise ImageTooLargeError(f"image exceeds the pixel limit: {error}") from error
    except UnidentifiedImageError as error:
        raise InvalidImageError("not a recognised image format") from error
    except InvalidImageError:
        raise
    except TruncatedImageError as error:
        raise InvalidImageError(str(error)) from error
    except (OSError, SyntaxError, ValueError, MemoryError) as error:
        message = f"image could not be decoded (truncated or corrupt): {error}"
        raise InvalidImageError(message) from error


def _check_pixels(image: Image.Image, max_pixels: int) -> None:
    width, height = image.size  # after the draft: what will actually be decoded
    if width * height > max_pixels:
        raise ImageTooLargeError(
            f"image is {width}x{height} = {width * height} pixels; the limit is {max_pixels}"
        )


def _shrink(image: Image.Image, keep: int) -> Image.Image:
    """Reduce by the largest integer factor that keeps both sides >= keep (box filter)."""
    factor = min(image.size) // keep
    if factor < 2:
        return image
    if image.mode not in ("L", "LA", "RGB", "RGBA", "I", "F"):
        image = image.convert("RGBA" if "A" in image.getbands() else "RGB")
    return image.reduce(factor)


def _lower_priority(nice: int) -> None:
    """Raise this thread's niceness by `nice` (Linux schedules threads as tasks)."""
    if nice > 0 and hasattr(os, "setpriority"):
        with contextlib.suppress(OSError):
            current = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), current + nice)


def _malloc_trim() -> None:
    """Return free heap memory to the system (glibc only; elsewhere a no-op)."""
    name = ctypes.util.find_library("c")
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name).malloc_trim(0)


class ImageDecoder:
    """Decodes uploads in a pool of `max_concurrent` threads (the bound on decodes in flight)."""

    def __init__(
        self, image_size: int, max_pixels: int, max_concurrent: int, nice: int = 0
    ) -> None:
        self.image_size = image_size
        self.max_pixels = max_pixels
        self._pool = ThreadPoolExecutor(
            max_workers=max_concurrent,
            thread_name_prefix="decode",
            initializer=_lower_priority,
            initargs=(nice,),
        )
        self._lock = threading.Lock()
        self._in_flight = 0

    async def decode(self, data: bytes) -> Image.Image:
        """Decode `data` in the pool; the event loop stays free meanwhile."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._decode_counted, data)

    def _decode_counted(self, data: bytes) -> Image.Image:
        with self._lock:
            self._in_flight += 1
        try:
            return decode_bounded(data, self.image_size, self.max_pixels)
        finally:
            with self._lock:
                self._in_flight -= 1
                last = self._in_flight == 0
            if last:
                _malloc_trim()

    def close(self) -> None:
        """Stop the pool once the queued decodes are done."""
        self._pool.shutdown(wait=True)
