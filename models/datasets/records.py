"""Paired image-caption records, the on-disk dataset format loader and plausible-match judgement."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_VERSION = 1
SPLITS: tuple[str, ...] = ("train", "val", "test")
DATASET_FILE = "dataset.json"
IMAGES_FILE = "images.jsonl"
CAPTIONS_FILE = "captions.jsonl"
MAX_HALL_DESCRIPTORS = 10


class DatasetError(ValueError):
    """A dataset directory or file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class ObjectRecord:
    """One object drawn in an image: what a caption may name (shape, colour, size)."""

    shape: str
    color: str
    size: str | None = None
    bbox: tuple[int, int, int, int] | None = None  # x0, y0, x1, y1 in pixels, inclusive


@dataclass(frozen=True)
class Descriptor:
    """What a caption names: `count` distinct objects with this shape/colour/size (None: any)."""

    shape: str | None = None
    color: str | None = None
    size: str | None = None
    count: int = 1

    def matches(self, obj: ObjectRecord) -> bool:
        """True when the object has every attribute this descriptor fixes."""
        return (
            (self.shape is None or self.shape == obj.shape)
            and (self.color is None or self.color == obj.color)
            and (self.size is None or self.size == obj.size)
        )

    def to_json(self) -> dict[str, Any]:
        return {"shape": self.shape, "color": self.color, "size": self.size, "count": self.count}


@dataclass(frozen=True)
class ImageRecord:
    """One image: id, absolute file path, split, multi-hot labels and (optional) object list."""

    id: str
    path: Path
    split: str
    labels: tuple[str, ...]
    objects: tuple[ObjectRecord, ...] = ()


@dataclass(frozen=True)
class CaptionRecord:
    """One caption of one image; `named` lists the object descriptors it names, `labels` the
    labels it names (either may be empty)."""

    id: str
    image_id: str
    text: str
    split: str
    named: tuple[Descriptor, ...] = ()
    labels: tuple[str, ...] = ()


def attributes_named(caption: CaptionRecord) -> int:
    """How much a caption says: the shape, colour and size words of the objects it names
    ("four things" 0, "a triangle" 1, "a small blue square and a red triangle" 5)."""
    return sum(
        (d.shape is not None) + (d.color is not None) + (d.size is not None) for d in caption.named
    )


@dataclass(frozen=True)
class PairedDataset:
    """Images and their captions, as read from one dataset directory."""

    root: Path
    label_names: tuple[str, ...]
    images: list[ImageRecord]
    captions: list[CaptionRecord]
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def split(self, name: str) -> PairedDataset:
        """The images and captions of one split ("train", "val" or "test")."""
        _check_split(name)
        return PairedDataset(
            root=self.root,
            label_names=self.label_names,
            images=[im for im in self.images if im.split == name],
            captions=[c for c in self.captions if c.split == name],
            meta=self.meta,
        )

    @cached_property
    def _captions_by_image(self) -> dict[str, list[CaptionRecord]]:
        by_image: dict[str, list[CaptionRecord]] = {im.id: [] for im in self.images}
        for caption in self.captions:
            by_image.setdefault(caption.image_id, []).append(caption)
        return by_image

    @cached_property
    def _images_by_id(self) -> dict[str, ImageRecord]:
        return {im.id: im for im in self.images}

    def captions_of(self, image_id: str) -> list[CaptionRecord]:
        """The captions of one image, in file order (empty for an image without captions)."""
        return list(self._captions_by_image.get(image_id, []))

    def image(self, image_id: str) -> ImageRecord:
        """The image with this id; KeyError when there is none."""
        return self._images_by_id[image_id]


def _check_split(name: str) -> None:
    if name not in SPLITS:
        raise DatasetError(f"unknown split {name!r}; choose one of {', '.join(SPLITS)}")


# ---------------------------------------------------------------- plausible-match judgement


