"""Dataset format loader and plausible-match judgement, on hand-written records and fixtures."""

from __future__ import annotations

import json
import re
from itertools import permutations
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from models.datasets.records import (
    CaptionRecord,
    DatasetError,
    Descriptor,
    ImageRecord,
    ObjectRecord,
    attribute_names,
    caption_to_json,
    image_attributes,
    is_plausible_match,
    load_dataset,
    plausible_match_matrix,
)


def image_with(*objects: tuple[str, str, str], image_id: str = "img") -> ImageRecord:
    """An image record holding (shape, colour, size) objects."""
    return ImageRecord(
        image_id, Path("x.png"), "train", (), tuple(ObjectRecord(s, c, z) for s, c, z in objects)
    )


def caption_naming(*named: Descriptor, image_id: str = "other") -> CaptionRecord:
    return CaptionRecord("cap", image_id, "text", "train", named)


D = Descriptor
ONE_RED_CIRCLE = image_with(("circle", "red", "small"))
TWO_RED_CIRCLES_AND_BLUE_BOX = image_with(
    ("circle", "red", "small"), ("square", "blue", "large"), ("circle", "red", "large")
)
RED_CIRCLE_AND_BLUE_BOX = image_with(("circle", "red", "small"), ("square", "blue", "large"))
BLUE_BOX_AND_RED_CIRCLE = image_with(("square", "blue", "large"), ("circle", "red", "small"))

HAND_CASES = [
    # (caption descriptors, image, expected)
    ((D("circle", "red", count=2),), ONE_RED_CIRCLE, False),  # "two red circles"
    ((D("circle", "red"),), ONE_RED_CIRCLE, True),  # "a red circle"
    ((D("circle"),), ONE_RED_CIRCLE, True),  # "a ball"
    ((D(color="red"),), ONE_RED_CIRCLE, True),  # "something crimson"
    ((D("circle", "blue"),), ONE_RED_CIRCLE, False),  # "a blue circle"
    ((D("square"),), ONE_RED_CIRCLE, False),  # "a box"
    ((D(),), ONE_RED_CIRCLE, True),  # "a colourful object"
    ((D(count=2),), ONE_RED_CIRCLE, False),  # "some shapes"
    ((D("circle", "red", size="large"),), ONE_RED_CIRCLE, False),  # "a large red circle"
    ((D("circle", "red", size="small"),), ONE_RED_CIRCLE, True),  # "a small red circle"
    ((D("circle", "red", count=2),), TWO_RED_CIRCLES_AND_BLUE_BOX, True),
    ((D("circle", count=3),), TWO_RED_CIRCLES_AND_BLUE_BOX, False),  # "three circles"
    ((D(count=3),), TWO_RED_CIRCLES_AND_BLUE_BOX, True),  # "three shapes"
    ((D(count=4),), TWO_RED_CIRCLES_AND_BLUE_BOX, False),
    # "a red circle left of a red circle": two distinct red circles needed
    ((D("circle", "red"), D("circle", "red")), TWO_RED_CIRCLES_AND_BLUE_BOX, True),
    ((D("circle", "red"), D("circle", "red")), RED_CIRCLE_AND_BLUE_BOX, False),
    # "a red circle and a circle": both descriptors fit the same single circle only
    ((D("circle", "red"), D("circle")), RED_CIRCLE_AND_BLUE_BOX, False),
    ((D("circle", "red"), D("square", "blue")), RED_CIRCLE_AND_BLUE_BOX, True),
    ((D(color="blue"), D()), RED_CIRCLE_AND_BLUE_BOX, True),  # "a blue thing and an object"
    # a greedy assignment gives the only square to the vague slot first, then fails
    ((D(), D("square")), BLUE_BOX_AND_RED_CIRCLE, True),
    ((D(), D(), D()), RED_CIRCLE_AND_BLUE_BOX, False),
]


@pytest.mark.parametrize(("named", "image", "expected"), HAND_CASES)
def test_plausible_match_hand_cases(named, image, expected) -> None:
    caption = caption_naming(*named)
    assert is_plausible_match(caption, image) is expected
    assert plausible_match_matrix([caption], [image])[0, 0] == expected


