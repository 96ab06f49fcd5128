"""Counterfactual captions: one shape, colour or size word swapped, the rest of the caption
kept, and the result judged not to describe its image by the vectorised plausibility matrix
(an implementation apart from the one the generator uses)."""

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from models.datasets.counterfactuals import (
    ATTRIBUTES,
    counterfactual,
    counterfactual_texts,
    swapped_shape_scene,
)
from models.datasets.records import (
    CaptionRecord,
    Descriptor,
    ImageRecord,
    ObjectRecord,
    load_dataset,
    plausible_match_matrix,
)
from models.datasets.shapes import generate_shapes, image_index
from models.datasets.shapes_captions import COLOR_WORDS, SHAPE_WORDS, SIZE_WORDS
from models.datasets.shapes_render import object_bbox, render_scene, sample_scene

SHAPE_OF = {w: s for s, nouns in SHAPE_WORDS.items() for pair in nouns for w in pair}
D_SMALL_STAR = Descriptor("star", "purple", "small")
COLOR_OF = {w: c for c, words in COLOR_WORDS.items() for w in words}
SIZE_OF = {w: z for z, words in SIZE_WORDS.items() for w in words}
VOCABULARY = {"shape": SHAPE_OF, "color": COLOR_OF, "size": SIZE_OF}


@pytest.fixture(scope="module")
def captions_and_swaps(tmp_path_factory) -> list[tuple[CaptionRecord, ImageRecord, list]]:
    root = generate_shapes(
        tmp_path_factory.mktemp("cf") / "shapes", 60, seed=4, progress=False, workers=1
    )
    data = load_dataset(Path(root))
    row_of = {im.id: k for k, im in enumerate(data.images)}
    rows = [row_of[c.image_id] for c in data.captions]
    swaps = counterfactual_texts(data.captions, data.images, rows, seed=0)
    return [(c, data.images[r], s) for c, r, s in zip(data.captions, rows, swaps, strict=True)]


def swapped_words(before: str, after: str) -> tuple[str, str]:
    """The words in which two texts differ (common leading and trailing words and articles
    dropped): "a red square and a star" -> "a blue square and a star" gives ("red", "blue")."""
    old, new = before.replace(",", " ,").split(), after.replace(",", " ,").split()
    while old and new and old[0] == new[0]:
        old, new = old[1:], new[1:]
    while old and new and old[-1] == new[-1]:
        old, new = old[:-1], new[:-1]
    drop = ("a", "an")
    return " ".join(w for w in old if w not in drop), " ".join(w for w in new if w not in drop)


def meaning(words: str, vocabulary: dict[str, str]) -> str | None:
    """The attribute a word group names: a whole vocabulary phrase, or whole words of exactly
    one phrase ("round" of "round shape")."""
    if words in vocabulary:
        return vocabulary[words]
    values = {v for phrase, v in vocabulary.items() if f" {words} " in f" {phrase} "}
    return values.pop() if len(values) == 1 else None


def test_a_swap_changes_one_attribute_and_misses_its_image(captions_and_swaps) -> None:
    made = {a: 0 for a in ATTRIBUTES}
    for caption, image, swaps in captions_and_swaps:
        for attribute, text in zip(ATTRIBUTES, swaps, strict=True):
            if text is None:
                continue
            made[attribute] += 1
            vocabulary = VOCABULARY[attribute]
            old, new = map(lambda w: meaning(w, vocabulary), swapped_words(caption.text, text))
            assert None not in (old, new) and old != new, (caption.text, text)
            readings = [
                replace(
                    caption, named=(*named[:k], replace(d, **{attribute: new}), *named[k + 1 :])
                )
                for named in [caption.named]
                for k, d in enumerate(named)
                if getattr(d, attribute) == old
            ]
            assert readings, (caption.text, text)
            assert not plausible_match_matrix(readings, [image]).any(), (caption.text, text)
    assert made["shape"] > 100 and made["color"] > 100 and made["size"] > 20, made


def test_asked_attributes_alone_are_swapped(captions_and_swaps) -> None:
    captions = [c for c, _, _ in captions_and_swaps]
    images = [im for _, im, _ in captions_and_swaps]
    swaps = counterfactual_texts(captions, images, list(range(len(images))), 0, ("size",))
    sized = 0
    for caption, (text,) in zip(captions, swaps, strict=True):
        if text is not None:
            sized += 1
            old, new = swapped_words(caption.text, text)
            assert {SIZE_OF.get(old), SIZE_OF.get(new)} == {"small", "large"}, (caption, text)
    assert sized > 20


