"""The crop experiment (Pishdad et al., sec. 4.6): object A alone vs the union A+B, with captions.

Instead of cutting regions out of the image geometrically, which could leave slivers of other
objects in the part "A alone", each view is re-rendered from the image's scene: the same
background with only A drawn, and with only A and B drawn (in their original drawing order, so
B still occludes A where it did). The content of each view is therefore known exactly, and every
view has the model's input size (64 x 64).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from models.datasets.records import (
    DatasetError,
    Descriptor,
    ImageRecord,
    PairedDataset,
    load_dataset,
)
from models.datasets.shapes import DATASET_NAME, image_index
from models.datasets.shapes_captions import describe, join_phrases, phrase
from models.datasets.shapes_render import Scene, render_scene, sample_scene


@dataclass(frozen=True)
class CropPair:
    """Views and captions of one image: object A alone and the union of A and B."""

    image_id: str
    split: str
    index_a: int  # positions of A and B in the image's object list
    index_b: int
    image_a: Image.Image  # (64, 64) RGB: the background with only A
    image_ab: Image.Image  # the background with only A and B
    caption_a: str  # e.g. "a red circle"
    caption_ab: str  # e.g. "a red circle and a blue square"
    named_a: tuple[Descriptor, ...]
    named_ab: tuple[Descriptor, ...]


def choose_pair(scene: Scene) -> tuple[int, int]:
    """A and B: the first two objects (drawing order) that differ in shape or colour.

    Falls back to the first two objects when all look alike; their union is then named with a
    count ("two red circles").
    """
    objects = scene.objects
    for a in range(len(objects)):
        for b in range(a + 1, len(objects)):
            if (objects[a].shape, objects[a].color) != (objects[b].shape, objects[b].color):
                return a, b
    return 0, 1


def crop_pair(scene: Scene, image: ImageRecord) -> CropPair:
    """The crop views of one scene with at least two objects."""
    a, b = choose_pair(scene)
    named_a = describe([scene.objects[a]], "both", with_size=False)
    named_ab = describe([scene.objects[a], scene.objects[b]], "both", with_size=False)
    return CropPair(
        image_id=image.id,
        split=image.split,
        index_a=a,
        index_b=b,
        image_a=render_scene(scene, keep=(a,)),
        image_ab=render_scene(scene, keep=(a, b)),
        caption_a=phrase(named_a[0]),
        caption_ab=join_phrases([phrase(d) for d in named_ab]),
        named_a=named_a,
        named_ab=named_ab,
    )


def crop_pairs(dataset: PairedDataset | Path | str, split: str | None = None) -> Iterator[CropPair]:
    """One CropPair per image with >= 2 objects of a shapes dataset (optionally one split).

    Scenes are regenerated from the dataset's seed and checked against images.jsonl; a dataset
    that is not the built-in shapes dataset, or that this generator version did not write,
    raises DatasetError.
    """
    if not isinstance(dataset, PairedDataset):
        dataset = load_dataset(dataset)
    if dataset.meta.get("name") != DATASET_NAME or not isinstance(dataset.meta.get("seed"), int):
        raise DatasetError(
            f"{dataset.root}: the crop experiment needs the built-in shapes dataset "
            "(dataset.json with name 'shapes' and an integer seed)"
        )
    seed = dataset.meta["seed"]
    images = dataset.images if split is None else dataset.split(split).images
    for image in images:
        if len(image.objects) < 2:
            continue
        scene = sample_scene(seed, image_index(image.id))
        found = [(o.shape, o.color, o.size) for o in image.objects]
        expected = [(o.shape, o.color, o.size) for o in scene.objects]
        if found != expected:
            raise DatasetError(
                f"{dataset.root}: image {image.id} differs from what the shapes generator draws "
                f"for seed {seed}; regenerate the dataset with this version of probsearch"
            )
        yield crop_pair(scene, image)