def test_attributes_name_every_value_the_objects_hold() -> None:
    """Each (field, value) of each object once; None values (a COCO-style object without a
    size) and images without objects add nothing; the vocabulary is sorted and shared."""
    unsized = ImageRecord("u", Path("u.png"), "val", (), (ObjectRecord("star", "purple"),))
    bare = ImageRecord("b", Path("b.png"), "val", ())
    assert image_attributes(TWO_RED_CIRCLES_AND_BLUE_BOX) == {
        "shape:circle", "shape:square", "color:red", "color:blue", "size:small", "size:large"
    }  # fmt: skip
    assert image_attributes(unsized) == {"shape:star", "color:purple"}
    assert image_attributes(bare) == set()
    names = attribute_names([ONE_RED_CIRCLE, unsized, bare])
    assert names == ("color:purple", "color:red", "shape:circle", "shape:star", "size:small")
    assert attribute_names([bare]) == ()


def test_without_descriptors_only_the_own_image_matches() -> None:
    coco_caption = CaptionRecord("c1", "img", "a man riding a horse", "train")
    assert is_plausible_match(coco_caption, ONE_RED_CIRCLE)  # same id "img"
    other = image_with(("circle", "red", "small"), image_id="img2")
    assert not is_plausible_match(coco_caption, other)
    unannotated = ImageRecord("img3", Path("y.png"), "train", ())
    named = caption_naming(D("circle"), image_id="img3")
    assert is_plausible_match(named, unannotated)
    assert not is_plausible_match(caption_naming(D("circle")), unannotated)
    matrix = plausible_match_matrix([coco_caption, named], [ONE_RED_CIRCLE, other, unannotated])
    assert matrix.tolist() == [[True, False, False], [True, True, True]]


def brute_force_match(caption: CaptionRecord, image: ImageRecord) -> bool:
    """Reference: try every injective assignment of named slots to objects."""
    slots = [d for d in caption.named for _ in range(d.count)]
    return any(
        all(slot.matches(image.objects[obj]) for slot, obj in zip(slots, chosen, strict=True))
        for chosen in permutations(range(len(image.objects)), len(slots))
    )


def test_judgements_agree_with_brute_force_on_random_records() -> None:
    rng = np.random.default_rng(7)
    shapes, colors, sizes = ("circle", "square", "star"), ("red", "blue"), ("small", "large")

    def maybe(values: tuple[str, ...]) -> str | None:
        return None if rng.random() < 0.4 else values[rng.integers(len(values))]

    images = [
        image_with(
            *[
                (shapes[rng.integers(3)], colors[rng.integers(2)], sizes[rng.integers(2)])
                for _ in range(rng.integers(1, 5))
            ],
            image_id=f"i{n}",
        )
        for n in range(40)
    ]
    captions = [
        caption_naming(
            *[
                D(maybe(shapes), maybe(colors), maybe(sizes), int(rng.integers(1, 3)))
                for _ in range(rng.integers(1, 4))
            ]
        )
        for _ in range(150)
    ]
    expected = np.array([[brute_force_match(c, im) for im in images] for c in captions])
    loop = np.array([[is_plausible_match(c, im) for im in images] for c in captions])
    assert 0.05 < expected.mean() < 0.95  # both outcomes are exercised
    np.testing.assert_array_equal(loop, expected)
    np.testing.assert_array_equal(plausible_match_matrix(captions, images), expected)