def is_plausible_match(caption: CaptionRecord, image: ImageRecord) -> bool:
    """True when the image holds everything the caption names.

    With object descriptors on both sides (shapes): every descriptor of `caption.named` must be
    satisfied by `count` objects of the image, and all these objects must be distinct (an
    injective assignment of the named slots to objects, found by augmenting paths). Spatial
    relations are not judged. Otherwise, with caption labels (clip art): the image's labels
    must hold every label of `caption.labels`. With neither (e.g. COCO), a caption plausibly
    matches only its own image.
    """
    if not caption.named or not image.objects:
        if caption.labels:
            return set(caption.labels) <= set(image.labels)
        return caption.image_id == image.id
    slots = [d for d in caption.named for _ in range(d.count)]
    if len(slots) > len(image.objects):
        return False
    owner: list[int | None] = [None] * len(image.objects)  # object -> slot assigned to it

    def assign(slot: int, seen: set[int]) -> bool:
        for obj, thing in enumerate(image.objects):
            if obj in seen or not slots[slot].matches(thing):
                continue
            seen.add(obj)
            current = owner[obj]
            if current is None or assign(current, seen):
                owner[obj] = slot
                return True
        return False

    return all(assign(slot, set()) for slot in range(len(slots)))


OBJECT_ATTRIBUTES: tuple[str, ...] = ("shape", "color", "size")


def attribute_names(images: Sequence[ImageRecord]) -> tuple[str, ...]:
    """Every object attribute value the images hold, as "shape:star", "color:red", ...,
    sorted (empty for a dataset without object annotations)."""
    return tuple(sorted({name for image in images for name in image_attributes(image)}))


def image_attributes(image: ImageRecord) -> set[str]:
    """The attribute values of the image's objects ("shape:star", "size:small", ...)."""
    return {
        f"{field}:{value}"
        for obj in image.objects
        for field in OBJECT_ATTRIBUTES
        if (value := getattr(obj, field)) is not None
    }


def plausible_match_matrix(
    captions: Sequence[CaptionRecord], images: Sequence[ImageRecord]
) -> np.ndarray:
    """Boolean (C, I) matrix of is_plausible_match for every caption-image pair, vectorised."""
    return PlausibleMatcher(images).matrix(captions)


class PlausibleMatcher:
    """is_plausible_match of captions against a fixed list of images, vectorised over the images.

    Uses Hall's theorem: the named slots can be given distinct objects iff, for every subset S
    of descriptors, sum of counts in S <= number of objects matching at least one of S. Each
    distinct set of named descriptors is judged once against every image and remembered, so a
    training loop that asks for many batches of the same split pays for it once. Captions
    naming more than MAX_HALL_DESCRIPTORS descriptors (2^n subsets) are judged pair by pair.
    """

    def __init__(self, images: Sequence[ImageRecord]) -> None:
        self.images = tuple(images)
        kinds = {(o.shape, o.color, o.size) for im in images for o in im.objects}
        self.kinds = sorted(kinds, key=str)
        kind_index = {k: i for i, k in enumerate(self.kinds)}
        self.counts = np.zeros((len(images), len(self.kinds)), dtype=np.int64)  # (I, K)
        for row, im in enumerate(images):
            for o in im.objects:
                self.counts[row, kind_index[(o.shape, o.color, o.size)]] += 1
        self.annotated = self.counts.sum(axis=1) > 0  # (I,)
        self.row_of_id = {im.id: row for row, im in enumerate(images)}
        self._hall: dict[tuple[Descriptor, ...], np.ndarray] = {}
        self._rows_of_label: dict[str, set[int]] = {}
        for row, im in enumerate(images):
            for label in im.labels:
                self._rows_of_label.setdefault(label, set()).add(row)
        self._holding: dict[tuple[str, ...], np.ndarray] = {}

    def matrix(
        self, captions: Sequence[CaptionRecord], columns: np.ndarray | None = None
    ) -> np.ndarray:
        """(C, I) bool, or (C, len(columns)) for the images at those rows."""
        columns = np.arange(len(self.images)) if columns is None else np.asarray(columns)
        annotated = self.annotated[columns]
        out = np.zeros((len(captions), len(columns)), dtype=bool)
        for r, caption in enumerate(captions):
            same_image = columns == self.row_of_id.get(caption.image_id, -1)
            if not caption.named and caption.labels:
                out[r] = self._holding_row(caption.labels)[columns]
            elif not caption.named:
                out[r] = same_image
            elif len(caption.named) > MAX_HALL_DESCRIPTORS:
                out[r] = [is_plausible_match(caption, self.images[c]) for c in columns]
            else:
                out[r] = np.where(annotated, self._hall_row(caption.named)[columns], same_image)
        return out

    def _holding_row(self, labels: tuple[str, ...]) -> np.ndarray:
        """(I,) bool: the image's labels hold all of `labels`."""
        if labels not in self._holding:
            rows = set.intersection(*(self._rows_of_label.get(lab, set()) for lab in labels))
            holding = np.zeros(len(self.images), dtype=bool)
            holding[list(rows)] = True
            self._holding[labels] = holding
        return self._holding[labels]

    def _hall_row(self, named: tuple[Descriptor, ...]) -> np.ndarray:
        if named not in self._hall:
            self._hall[named] = _hall_condition(named, self.kinds, self.counts)
        return self._hall[named]


