"""Loader for the Karpathy-split caption JSON (`dataset_coco.json` layout) into a PairedDataset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from models.datasets.records import (
    FORMAT_VERSION,
    SPLITS,
    CaptionRecord,
    DatasetError,
    ImageRecord,
    PairedDataset,
)

KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}


def load_coco_karpathy(
    json_path: Path | str, image_root: Path | str, split: str | None = None
) -> PairedDataset:
    """Read `dataset_coco.json` (Karpathy splits); "restval" images join the train split.

    Image paths are image_root/filepath/filename (image_root/filename when an entry has no
    filepath, as in the Flickr variants); image ids are the COCO ids (`cocoid`, else `imgid`)
    and caption ids the `sentid`s. Image files are not opened here. There are no labels or
    object descriptors, so a caption plausibly matches only its own image.
    """
    json_path, image_root = Path(json_path), Path(image_root)
    if split is not None and split not in SPLITS:
        raise DatasetError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if not image_root.is_dir():
        raise DatasetError(f"image root {image_root} does not exist or is not a directory")
    document = _read_json(json_path)
    images: list[ImageRecord] = []
    captions: list[CaptionRecord] = []
    seen_images: set[str] = set()
    seen_captions: set[str] = set()
    for position, entry in enumerate(document["images"]):
        where = f"{json_path}: images[{position}]"
        image = _parse_image(entry, image_root, where)
        if image.id in seen_images:
            raise DatasetError(f"{where}: duplicate image id {image.id!r}")
        seen_images.add(image.id)
        if split is not None and image.split != split:
            continue
        images.append(image)
        for caption in _parse_sentences(entry, image, where):
            if caption.id in seen_captions:
                raise DatasetError(f"{where}: duplicate sentid {caption.id}")
            seen_captions.add(caption.id)
            captions.append(caption)
    meta = {"name": str(document.get("dataset", "coco")), "version": FORMAT_VERSION}
    meta["source"] = str(json_path)
    return PairedDataset(image_root, (), images, captions, meta)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise DatasetError(f"{path} does not exist (expected the Karpathy dataset_coco.json)")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(document, dict) or not isinstance(document.get("images"), list):
        raise DatasetError(f"{path}: expected a JSON object with an 'images' list")
    return document


def _require(entry: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(entry, dict):
        raise DatasetError(f"{where}: expected a JSON object")
    if key not in entry:
        raise DatasetError(f"{where}: missing field {key!r}")
    value = entry[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise DatasetError(f"{where}: field {key!r} has the wrong type ({value!r})")
    return value


def _parse_image(entry: Any, image_root: Path, where: str) -> ImageRecord:
    filename = _require(entry, "filename", str, where)
    filepath = entry.get("filepath", "")
    if not isinstance(filepath, str):
        raise DatasetError(f"{where}: field 'filepath' must be a string")
    raw_split = _require(entry, "split", str, where)
    if raw_split not in KARPATHY_SPLITS:
        raise DatasetError(
            f"{where}: split {raw_split!r} is not one of {', '.join(KARPATHY_SPLITS)}"
        )
    key = "cocoid" if "cocoid" in entry else "imgid"
    image_id = str(_require(entry, key, int, where))
    path = image_root / filepath / filename
    return ImageRecord(image_id, path, KARPATHY_SPLITS[raw_split], labels=())


def _parse_sentences(entry: dict, image: ImageRecord, where: str) -> list[CaptionRecord]:
    sentences = _require(entry, "sentences", list, where)
    imgid = entry.get("imgid")
    captions = []
    for number, sentence in enumerate(sentences):
        here = f"{where}.sentences[{number}]"
        text = _require(sentence, "raw", str, here).strip()
        if not text:
            raise DatasetError(f"{here}: empty caption text")
        sentid = _require(sentence, "sentid", int, here)
        if imgid is not None and sentence.get("imgid", imgid) != imgid:
            raise DatasetError(
                f"{here}: imgid {sentence['imgid']} differs from its image's {imgid}"
            )
        captions.append(CaptionRecord(str(sentid), image.id, text, image.split))
    return captions