def test_caption_labels_match_images_holding_them_all_against_a_set_loop() -> None:
    rng = np.random.default_rng(11)
    names = [f"label{k}" for k in range(6)]

    def some(low: int, high: int) -> tuple[str, ...]:
        picked = rng.choice(len(names), size=rng.integers(low, high), replace=False)
        return tuple(names[k] for k in sorted(picked))

    images = [ImageRecord(f"i{n}", Path("x.png"), "test", some(0, 5)) for n in range(30)]
    captions = [
        CaptionRecord(f"c{n}", f"i{rng.integers(30)}", "words", "test", labels=some(0, 3))
        for n in range(80)
    ]
    expected = np.array(
        [
            [all(label in im.labels for label in c.labels) if c.labels else c.image_id == im.id
             for im in images]
            for c in captions
        ]
    )  # fmt: skip
    assert 0.05 < expected.mean() < 0.95
    np.testing.assert_array_equal(
        [[is_plausible_match(c, im) for im in images] for c in captions], expected
    )
    np.testing.assert_array_equal(plausible_match_matrix(captions, images), expected)


def test_caption_labels_are_read_and_checked_against_label_names(tmp_path: Path) -> None:
    captions = [{**CAPTIONS[0], "labels": ["red circle"]}, *CAPTIONS[1:]]
    dataset = load_dataset(write_dataset(tmp_path / "ok", captions=captions))
    assert dataset.captions[0].labels == ("red circle",)
    assert caption_to_json(dataset.captions[0])["labels"] == ["red circle"]
    bad = [{**CAPTIONS[0], "labels": ["green star"]}, *CAPTIONS[1:]]
    with pytest.raises(DatasetError, match=r"captions.jsonl:1: labels \['green star'\]"):
        load_dataset(write_dataset(tmp_path / "bad", captions=bad))


# ---------------------------------------------------------------- loader fixtures

META = {"name": "handmade", "version": 1, "label_names": ["red circle", "blue square"]}
IMAGES = [
    {"id": "a", "file": "images/a.png", "split": "train", "labels": ["red circle"],
     "objects": [{"shape": "circle", "color": "red", "size": "small", "bbox": [1, 2, 3, 4]}]},
    {"id": "b", "file": "images/b.png", "split": "val", "labels": ["blue square"]},
]  # fmt: skip
CAPTIONS = [
    {"id": "a0", "image_id": "a", "text": "a red ball", "split": "train",
     "named": [{"shape": "circle", "color": "red", "count": 1}]},
    {"id": "a1", "image_id": "a", "text": "something"},
    {"id": "b0", "image_id": "b", "text": "a blue box", "split": "val"},
]  # fmt: skip


