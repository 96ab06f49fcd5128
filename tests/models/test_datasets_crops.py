"""Crop experiment tuples: A alone and the union A+B, with consistent captions and content."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from models.datasets.crops import crop_pairs
from models.datasets.records import (
    CaptionRecord,
    DatasetError,
    Descriptor,
    ImageRecord,
    PairedDataset,
    is_plausible_match,
    load_dataset,
)
from models.datasets.shapes import generate_shapes
from models.datasets.shapes_render import COLORS


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> PairedDataset:
    root = generate_shapes(tmp_path_factory.mktemp("crops"), 40, seed=9, progress=False)
    return load_dataset(root)


def is_sub_multiset(small: tuple[Descriptor, ...], big: tuple[Descriptor, ...]) -> bool:
    """Every descriptor of `small` appears in `big` with at least its count."""
    totals: dict[tuple, int] = {}
    for d in big:
        totals[(d.shape, d.color, d.size)] = totals.get((d.shape, d.color, d.size), 0) + d.count
    return all(totals.get((d.shape, d.color, d.size), 0) >= d.count for d in small)


def color_pixels(image: Image.Image, color: str) -> int:
    """Pixels within 2 levels of a named object colour."""
    pixels = np.asarray(image, dtype=np.int32)  # (H, W, 3)
    return int((np.abs(pixels - np.array(COLORS[color])).max(axis=-1) <= 2).sum())


def test_one_pair_per_multi_object_image(dataset: PairedDataset) -> None:
    pairs = list(crop_pairs(dataset))
    expected = [im.id for im in dataset.images if len(im.objects) >= 2]
    assert [p.image_id for p in pairs] == expected and len(pairs) >= 20
    test_pairs = list(crop_pairs(dataset.root, split="test"))
    assert {p.split for p in test_pairs} == {"test"}
    assert len(test_pairs) == sum(len(im.objects) >= 2 for im in dataset.split("test").images)


def test_crop_captions_are_consistent(dataset: PairedDataset) -> None:
    for pair in crop_pairs(dataset):
        image = dataset.image(pair.image_id)
        a, b = image.objects[pair.index_a], image.objects[pair.index_b]
        assert pair.named_a == (Descriptor(a.shape, a.color, None, 1),)
        assert is_sub_multiset(pair.named_a, pair.named_ab)
        assert sum(d.count for d in pair.named_ab) == 2
        assert pair.caption_a in pair.caption_ab
        assert pair.caption_a == f"a {a.color} {a.shape}".replace("a orange", "an orange")
        only_a = ImageRecord("A", image.path, image.split, (), (a,))
        a_and_b = ImageRecord("AB", image.path, image.split, (), (a, b))
        caption_ab = CaptionRecord("c", "x", pair.caption_ab, image.split, pair.named_ab)
        caption_a = CaptionRecord("c", "x", pair.caption_a, image.split, pair.named_a)
        assert is_plausible_match(caption_a, only_a) and is_plausible_match(caption_a, a_and_b)
        assert is_plausible_match(caption_ab, a_and_b)
        assert not is_plausible_match(caption_ab, only_a)


def test_crop_views_hold_exactly_their_objects(dataset: PairedDataset) -> None:
    for pair in crop_pairs(dataset):
        image = dataset.image(pair.image_id)
        a, b = image.objects[pair.index_a], image.objects[pair.index_b]
        assert pair.image_a.size == pair.image_ab.size == (64, 64)
        assert color_pixels(pair.image_a, a.color) > 0
        others = {o.color for o in image.objects} - {a.color}
        assert all(color_pixels(pair.image_a, c) == 0 for c in others)
        assert color_pixels(pair.image_ab, b.color) > 0
        if len(image.objects) == 2:  # A+B is then the whole image, pixel for pixel
            with Image.open(image.path) as full:
                assert np.array_equal(np.asarray(full), np.asarray(pair.image_ab))


def test_rejects_other_datasets_and_tampered_records(dataset: PairedDataset, tmp_path) -> None:
    not_shapes = PairedDataset(dataset.root, (), dataset.images, [], {"name": "coco"})
    with pytest.raises(DatasetError, match="shapes dataset"):
        next(crop_pairs(not_shapes))
    root = Path(dataset.root)
    lines = (root / "images.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    target = next(r for r in records if len(r["objects"]) >= 2)
    target["objects"][0]["color"] = "blue" if target["objects"][0]["color"] != "blue" else "red"
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "images").symlink_to(root / "images")
    for name in ("dataset.json", "captions.jsonl"):
        (copy / name).write_text((root / name).read_text())
    (copy / "images.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    with pytest.raises(DatasetError, match=f"image {target['id']} differs"):
        list(crop_pairs(copy))
