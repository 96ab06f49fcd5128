"""A gallery item's image, read from the location its index version recorded, never from a path
a client gave: the client names an item id, the version's metadata names the file."""

import io
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.networks.preprocess import InvalidImageError, decode_image
from service.errors import ItemNotFoundError

log = logging.getLogger(__name__)

# Formats every browser shows, recognised by their first bytes (never by the file's name).
_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
)


@dataclass(frozen=True)
class ItemImage:
    """Bytes to send and their content type."""

    data: bytes
    media_type: str


def media_type_of(data: bytes) -> str | None:
    """Content type of a format browsers show, from the file's signature; None otherwise."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((media for magic, media in _SIGNATURES if data.startswith(magic)), None)


def read_item_image(
    record: dict[str, Any], max_bytes: int, max_pixels: int, image_root: str | Path = ""
) -> ItemImage:
    """The image of a gallery record ({"id", "uri", ...}) as a browser can show it.

    A relative uri is relative to `image_root`, the manifest's `image_root` (the image folder,
    dataset dir or COCO image root the version was built from); a version written before
    manifests had one recorded paths relative to the reindex's working directory, which is
    the root then. A relative uri must stay inside its root once `..` and every symlink are
    resolved: one that leaves it is not served. An absolute uri (older versions) is read as
    it is. Files of other formats (TIFF, ...) are converted to PNG.
    Raises ItemNotFoundError (404) when the record has no file, or the file is missing, not a
    regular file, outside its root, over `max_bytes`, or not an image; the server log says which.
    """
    item_id = record.get("id")
    uri = record.get("uri")
    if not isinstance(uri, str) or not uri or "://" in uri or "\0" in uri:
        raise ItemNotFoundError(f"item {item_id!r} has no image file this service can serve")
    path = _resolve(uri, image_root, item_id)
    data = _read_regular_file(path, max_bytes, item_id, None if Path(uri).is_absolute() else path)
    media_type = media_type_of(data)
    if media_type is not None:
        return ItemImage(data, media_type)
    try:
        image = decode_image(data, max_pixels=max_pixels)
    except InvalidImageError as error:
        log.warning("image file %s of item %r cannot be decoded: %s", uri, item_id, error)
        raise ItemNotFoundError(f"the image file of item {item_id!r} is not readable") from None
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return ItemImage(buffer.getvalue(), "image/png")


def _resolve(uri: str, image_root: str | Path, item_id: object) -> Path:
    """The file a uri names: an absolute one as it is; a relative one under its root with
    every `..` and symlink resolved, refused (404) when that leaves the root."""
    if Path(uri).is_absolute():
        return Path(uri)
    root = os.path.realpath(image_root or os.getcwd())
    path = os.path.realpath(os.path.join(root, uri))
    if os.path.commonpath([root, path]) != root:
        log.warning("image uri %r of item %r leaves its root %s; not served", uri, item_id, root)
        raise ItemNotFoundError(f"the image file of item {item_id!r} is outside the gallery")
    return Path(path)


def _read_regular_file(
    path: Path, max_bytes: int, item_id: object, resolved: Path | None = None
) -> bytes:
    """At most `max_bytes` of a regular file; a FIFO or device never blocks the reader.

    `resolved`: the symlink-free path the caller checked; the file is opened without following
    a final symlink and, where /proc tells, must still be that path once open (a symlink
    swapped in between the check and the open is refused)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (os.O_NOFOLLOW if resolved is not None else 0)
    try:
        fd = os.open(path, flags)
    except OSError as error:
        log.warning("image file %s of item %r cannot be opened: %s", path, item_id, error)
        raise ItemNotFoundError(f"the image file of item {item_id!r} is missing") from None
    if resolved is not None and not _opened_as(fd, resolved):
        os.close(fd)
        log.warning("image path %s of item %r changed while it was opened", path, item_id)
        raise ItemNotFoundError(f"the image file of item {item_id!r} is outside the gallery")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        log.warning("image path %s of item %r is not a regular file", path, item_id)
        raise ItemNotFoundError(f"the image of item {item_id!r} is not a regular file")
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ItemNotFoundError(
            f"the image file of item {item_id!r} is larger than this endpoint's limit of "
            f"{max_bytes} bytes (max_image_bytes)"
        )
    return data


def _opened_as(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is `path` (True where /proc/self/fd cannot tell)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == str(path)
    except OSError:
        return True
