"""Counterfactuals of the shapes data: a caption with one shape, colour or size word swapped, so
that it no longer describes its image ("a purple star" -> "a purple triangle"), and an image
re-rendered with one object's shape swapped, so that captions naming that object miss it.

A caption and its counterfactual differ in one attribute only, so ranking an image's caption
above its counterfactual can be learnt only from that attribute of the image; with colour
alone enough to tell most images of a batch apart, the hinge loss otherwise never asks the
image encoder for shape (Yuksekgonul et al. 2023 train CLIP on such swapped captions for the
same reason). A swap is kept only when the swapped caption is not a plausible match of its own
image, whichever named object the swapped word belonged to.

The swapped caption teaches the text side; the swapped image (same background, position,
colour and size) is the hard negative image of text-to-image search, and the only one that
can be told from the original by shape alone.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from functools import cache

import numpy as np

from models.datasets.records import CaptionRecord, ImageRecord, is_plausible_match
from models.datasets.shapes_captions import COLOR_WORDS, SHAPE_WORDS, SIZE_WORDS
from models.datasets.shapes_render import SHAPES, Scene

ATTRIBUTES: tuple[str, ...] = ("shape", "color", "size")


@cache
def _vocabulary(attribute: str) -> dict[str, tuple[str, bool]]:
    """word -> (attribute value, plural) for every word that names a shape or a colour."""
    if attribute == "shape":
        return {
            word: (shape, plural)
            for shape, nouns in SHAPE_WORDS.items()
            for pair in nouns
            for plural, word in enumerate(pair)
        }
    return {word: (value, False) for value, words in _values(attribute).items() for word in words}


def _values(attribute: str) -> dict:
    """value -> its words, for every value of the attribute."""
    return {"shape": SHAPE_WORDS, "color": COLOR_WORDS, "size": SIZE_WORDS}[attribute]


@cache
def _pattern(attribute: str) -> re.Pattern[str]:
    """Optional article, then the longest attribute word at that place ("five-pointed star")."""
    words = sorted(_vocabulary(attribute), key=len, reverse=True)
    alternatives = "|".join(re.escape(w) for w in words)
    return re.compile(rf"(?<![\w-])(?:(?P<article>an?) )?(?P<word>{alternatives})(?![\w-])")


def _words_for(attribute: str, value: str, plural: bool) -> tuple[str, ...]:
    if attribute == "shape":
        return tuple(pair[int(plural)] for pair in SHAPE_WORDS[value])
    return _values(attribute)[value]


def _implausible(
    caption: CaptionRecord, image: ImageRecord, attribute: str, old: str, new: str
) -> bool:
    """True when every reading of the swap (any named descriptor with `old`) misses the image."""
    named = caption.named
    readings = [
        (*named[:k], replace(d, **{attribute: new}), *named[k + 1 :])
        for k, d in enumerate(named)
        if getattr(d, attribute) == old
    ]
    if not readings:
        return False
    return not any(is_plausible_match(replace(caption, named=r), image) for r in readings)


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def counterfactual(
    caption: CaptionRecord, image: ImageRecord, attribute: str, rng: np.random.Generator
) -> str | None:
    """The caption with one `attribute` ("shape", "color" or "size") word swapped for a value that
    makes it miss its image, or None when no such swap exists (no such word, no objects)."""
    if attribute not in ATTRIBUTES:
        raise ValueError(f"unknown attribute {attribute!r}; choose one of {ATTRIBUTES}")
    if not caption.named or not image.objects:
        return None
    found = list(_pattern(attribute).finditer(caption.text))
    for match in rng.permutation(len(found)) if found else ():
        hit = found[int(match)]
        old, plural = _vocabulary(attribute)[hit["word"]]
        candidates = [
            v
            for v in _values(attribute)
            if v != old and _implausible(caption, image, attribute, old, v)
        ]
        if not candidates:
            continue
        new = candidates[rng.integers(len(candidates))]
        options = _words_for(attribute, new, plural)
        word = options[0] if rng.random() < 0.5 else options[rng.integers(len(options))]
        text = f"{_article(word)} {word}" if hit["article"] else word
        return caption.text[: hit.start()] + text + caption.text[hit.end() :]
    return None


def counterfactual_texts(
    captions: Sequence[CaptionRecord],
    images: Sequence[ImageRecord],
    caption_image: Sequence[int],
    seed: int,
    attributes: Sequence[str] = ATTRIBUTES,
) -> list[list[str | None]]:
    """For each caption, one counterfactual per attribute of `attributes` (None where none
    exists); caption k of the list draws from its own generator (seed, k)."""
    out = []
    for k, caption in enumerate(captions):
        rng = np.random.default_rng([seed, k])
        image = images[caption_image[k]]
        out.append([counterfactual(caption, image, a, rng) for a in attributes])
    return out


def swapped_shape_scene(
    scene: Scene,
    image: ImageRecord,
    captions: Sequence[CaptionRecord],
    rng: np.random.Generator,
) -> tuple[Scene, np.ndarray] | None:
    """The scene with one object's shape changed, and (len(captions),) bool: which of the
    image's captions match the original but not the swapped scene. Of the objects (each given
    a random other shape) the one whose swap makes the most captions miss is swapped; None
    when no swap makes any caption miss. `image` is the record of `scene` (same object order).
    """
    if len(scene.objects) != len(image.objects):
        raise ValueError(
            f"image {image.id!r} lists {len(image.objects)} objects, its scene {len(scene.objects)}"
        )
    before = np.array([is_plausible_match(c, image) for c in captions], dtype=bool)
    best: tuple[int, Scene, np.ndarray] | None = None
    for k in rng.permutation(len(scene.objects)):
        old = scene.objects[int(k)]
        new_shape = str(rng.choice([s for s in SHAPES if s != old.shape]))
        objects = list(scene.objects)
        objects[int(k)] = replace(old, shape=new_shape)
        records = list(image.objects)
        records[int(k)] = replace(records[int(k)], shape=new_shape)
        swapped = replace(image, objects=tuple(records))
        after = np.array([is_plausible_match(c, swapped) for c in captions], dtype=bool)
        misses = before & ~after
        if misses.sum() and (best is None or misses.sum() > best[0]):
            best = (int(misses.sum()), replace(scene, objects=tuple(objects)), misses)
    return None if best is None else best[1:]