def _hall_condition(
    named: tuple[Descriptor, ...], kinds: list[tuple[str, str, str | None]], counts: np.ndarray
) -> np.ndarray:
    """(I,) bool: Hall's condition holds for `named` against each image's object counts."""
    matches = np.array(
        [[d.matches(ObjectRecord(shape=s, color=c, size=z)) for s, c, z in kinds] for d in named],
        dtype=bool,
    ).reshape(len(named), len(kinds))  # (N, K)
    ok = np.ones(counts.shape[0], dtype=bool)
    for r in range(1, len(named) + 1):
        for subset in combinations(range(len(named)), r):
            demand = sum(named[i].count for i in subset)
            supply = counts @ matches[list(subset)].any(axis=0)  # (I,)
            ok &= supply >= demand
    return ok


# ---------------------------------------------------------------- loading


def load_dataset(root: Path | str, split: str | None = None) -> PairedDataset:
    """Read and validate a dataset directory (docs/data-format.md), optionally one split.

    Raises DatasetError naming the file (and line) for a missing directory or file, malformed
    JSON, a missing or ill-typed field, a duplicate id, or a caption of an unknown image.
    """
    root = Path(root)
    if split is not None:
        _check_split(split)
    if not root.is_dir():
        raise DatasetError(f"dataset directory {root} does not exist or is not a directory")
    meta = _read_meta(root / DATASET_FILE)
    label_names = tuple(meta["label_names"])
    label_set = set(label_names)
    images_by_id: dict[str, ImageRecord] = {}
    for item in _read_jsonl(root / IMAGES_FILE):
        image = _parse_image(root, item, label_set)
        if image.id in images_by_id:
            raise DatasetError(f"{_Where(*item[:2])}: duplicate image id {image.id!r}")
        images_by_id[image.id] = image
    captions: list[CaptionRecord] = []
    caption_ids: set[str] = set()
    for item in _read_jsonl(root / CAPTIONS_FILE):
        caption = _parse_caption(item, images_by_id, label_set)
        if caption.id in caption_ids:
            raise DatasetError(f"{_Where(*item[:2])}: duplicate caption id {caption.id!r}")
        caption_ids.add(caption.id)
        captions.append(caption)
    images = list(images_by_id.values())
    dataset = PairedDataset(root, label_names, images, captions, meta)
    return dataset if split is None else dataset.split(split)