def test_articles_agree_with_the_swapped_word(captions_and_swaps) -> None:
    for _, _, swaps in captions_and_swaps:
        for text in filter(None, swaps):
            words = text.split(" ")
            for article, word in itertools.pairwise(words):
                if article in ("a", "an"):
                    assert (article == "an") == (word[0] in "aeiou"), text


def test_nothing_to_swap_gives_none_and_texts_are_seeded(captions_and_swaps) -> None:
    obj = ObjectRecord(shape="star", color="purple", size="small")
    image = ImageRecord("i", Path("i.png"), "train", ("purple star",), (obj,))
    vague = CaptionRecord("c", "i", "some shapes", "train", (Descriptor(count=1),))
    assert counterfactual(vague, image, "shape", np.random.default_rng(0)) is None
    unannotated = CaptionRecord("d", "i", "a purple star", "train", ())
    assert counterfactual(unannotated, image, "color", np.random.default_rng(0)) is None
    star = CaptionRecord("e", "i", "a purple star", "train", (Descriptor("star", "purple"),))
    swapped = counterfactual(star, image, "shape", np.random.default_rng(1))
    assert swapped is not None and swapped.startswith("a purple ") and "star" not in swapped
    small = CaptionRecord("f", "i", "a tiny purple star", "train", (D_SMALL_STAR,))
    assert counterfactual(small, image, "size", np.random.default_rng(2)) in (
        "a large purple star", "a big purple star"
    )  # fmt: skip
    assert counterfactual(star, image, "size", np.random.default_rng(0)) is None  # no size named
    with pytest.raises(ValueError, match="unknown attribute"):
        counterfactual(star, image, "weight", np.random.default_rng(0))
    captions = [c for c, _, _ in captions_and_swaps]
    images = [im for _, im, _ in captions_and_swaps]
    first = counterfactual_texts(captions, images, list(range(len(images))), seed=3)
    assert first == counterfactual_texts(captions, images, list(range(len(images))), seed=3)
    assert first != counterfactual_texts(captions, images, list(range(len(images))), seed=4)


def test_a_swapped_scene_changes_one_shape_and_the_captions_it_flags_miss(tmp_path) -> None:
    """Each image re-rendered with one object's shape swapped: nothing else of the scene
    changes, pixels change only around that object, and the captions flagged as missed are
    exactly those the vectorised plausibility matrix (apart from the generator's matcher)
    says matched before and not after. Every one-object image gets a swap."""
    root = generate_shapes(tmp_path / "shapes", 40, seed=6, progress=False, workers=1)
    data = load_dataset(Path(root))
    made = 0
    for row, image in enumerate(data.images):
        captions = [c for c in data.captions if c.image_id == image.id]
        scene = sample_scene(6, image_index(image.id))
        swap = swapped_shape_scene(scene, image, captions, np.random.default_rng([0, row]))
        if swap is None:
            assert len(image.objects) > 1
            continue
        made += 1
        swapped, misses = swap
        changed = [k for k, (a, b) in enumerate(zip(scene.objects, swapped.objects, strict=True))
                   if a != b]  # fmt: skip
        assert len(changed) == 1 and scene.background == swapped.background
        old, new = scene.objects[changed[0]], swapped.objects[changed[0]]
        assert old.shape != new.shape and replace(new, shape=old.shape) == old
        after = replace(image, objects=tuple(
            replace(o, shape=s.shape) for o, s in zip(image.objects, swapped.objects, strict=True)
        ))  # fmt: skip
        matrix = plausible_match_matrix(captions, [image, after])
        np.testing.assert_array_equal(misses, matrix[:, 0] & ~matrix[:, 1])
        assert misses.any()
        diff = np.abs(np.asarray(render_scene(scene), float) - np.asarray(render_scene(swapped)))
        for x0, y0, x1, y1 in (object_bbox(old), object_bbox(new)):
            diff[max(y0 - 1, 0) : y1 + 2, max(x0 - 1, 0) : x1 + 2] = 0
        assert diff.max() == 0 and made
    assert made >= sum(len(im.objects) == 1 for im in data.images) > 0
