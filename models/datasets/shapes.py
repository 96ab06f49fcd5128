"""The built-in shapes dataset: writes a seeded, byte-reproducible dataset directory."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from tqdm import tqdm

from models.datasets.records import (
    CAPTIONS_FILE,
    DATASET_FILE,
    FORMAT_VERSION,
    IMAGES_FILE,
    SPLITS,
    CaptionRecord,
    DatasetError,
    caption_to_json,
)
from models.datasets.shapes_captions import CAPTIONS_PER_IMAGE, make_captions
from models.datasets.shapes_render import (
    COLORS,
    IMAGE_SIZE,
    SHAPES,
    SIZES,
    object_bbox,
    render_scene,
    sample_scene,
    scene_rng,
)

DATASET_NAME = "shapes"
IMAGE_PREFIX = "shapes-"
VAL_FRACTION = TEST_FRACTION = 0.1  # the rest is train
SPLIT_STREAM = 3  # scene_rng(seed, 0, 3) permutes images into splits (streams 0-2 are per image)
PARALLEL_MIN_IMAGES = 256  # below this, worker start-up costs more than it saves


def label_names() -> tuple[str, ...]:
    """Every "<colour> <shape>" class, in a fixed order (the multi-hot label space)."""
    return tuple(f"{color} {shape}" for color in COLORS for shape in SHAPES)


def image_id(index: int) -> str:
    """Id of the image with this index, e.g. "shapes-000042"."""
    return f"{IMAGE_PREFIX}{index:06d}"


def image_index(image_id_: str) -> int:
    """Inverse of image_id; DatasetError for an id the generator does not write."""
    digits = image_id_.removeprefix(IMAGE_PREFIX)
    if not image_id_.startswith(IMAGE_PREFIX) or not digits.isdigit():
        raise DatasetError(f"{image_id_!r} is not a shapes image id (expected shapes-NNNNNN)")
    return int(digits)


def assign_splits(num_images: int, seed: int) -> list[str]:
    """Split of each image: 10% val, 10% test (at least one each from 3 images), rest train."""
    n_val = round(num_images * VAL_FRACTION)
    n_test = round(num_images * TEST_FRACTION)
    if num_images >= 3:
        n_val, n_test = max(n_val, 1), max(n_test, 1)
    order = scene_rng(seed, 0, SPLIT_STREAM).permutation(num_images)
    splits = ["train"] * num_images
    for position, index in enumerate(order[: n_val + n_test]):
        splits[int(index)] = "val" if position < n_val else "test"
    return splits


def build_image(out: Path, seed: int, index: int, split: str) -> tuple[dict, list[dict]]:
    """Render image `index`, write its PNG under out/images, return its JSON records."""
    scene = sample_scene(seed, index)
    iid = image_id(index)
    file = f"images/{iid}.png"
    render_scene(scene).save(out / file, format="PNG")
    objects = [
        {
            "shape": o.shape,
            "color": o.color,
            "size": o.size,
            "bbox": list(object_bbox(o)),
            "center": [round(o.center[0], 3), round(o.center[1], 3)],
            "radius": round(o.radius, 3),
            "rotation": round(o.rotation, 3),
            "visible": round(visible, 3),
        }
        for o, visible in zip(scene.objects, scene.visible, strict=True)
    ]
    present = {f"{o.color} {o.shape}" for o in scene.objects}
    labels = [name for name in label_names() if name in present]
    image = {"id": iid, "file": file, "split": split, "labels": labels, "objects": objects}
    image.update(index=index, background=scene.background.kind)
    captions = [
        caption_to_json(CaptionRecord(f"{iid}-{k}", iid, text, split, named))
        for k, (text, named) in enumerate(make_captions(scene.objects, scene_rng(seed, index, 2)))
    ]
    return image, captions


def _build_task(task: tuple[str, int, int, str]) -> tuple[dict, list[dict]]:
    out, seed, index, split = task
    return build_image(Path(out), seed, index, split)


def _default_workers() -> int:
    cores = (
        os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    )
    return max(1, len(cores))


def _built(tasks: list[tuple[str, int, int, str]], workers: int) -> Iterator[tuple[dict, list]]:
    """Results in index order; worker processes only change speed, never the output."""
    if workers <= 1 or len(tasks) < PARALLEL_MIN_IMAGES:
        yield from map(_build_task, tasks)
        return
    # spawn, not fork: the parent may hold threads (torch, tqdm) that fork would copy mid-state.
    # An executor, not a Pool: a worker that dies raises BrokenProcessPool instead of hanging.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as executor:
        yield from executor.map(_build_task, tasks, chunksize=64)


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise DatasetError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise DatasetError(
                f"{out} is not empty; choose an empty or new directory, or overwrite the "
                "dataset in it (--overwrite)"
            )
        for name in (DATASET_FILE, IMAGES_FILE, CAPTIONS_FILE):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / "images", ignore_errors=True)
    (out / "images").mkdir(parents=True, exist_ok=True)


def generate_shapes(
    out: Path | str,
    num_images: int,
    seed: int = 0,
    *,
    workers: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Write the shapes dataset (docs/data-format.md) to `out` and return its path.

    The bytes written depend only on (num_images, seed), not on `workers`. Refuses a non-empty
    `out` unless `overwrite` (which replaces the dataset files there and nothing else).
    """
    if num_images < 1:
        raise DatasetError(f"number of images must be at least 1, got {num_images}")
    if seed < 0:
        raise DatasetError(f"seed must be a non-negative integer, got {seed}")
    out = Path(out)
    _prepare_out(out, overwrite)
    splits = assign_splits(num_images, seed)
    tasks = [(str(out), seed, i, split) for i, split in enumerate(splits)]
    results = _built(tasks, workers if workers is not None else _default_workers())
    with (
        (out / IMAGES_FILE).open("w", encoding="utf-8") as images_f,
        (out / CAPTIONS_FILE).open("w", encoding="utf-8") as captions_f,
    ):
        bar = tqdm(results, total=num_images, desc="shapes", unit="img", disable=not progress)
        for image, captions in bar:
            images_f.write(json.dumps(image, separators=(",", ":")) + "\n")
            captions_f.writelines(json.dumps(c, separators=(",", ":")) + "\n" for c in captions)
    meta = _dataset_meta(num_images, seed, splits)
    (out / DATASET_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


def _dataset_meta(num_images: int, seed: int, splits: list[str]) -> dict[str, Any]:
    """dataset.json; written last, so a dataset interrupted mid-way fails to load."""
    return {
        "name": DATASET_NAME,
        "version": FORMAT_VERSION,
        "label_names": list(label_names()),
        "seed": seed,
        "num_images": num_images,
        "image_size": IMAGE_SIZE,
        "captions_per_image": CAPTIONS_PER_IMAGE,
        "splits": {name: splits.count(name) for name in SPLITS},
        "vocabulary": {"colors": list(COLORS), "shapes": list(SHAPES), "sizes": list(SIZES)},
    }
