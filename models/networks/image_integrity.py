"""Whether an image file holds all the pixel data its header declares.

Pillow refuses most truncated files (ImageFile.LOAD_TRUNCATED_IMAGES is False: a JPEG, BMP or
PNG whose bytes run out raises "image file is truncated"). One case gets through: a PNG whose
IDAT chunks hold a complete zlib stream that inflates to fewer rows than the IHDR declares
(a header of 2000x2000 over one row of data). Pillow's zip decoder takes the stream's end as
the image's end and leaves the rest of the canvas black, without an error. So for a PNG the
IDAT data is inflated here, counting bytes without keeping them, and compared with the
size the header implies: height x (1 filter byte + the row's bytes), or the sum over the
seven Adam7 passes of an interlaced image. Chunk CRCs of IHDR and IDAT are checked on the way.

The inflate costs about as much as Pillow's own (tens of ms for a 4 Mpx image), at most
`expected` bytes of output are produced, and none is kept.
"""

from __future__ import annotations

import struct
import zlib

from PIL import ImageFile

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel
# Adam7: (first column, first row, column step, row step) of each pass.
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
          (0, 1, 1, 2))  # fmt: skip
_INFLATE_STEP = 1 << 20


class TruncatedImageError(ValueError):
    """The file's pixel data is shorter than its header declares, or its chunks are corrupt."""


def check_pixel_data(data: bytes) -> None:
    """Raise TruncatedImageError when `data` is a PNG whose pixel data does not fill the size
    its header declares (or whose IHDR/IDAT chunks are cut or fail their CRC); other formats
    are left to Pillow, which refuses them truncated as long as LOAD_TRUNCATED_IMAGES is off
    (a library that turned it on is refused too: no decode may accept partial images)."""
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise TruncatedImageError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is on in this process; truncated images "
            "would be accepted, so none is decoded"
        )
    if data.startswith(PNG_SIGNATURE):
        _check_png(memoryview(data))


def _check_png(data: memoryview) -> None:
    width, height, expected, row_bytes, interlaced = 0, 0, 0, 0, False
    inflater = zlib.decompressobj()
    produced, seen_idat, position = 0, False, len(PNG_SIGNATURE)
    while position + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        body_end = position + 8 + length
        if body_end + 4 > len(data):
            if kind in (b"IHDR", b"IDAT"):
                raise TruncatedImageError(f"image is truncated: its {kind.decode()} chunk is cut")
            break
        body = data[position + 8 : body_end]
        if kind in (b"IHDR", b"IDAT"):
            (crc,) = struct.unpack(">I", data[body_end : body_end + 4])
            if zlib.crc32(body, zlib.crc32(kind)) != crc:
                name = kind.decode()
                raise TruncatedImageError(f"image is corrupt: its {name} chunk's CRC fails")
        if kind == b"IHDR":
            width, height, expected, row_bytes, interlaced = _declared(body)
        elif kind == b"IDAT":
            seen_idat = True
            produced = _inflate(inflater, body, produced, expected)
        elif seen_idat:
            break  # the IDAT chunks are consecutive: the image data is complete
        position = body_end + 4
    if expected and produced < expected:
        if interlaced:
            held = f"{produced} of the {expected} bytes of an interlaced image"
        else:
            held = f"{produced // row_bytes} of {height} rows"
        raise TruncatedImageError(
            f"image is truncated: its header says {width}x{height}, but its pixel data holds "
            f"only {held}"
        )


def _declared(ihdr: memoryview) -> tuple[int, int, int, int, bool]:
    """(width, height, bytes of filtered pixel data, bytes of a full row + filter byte,
    interlaced) from the IHDR chunk."""
    if len(ihdr) != 13:
        raise TruncatedImageError("image is corrupt: its IHDR chunk is not 13 bytes")
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", ihdr)
    bits = depth * _CHANNELS.get(colour, 4)

    def filtered(columns: int, rows: int) -> int:
        return 0 if columns == 0 or rows == 0 else rows * (1 + (columns * bits + 7) // 8)

    full_row = 1 + (width * bits + 7) // 8
    if interlace != 1:
        return width, height, filtered(width, height), full_row, False
    total = sum(
        filtered(_count(width, x0, dx), _count(height, y0, dy)) for x0, y0, dx, dy in _ADAM7
    )
    return width, height, total, full_row, True


def _count(size: int, start: int, step: int) -> int:
    """How many of 0..size-1 an Adam7 pass visits from `start` every `step`."""
    return 0 if size <= start else (size - start + step - 1) // step


def _inflate(inflater: zlib._Decompress, chunk: memoryview, produced: int, expected: int) -> int:
    """Feed one IDAT chunk; the bytes produced so far, never inflating past `expected`."""
    pending: bytes | memoryview = chunk
    try:
        while pending and produced < expected and not inflater.eof:
            out = inflater.decompress(pending, min(_INFLATE_STEP, expected - produced))
            produced += len(out)
            pending = inflater.unconsumed_tail
    except zlib.error as error:
        message = f"image is corrupt: its pixel data does not inflate ({error})"
        raise TruncatedImageError(message) from error
    return produced