def _read_meta(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise DatasetError(f"{path} is missing: every dataset directory needs {DATASET_FILE}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise DatasetError(f"{path}: expected a JSON object")
    where = _Where(path, None)
    _field(meta, "name", str, where)
    if meta.get("version") != FORMAT_VERSION:
        raise DatasetError(
            f"{path}: 'version' must be {FORMAT_VERSION}, got {meta.get('version')!r}"
        )
    names = _field(meta, "label_names", list, where, default=[])
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise DatasetError(f"{path}: 'label_names' must be a list of distinct strings")
    meta["label_names"] = names
    return meta


@dataclass(frozen=True)
class _Where:
    path: Path
    line: int | None

    def __str__(self) -> str:
        return f"{self.path}" if self.line is None else f"{self.path}:{self.line}"


def _read_jsonl(path: Path) -> Iterator[tuple[Path, int, dict[str, Any]]]:
    """(path, line number, object) for every non-blank line of a JSON Lines file."""
    if not path.is_file():
        raise DatasetError(f"{path} is missing: every dataset directory needs {path.name}")
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{number}: malformed JSON line ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise DatasetError(f"{path}:{number}: expected a JSON object per line")
            yield path, number, record


_MISSING = object()


def _field(record: Mapping[str, Any], key: str, kind: type, where: _Where, default: Any = _MISSING):
    """record[key], checked to be of `kind`; `default` when absent (required if none given)."""
    if key not in record:
        if default is _MISSING:
            raise DatasetError(f"{where}: missing field {key!r}")
        return default
    value = record[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DatasetError(f"{where}: field {key!r} must be of type {kind.__name__}, got {value!r}")
    if kind is str and not value:
        raise DatasetError(f"{where}: field {key!r} must not be empty")
    return value


def _parse_split(record: Mapping[str, Any], where: _Where, default: Any = _MISSING) -> str:
    split = _field(record, "split", str, where, default)
    if split not in SPLITS:
        raise DatasetError(f"{where}: split {split!r} is not one of {', '.join(SPLITS)}")
    return split


def _parse_image(root: Path, item: tuple[Path, int, dict], label_names: set[str]) -> ImageRecord:
    path, line, record = item
    where = _Where(path, line)
    image_id = _field(record, "id", str, where)
    file = root / _field(record, "file", str, where)
    if not file.is_file():
        raise DatasetError(f"{where}: image file {file} does not exist")
    labels = _field(record, "labels", list, where, default=[])
    unknown = [lab for lab in labels if lab not in label_names]
    if unknown:
        raise DatasetError(f"{where}: labels {unknown!r} are not in dataset.json 'label_names'")
    objects = tuple(_parse_object(o, where) for o in _field(record, "objects", list, where, []))
    split = _parse_split(record, where)
    return ImageRecord(image_id, file, split, tuple(labels), objects)


def _parse_object(obj: Any, where: _Where) -> ObjectRecord:
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: every entry of 'objects' must be a JSON object")
    bbox = _field(obj, "bbox", list, where, default=None)
    if bbox is not None and (len(bbox) != 4 or not all(isinstance(v, int) for v in bbox)):
        raise DatasetError(f"{where}: object 'bbox' must be 4 integers [x0, y0, x1, y1]")
    return ObjectRecord(
        shape=_field(obj, "shape", str, where),
        color=_field(obj, "color", str, where),
        size=_optional_str(obj, "size", where),
        bbox=None if bbox is None else tuple(bbox),
    )


def _optional_str(record: Mapping[str, Any], key: str, where: _Where) -> str | None:
    value = record.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise DatasetError(f"{where}: field {key!r} must be a non-empty string or null")
    return value


def _parse_descriptor(item: Any, where: _Where) -> Descriptor:
    if not isinstance(item, dict):
        raise DatasetError(f"{where}: every entry of 'named' must be a JSON object")
    count = _field(item, "count", int, where, default=1)
    if count < 1:
        raise DatasetError(f"{where}: descriptor 'count' must be >= 1, got {count}")
    return Descriptor(
        shape=_optional_str(item, "shape", where),
        color=_optional_str(item, "color", where),
        size=_optional_str(item, "size", where),
        count=count,
    )


def _parse_caption(
    item: tuple[Path, int, dict], images: Mapping[str, ImageRecord], label_names: set[str]
) -> CaptionRecord:
    path, line, record = item
    where = _Where(path, line)
    caption_id = _field(record, "id", str, where)
    image_id = _field(record, "image_id", str, where)
    text = _field(record, "text", str, where)
    image = images.get(image_id)
    if image is None:
        raise DatasetError(f"{where}: caption {caption_id!r} points to unknown image {image_id!r}")
    split = _parse_split(record, where, default=image.split)
    if split != image.split:
        raise DatasetError(
            f"{where}: caption split {split!r} differs from its image's split {image.split!r}"
        )
    named = tuple(_parse_descriptor(d, where) for d in _field(record, "named", list, where, []))
    labels = _caption_labels(record, where, label_names)
    return CaptionRecord(caption_id, image_id, text, split, named, labels)


def _caption_labels(record: Mapping[str, Any], where: _Where, label_names: set[str]) -> tuple:
    labels = _field(record, "labels", list, where, default=[])
    if not all(isinstance(label, str) for label in labels):
        raise DatasetError(f"{where}: caption 'labels' must be a list of strings")
    unknown = [label for label in labels if label not in label_names]
    if unknown:
        raise DatasetError(f"{where}: labels {unknown!r} are not in dataset.json 'label_names'")
    return tuple(labels)


# ---------------------------------------------------------------- writing


def caption_to_json(caption: CaptionRecord) -> dict[str, Any]:
    """The captions.jsonl object of one caption."""
    return {
        "id": caption.id,
        "image_id": caption.image_id,
        "text": caption.text,
        "split": caption.split,
        "named": [d.to_json() for d in caption.named],
        **({"labels": list(caption.labels)} if caption.labels else {}),
    }
