"""A PNG must hold the pixel data its header declares (issue 41.7): a complete zlib stream of
one row under a 2000x2000 header decoded without an error in Pillow."""

import io
import struct
import zlib

import pytest
from PIL import Image, ImageFile

from models.networks.image_integrity import TruncatedImageError, check_pixel_data
from models.networks.preprocess import InvalidImageError, decode_image

ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
         (0, 1, 1, 2))  # fmt: skip


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, pixels: bytes, interlace: int = 0, split: int = 0) -> bytes:
    """8-bit RGB PNG with `pixels` (filtered rows) as its IDAT data, in chunks of `split`."""
    stream = zlib.compress(pixels)
    pieces = [stream[i : i + split] for i in range(0, len(stream), split)] if split else [stream]
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, interlace)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + b"".join(chunk(b"IDAT", p) for p in pieces) + chunk(b"IEND", b""))  # fmt: skip


def rows(width: int, count: int) -> bytes:
    return (b"\x00" + b"\x40" * (3 * width)) * count


def interlaced_pixels(width: int, height: int) -> bytes:
    data = b""
    for x0, y0, dx, dy in ADAM7:
        columns = max(0, (width - x0 + dx - 1) // dx)
        lines = max(0, (height - y0 + dy - 1) // dy)
        if columns and lines:
            data += rows(columns, lines)
    return data


def test_one_row_under_a_2000x2000_header_is_truncated() -> None:
    data = png(2000, 2000, rows(2000, 1))
    message = "its header says 2000x2000, but its pixel data holds only 1 of 2000 rows"
    with pytest.raises(TruncatedImageError, match=message):
        check_pixel_data(data)
    with pytest.raises(InvalidImageError, match="image is truncated"):
        decode_image(data)


def test_complete_pngs_pass_in_every_layout() -> None:
    for data in (png(61, 17, rows(61, 17)), png(61, 17, rows(61, 17), split=7),
                 png(13, 11, interlaced_pixels(13, 11), interlace=1),
                 png(1, 1, interlaced_pixels(1, 1), interlace=1)):  # fmt: skip
        check_pixel_data(data)
        decode_image(data)  # Pillow agrees the data is whole
    for mode in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16"):
        buffer = io.BytesIO()
        Image.new(mode, (37, 23)).save(buffer, "PNG")
        check_pixel_data(buffer.getvalue())


def test_short_interlaced_cut_and_corrupt_pngs_are_refused() -> None:
    short = png(13, 11, interlaced_pixels(13, 11)[:-10], interlace=1)
    with pytest.raises(TruncatedImageError, match="bytes of an interlaced image"):
        check_pixel_data(short)
    whole = png(61, 17, rows(61, 17))
    with pytest.raises(TruncatedImageError, match="IDAT chunk is cut"):
        check_pixel_data(whole[:60])
    flipped = bytearray(whole)
    flipped[45] ^= 0xFF  # inside the IDAT data
    with pytest.raises(TruncatedImageError, match="CRC fails"):
        check_pixel_data(bytes(flipped))


def test_truncated_images_are_never_loaded_leniently(monkeypatch) -> None:
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(TruncatedImageError, match="LOAD_TRUNCATED_IMAGES is on"):
        check_pixel_data(png(61, 17, rows(61, 17)))
