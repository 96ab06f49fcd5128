"""Captions of shapes scenes: full, partial, by attribute, spatial and vague, with named objects."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from models.datasets.records import Descriptor
from models.datasets.shapes_render import SceneObject

CAPTIONS_PER_IMAGE = 5
COLOR_WORDS: dict[str, tuple[str, ...]] = {
    "red": ("red", "crimson", "scarlet"),
    "green": ("green", "emerald"),
    "blue": ("blue", "cobalt", "azure"),
    "yellow": ("yellow", "golden", "lemon"),
    "purple": ("purple", "violet"),
    "orange": ("orange", "tangerine", "amber"),
}
SHAPE_WORDS: dict[str, tuple[tuple[str, str], ...]] = {  # (singular, plural)
    "circle": (("circle", "circles"), ("ball", "balls"), ("round shape", "round shapes"),
               ("disc", "discs"), ("dot", "dots")),
    "square": (("square", "squares"), ("box", "boxes"), ("block", "blocks")),
    "triangle": (("triangle", "triangles"), ("triangular shape", "triangular shapes")),
    "diamond": (("diamond", "diamonds"), ("rhombus", "rhombuses"), ("lozenge", "lozenges")),
    "star": (("star", "stars"), ("five-pointed star", "five-pointed stars")),
}  # fmt: skip
SIZE_WORDS: dict[str, tuple[str, ...]] = {
    "small": ("small", "little", "tiny"),
    "large": ("large", "big"),
}
VAGUE_NOUNS: tuple[tuple[str, str], ...] = (
    ("shape", "shapes"),
    ("object", "objects"),
    ("thing", "things"),
)
NUMBER_WORDS = {2: "two", 3: "three", 4: "four"}
PREFIXES = ("", "", "", "a picture of ", "an image with ", "a scene with ")
RELATIONS = ("left of", "right of", "above", "below")
RELATION_MARGIN = 8.0  # pixels between centres before "left of" etc. is said
KINDS = ("partial", "attribute", "spatial", "vague")
KIND_WEIGHTS = (0.3, 0.25, 0.25, 0.2)

Caption = tuple[str, tuple[Descriptor, ...]]


def make_captions(objects: Sequence[SceneObject], rng: np.random.Generator) -> list[Caption]:
    """Five (text, named descriptors) captions; the first names every object."""
    captions = [_full(objects, rng)]
    for _ in range(CAPTIONS_PER_IMAGE - 1):
        kind = KINDS[rng.choice(len(KINDS), p=KIND_WEIGHTS)]
        if kind == "spatial" and _relations(objects):
            captions.append(_spatial(objects, rng))
        elif kind == "attribute":
            captions.append(_attribute(objects, rng))
        elif kind == "vague":
            captions.append(_vague(len(objects), rng))
        else:
            captions.append(_partial(objects, rng))
    return captions


def _pick(rng: np.random.Generator | None, options: Sequence):
    """The first (canonical) option half of the time, otherwise any; always it without rng."""
    if rng is None or rng.random() < 0.5:
        return options[0]
    return options[rng.integers(len(options))]


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def phrase(descriptor: Descriptor, rng: np.random.Generator | None = None) -> str:
    """Words for a descriptor, e.g. "two large crimson balls"; canonical words without rng."""
    nouns = SHAPE_WORDS[descriptor.shape] if descriptor.shape is not None else VAGUE_NOUNS
    singular, plural = _pick(rng, nouns)
    words = []
    if descriptor.size is not None:
        words.append(_pick(rng, SIZE_WORDS[descriptor.size]))
    if descriptor.color is not None:
        words.append(_pick(rng, COLOR_WORDS[descriptor.color]))
    words.append(singular if descriptor.count == 1 else plural)
    if descriptor.count == 1:
        return f"{_article(words[0])} {' '.join(words)}"
    return f"{NUMBER_WORDS[descriptor.count]} {' '.join(words)}"


def join_phrases(phrases: Sequence[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    return phrases[0] if len(phrases) == 1 else f"{', '.join(phrases[:-1])} and {phrases[-1]}"


def describe(objects: Sequence[SceneObject], mode: str, with_size: bool) -> tuple[Descriptor, ...]:
    """Group objects into descriptors naming `mode` ("both", "color" or "shape") attributes."""
    counts: dict[tuple[str | None, str | None, str | None], int] = {}
    for obj in objects:
        key = (
            obj.shape if mode in ("both", "shape") else None,
            obj.color if mode in ("both", "color") else None,
            obj.size if with_size else None,
        )
        counts[key] = counts.get(key, 0) + 1
    return tuple(Descriptor(s, c, z, n) for (s, c, z), n in counts.items())


def _sentence(named: tuple[Descriptor, ...], rng: np.random.Generator) -> Caption:
    order = rng.permutation(len(named))
    named = tuple(named[i] for i in order)
    prefix = PREFIXES[rng.integers(len(PREFIXES))]
    return prefix + join_phrases([phrase(d, rng) for d in named]), named


def _full(objects: Sequence[SceneObject], rng: np.random.Generator) -> Caption:
    return _sentence(describe(objects, "both", with_size=rng.random() < 0.2), rng)


def _partial(objects: Sequence[SceneObject], rng: np.random.Generator) -> Caption:
    """A strict subset of the objects (all of them when there is only one)."""
    k = 1 if len(objects) == 1 else int(rng.integers(1, len(objects)))
    chosen = sorted(rng.choice(len(objects), size=k, replace=False))
    mode = ("both", "color", "shape")[rng.choice(3, p=(0.7, 0.15, 0.15))]
    subset = [objects[i] for i in chosen]
    return _sentence(describe(subset, mode, with_size=rng.random() < 0.25), rng)


def _attribute(objects: Sequence[SceneObject], rng: np.random.Generator) -> Caption:
    """All objects sharing one colour or one shape, named by that attribute only."""
    anchor = objects[rng.integers(len(objects))]
    if rng.random() < 0.5:
        subset = [o for o in objects if o.color == anchor.color]
        return _sentence(describe(subset, "color", with_size=False), rng)
    subset = [o for o in objects if o.shape == anchor.shape]
    return _sentence(describe(subset, "shape", with_size=False), rng)


def _relations(objects: Sequence[SceneObject]) -> list[tuple[int, str, int]]:
    """(a, relation, b) for every ordered pair whose centres are clearly apart."""
    found = []
    for a, first in enumerate(objects):
        for b, second in enumerate(objects):
            dx = second.center[0] - first.center[0]
            dy = second.center[1] - first.center[1]
            if a != b and dx >= RELATION_MARGIN:
                found.append((a, "left of", b))
            if a != b and dy >= RELATION_MARGIN:
                found.append((a, "above", b))
    return found + [(b, {"left of": "right of", "above": "below"}[r], a) for a, r, b in found]


def _spatial(objects: Sequence[SceneObject], rng: np.random.Generator) -> Caption:
    """ "a red circle left of a blue box": two distinct objects and their relation."""
    options = _relations(objects)
    a, relation, b = options[rng.integers(len(options))]
    with_size = rng.random() < 0.2
    first = describe([objects[a]], "both", with_size)[0]
    second = describe([objects[b]], "both", with_size)[0]
    text = f"{phrase(first, rng)} {relation} {phrase(second, rng)}"
    return text, (first, second)


def _vague(count: int, rng: np.random.Generator) -> Caption:
    """ "some shapes", "a colourful object": names objects without shape or colour."""
    if count == 1:
        text = ("a shape", "a colourful object", "something colourful", "an object")[
            rng.integers(4)
        ]
        return text, (Descriptor(count=1),)
    if rng.random() < 0.5:
        text = ("some shapes", "a few objects", "various shapes", "colourful shapes")[
            rng.integers(4)
        ]
        return text, (Descriptor(count=2),)
    noun = VAGUE_NOUNS[rng.integers(len(VAGUE_NOUNS))][1]
    return f"{NUMBER_WORDS[count]} {noun}", (Descriptor(count=count),)