def write_dataset(root: Path, meta=META, images=IMAGES, captions=CAPTIONS) -> Path:
    """A dataset directory from JSON-able records (strings are written as raw lines)."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    for name in ("a", "b"):
        Image.new("RGB", (4, 4), (200, 10, 10)).save(root / "images" / f"{name}.png")
    (root / "dataset.json").write_text(json.dumps(meta))
    for file, records in (("images.jsonl", images), ("captions.jsonl", captions)):
        lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
        (root / file).write_text("\n".join(lines) + "\n")
    return root


def test_load_valid_dataset(tmp_path: Path) -> None:
    dataset = load_dataset(write_dataset(tmp_path))
    assert dataset.label_names == ("red circle", "blue square")
    assert [im.id for im in dataset.images] == ["a", "b"]
    a = dataset.image("a")
    assert a.path == tmp_path / "images" / "a.png"
    assert a.labels == ("red circle",)
    assert a.objects == (ObjectRecord("circle", "red", "small", (1, 2, 3, 4)),)
    assert dataset.image("b").objects == ()
    assert [c.id for c in dataset.captions_of("a")] == ["a0", "a1"]
    assert dataset.captions_of("a")[0].named == (D("circle", "red", None, 1),)
    assert dataset.captions_of("a")[1].split == "train"  # inherited from the image
    assert dataset.captions_of("nope") == []
    val = dataset.split("val")
    assert [im.id for im in val.images] == ["b"] and [c.id for c in val.captions] == ["b0"]
    assert load_dataset(tmp_path, split="val") == val
    assert is_plausible_match(dataset.captions[0], a)
    assert not is_plausible_match(dataset.captions[0], dataset.image("b"))


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    dataset = load_dataset(write_dataset(tmp_path, captions=[CAPTIONS[0], "", "   ", CAPTIONS[2]]))
    assert [c.id for c in dataset.captions] == ["a0", "b0"]


def _without(record: dict, key: str) -> dict:
    return {k: v for k, v in record.items() if k != key}


BAD_FIXTURES = [
    # (what to write, expected fragments of the message)
    ({"images": [IMAGES[0], "{not json"]}, ["images.jsonl:2", "malformed JSON"]),
    ({"images": [IMAGES[0], "[1, 2]"]}, ["images.jsonl:2", "JSON object"]),
    ({"captions": [CAPTIONS[0], {**CAPTIONS[1], "image_id": "zzz"}]},
     ["captions.jsonl:2", "unknown image 'zzz'"]),
    ({"captions": [_without(CAPTIONS[0], "text")]}, ["captions.jsonl:1", "missing field 'text'"]),
    ({"captions": [{**CAPTIONS[0], "text": ""}]}, ["captions.jsonl:1", "'text'", "empty"]),
    ({"images": [_without(IMAGES[0], "file"), IMAGES[1]]}, ["images.jsonl:1", "'file'"]),
    ({"images": [_without(IMAGES[0], "split"), IMAGES[1]]}, ["images.jsonl:1", "'split'"]),
    ({"images": [{**IMAGES[0], "split": "dev"}, IMAGES[1]]}, ["images.jsonl:1", "'dev'"]),
    ({"images": [{**IMAGES[0], "file": "images/none.png"}, IMAGES[1]]},
     ["images.jsonl:1", "none.png", "does not exist"]),
    ({"images": [{**IMAGES[0], "labels": ["green star"]}, IMAGES[1]]},
     ["images.jsonl:1", "green star", "label_names"]),
    ({"images": [IMAGES[0], {**IMAGES[1], "id": "a"}]}, ["images.jsonl:2", "duplicate image id"]),
    ({"images": [{**IMAGES[0], "objects": [{"color": "red"}]}, IMAGES[1]]},
     ["images.jsonl:1", "'shape'"]),
    ({"captions": [CAPTIONS[0], {**CAPTIONS[1], "id": "a0"}]},
     ["captions.jsonl:2", "duplicate caption id"]),
    ({"captions": [{**CAPTIONS[0], "split": "val"}]}, ["captions.jsonl:1", "differs"]),
    ({"captions": [{**CAPTIONS[0], "named": [{"shape": "circle", "count": 0}]}]},
     ["captions.jsonl:1", "count"]),
    ({"captions": [{**CAPTIONS[0], "named": [{"shape": "circle", "count": "2"}]}]},
     ["captions.jsonl:1", "'count'", "int"]),
    ({"meta": {**META, "version": 2}}, ["dataset.json", "version"]),
    ({"meta": _without(META, "name")}, ["dataset.json", "'name'"]),
    ({"meta": {**META, "label_names": ["a", "a"]}}, ["dataset.json", "label_names"]),
]  # fmt: skip


@pytest.mark.parametrize(("override", "fragments"), BAD_FIXTURES)
def test_malformed_fixtures_raise_dataset_error(tmp_path: Path, override, fragments) -> None:
    root = write_dataset(tmp_path, **override)
    with pytest.raises(DatasetError) as info:
        load_dataset(root)
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize("missing", ["dataset.json", "images.jsonl", "captions.jsonl"])
def test_missing_file(tmp_path: Path, missing: str) -> None:
    (write_dataset(tmp_path) / missing).unlink()
    with pytest.raises(DatasetError, match=rf"{re.escape(missing)} is missing"):
        load_dataset(tmp_path)


def test_missing_directory_and_bad_split(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset(tmp_path / "absent")
    with pytest.raises(DatasetError, match="unknown split 'dev'"):
        load_dataset(write_dataset(tmp_path), split="dev")
    assert issubclass(DatasetError, ValueError)


def test_dataset_json_not_json(tmp_path: Path) -> None:
    (write_dataset(tmp_path) / "dataset.json").write_text("{oops")
    with pytest.raises(DatasetError, match=r"dataset\.json: not valid JSON"):
        load_dataset(tmp_path)
