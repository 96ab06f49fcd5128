"""Gallery readers: a dataset dir, a captions JSONL, an image folder or a COCO Karpathy JSON.

Every reader yields lightweight GalleryItems in a fixed order (images are only opened later,
by the embedder, a batch at a time). A record that cannot even be parsed is yielded with its
`problem` set, so the bad-data report can count it and chunk boundaries stay deterministic.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.datasets.records import DATASET_FILE, load_dataset

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")


class SourceError(ValueError):
    """The gallery source cannot be read as asked (wrong kind for the modality, missing...)."""


@dataclass(frozen=True)
class GalleryItem:
    """One gallery item before embedding: a caption's text or an image's file path.

    `uri` is what the version records for an image: its path relative to the source's image
    root (GallerySource.image_root), so no absolute server path reaches an answer."""

    id: str
    text: str | None = None
    path: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None  # set when the source record itself is malformed
    uri: str | None = None


@dataclass(frozen=True)
class GallerySource:
    """A readable gallery: what it is, how many items (when known) and how to stream them."""

    kind: str  # "dataset" | "captions_jsonl" | "image_folder" | "coco_karpathy"
    path: Path
    modality: str
    count: int | None
    fingerprint: str  # changes when the source files change (keys the resumable work dir)
    _items: Any = field(repr=False, compare=False)
    # The folder an image item's `uri` is relative to (the manifest's image_root): the image
    # folder, the dataset dir, or a COCO file's --image-root. None for text galleries.
    image_root: Path | None = None

    def items(self) -> Iterator[GalleryItem]:
        """The items, in the same order on every call."""
        return iter(self._items())


def open_source(
    path: Path, modality: str, split: str | None = None, image_root: Path | None = None
) -> GallerySource:
    """Recognise the kind of gallery at `path` and return a reader for `modality`.

    Args:
        path: a dataset dir (with dataset.json), a captions .jsonl file, a folder of images,
            or a COCO Karpathy .json file.
        modality: "image" or "text": which side of the gallery to read.
        split: only this split ("train" | "val" | "test") of a dataset dir or COCO file.
        image_root: where a COCO file's images live (default: the JSON file's folder).
    """
    path = Path(path)
    if modality not in ("image", "text"):
        raise SourceError(f"unknown modality {modality!r}; choose image or text")
    if not path.exists():
        raise SourceError(f"gallery source {path} does not exist")
    if path.is_dir() and (path / DATASET_FILE).is_file():
        return _dataset_source(path, modality, split)
    if path.is_dir():
        _require(modality == "image", f"{path} is a folder of images: use --modality image")
        return _image_folder_source(path)
    if path.suffix == ".jsonl":
        _require(modality == "text", f"{path} is a captions JSONL file: use --modality text")
        return _captions_jsonl_source(path)
    if path.suffix == ".json":
        return _coco_source(path, modality, split, image_root or path.parent)
    raise SourceError(
        f"cannot read {path}: expected a dataset dir (with {DATASET_FILE}), a folder of images, "
        "a captions .jsonl file or a COCO Karpathy .json file"
    )


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise SourceError(message)


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:16]


def relative_uri(path: Path, root: Path) -> str:
    """`path` relative to `root` (lexically, POSIX separators): the uri a version records. A
    file outside the root keeps its leading `..`, which the service refuses to serve."""
    return Path(os.path.relpath(path, root)).as_posix()


def _file_stamp(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def _dataset_source(path: Path, modality: str, split: str | None) -> GallerySource:
    dataset = load_dataset(path, split)
    stamps = [_file_stamp(p) for p in sorted(path.glob("*.json*"))]
    if modality == "image":
        images = dataset.images
        count = len(images)

        def items() -> Iterator[GalleryItem]:
            for im in images:
                extra = {"split": im.split, "labels": list(im.labels)}
                yield GalleryItem(im.id, path=im.path, extra=extra, uri=relative_uri(im.path, path))

    else:
        captions = dataset.captions
        count = len(captions)

        def items() -> Iterator[GalleryItem]:
            for c in captions:
                extra = {"split": c.split, "image_id": c.image_id}
                yield GalleryItem(c.id, text=c.text, extra=extra)

    fingerprint = _fingerprint("dataset", modality, split, *stamps)
    root = path if modality == "image" else None
    return GallerySource("dataset", path, modality, count, fingerprint, items, root)


def _image_folder_source(root: Path) -> GallerySource:
    files = sorted(
        p
        for p in root.rglob("*")
        if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file() and not p.name.startswith(".")
    )
    listing = hashlib.sha256()
    for p in files:
        stat = p.stat()
        listing.update(f"{p.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())

    def items() -> Iterator[GalleryItem]:
        for p in files:
            name = p.relative_to(root).as_posix()
            yield GalleryItem(name, path=p, uri=name)

    fingerprint = _fingerprint("folder", root.resolve(), listing.hexdigest())
    return GallerySource("image_folder", root, "image", len(files), fingerprint, items, root)


def _captions_jsonl_source(path: Path) -> GallerySource:
    """Lines {"id": str, "text": str, ...}; other fields are kept as the item's extra."""

    def items() -> Iterator[GalleryItem]:
        with path.open(encoding="utf-8", errors="replace") as lines:
            for number, line in enumerate(lines, start=1):
                if line.strip():
                    yield _parse_caption_line(line, number)

    count = _count_nonblank_lines(path)
    fingerprint = _fingerprint("captions", *_file_stamp(path))
    return GallerySource("captions_jsonl", path, "text", count, fingerprint, items)


def _parse_caption_line(line: str, number: int) -> GalleryItem:
    where = f"line {number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return GalleryItem(where, problem=f"malformed JSON ({e.msg})")
    if not isinstance(record, dict):
        return GalleryItem(where, problem="expected a JSON object")
    item_id, text = record.pop("id", None), record.pop("text", None)
    if not isinstance(item_id, str | int) or isinstance(item_id, bool):
        return GalleryItem(where, problem="missing or non-string 'id'")
    if not isinstance(text, str):
        return GalleryItem(str(item_id), problem="missing or non-string 'text'")
    return GalleryItem(str(item_id), text=text, extra=record)


def _count_nonblank_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


def _coco_source(path: Path, modality: str, split: str | None, image_root: Path) -> GallerySource:
    from models.datasets.coco import load_coco_karpathy

    dataset = load_coco_karpathy(path, image_root, split)
    if modality == "image":
        images = dataset.images

        def items() -> Iterator[GalleryItem]:
            for im in images:
                yield GalleryItem(
                    im.id,
                    path=im.path,
                    extra={"split": im.split},
                    uri=relative_uri(im.path, image_root),
                )

        count = len(images)
    else:
        captions = dataset.captions

        def items() -> Iterator[GalleryItem]:
            for c in captions:
                yield GalleryItem(
                    c.id, text=c.text, extra={"split": c.split, "image_id": c.image_id}
                )

        count = len(captions)
    fingerprint = _fingerprint("coco", modality, split, os.fspath(image_root), *_file_stamp(path))
    root = image_root if modality == "image" else None
    return GallerySource("coco_karpathy", path, modality, count, fingerprint, items, root)
