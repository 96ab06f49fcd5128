"""The built-in shapes dataset: reproducibility, content, captions, splits and the CLI."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from models.datasets import shapes
from models.datasets.cli import app
from models.datasets.records import (
    DatasetError,
    PairedDataset,
    is_plausible_match,
    load_dataset,
    plausible_match_matrix,
)
from models.datasets.shapes import generate_shapes, image_id, image_index, label_names
from models.datasets.shapes_captions import COLOR_WORDS, NUMBER_WORDS, SHAPE_WORDS
from models.datasets.shapes_render import (
    COLORS,
    MIN_VISIBLE,
    coverage,
    render_background,
    render_scene,
    sample_scene,
)

NUM_IMAGES = 60
SEED = 3


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under root, by relative path."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_shapes(tmp_path_factory.mktemp("shapes"), NUM_IMAGES, SEED, workers=1)


@pytest.fixture(scope="module")
def dataset(generated: Path) -> PairedDataset:
    return load_dataset(generated)


def test_same_seed_same_bytes_whatever_the_worker_count(
    generated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shapes, "PARALLEL_MIN_IMAGES", 1)  # use worker processes even for 60
    again = generate_shapes(tmp_path / "again", NUM_IMAGES, SEED, workers=2, progress=False)
    expected = tree_hashes(generated)
    assert len(expected) == NUM_IMAGES + 3
    assert tree_hashes(again) == expected


def test_different_seed_different_bytes(generated: Path, tmp_path: Path) -> None:
    other = tree_hashes(generate_shapes(tmp_path, NUM_IMAGES, SEED + 1, progress=False))
    same = tree_hashes(generated)
    differing = [name for name in same if name.endswith(".png") and other[name] != same[name]]
    assert len(differing) == NUM_IMAGES
    assert other["captions.jsonl"] != same["captions.jsonl"]


def test_files_and_meta(generated: Path, dataset: PairedDataset) -> None:
    meta = json.loads((generated / "dataset.json").read_text())
    assert meta["name"] == "shapes" and meta["seed"] == SEED and meta["version"] == 1
    assert dataset.label_names == label_names() and len(label_names()) == 30
    assert [im.id for im in dataset.images] == [image_id(i) for i in range(NUM_IMAGES)]
    assert image_index(image_id(1234)) == 1234
    with Image.open(dataset.images[0].path) as png:
        assert png.mode == "RGB" and png.size == (64, 64)


def test_objects_captions_and_labels(dataset: PairedDataset) -> None:
    for image in dataset.images:
        assert 1 <= len(image.objects) <= 4
        assert len(dataset.captions_of(image.id)) == 5
        present = {f"{o.color} {o.shape}" for o in image.objects}
        assert set(image.labels) == present
    counts = {len(im.objects) for im in dataset.images}
    assert counts == {1, 2, 3, 4}


def test_splits_are_80_10_10_and_captions_follow_their_image(dataset: PairedDataset) -> None:
    sizes = {name: len(dataset.split(name).images) for name in ("train", "val", "test")}
    assert sizes == {"train": 48, "val": 6, "test": 6}
    for caption in dataset.captions:
        assert caption.split == dataset.image(caption.image_id).split
    assert shapes.assign_splits(3, 0).count("train") == 1  # tiny datasets still get val and test


def test_every_caption_plausibly_matches_its_own_image(dataset: PairedDataset) -> None:
    for caption in dataset.captions:
        assert caption.named, caption.text
        assert is_plausible_match(caption, dataset.image(caption.image_id)), caption.text
    matrix = plausible_match_matrix(dataset.captions, dataset.images)
    rows = {im.id: j for j, im in enumerate(dataset.images)}
    assert all(matrix[i, rows[c.image_id]] for i, c in enumerate(dataset.captions))
    assert 0.02 < matrix.mean() < 0.6  # ambiguity exists, but captions are not all vague


def _words(options) -> list[str]:
    return [w for option in options for w in (option if isinstance(option, tuple) else (option,))]


def _mentions(text: str, words: list[str]) -> bool:
    return any(re.search(rf"\b{re.escape(w)}\b", text) for w in words)


def test_caption_text_names_exactly_its_descriptors(dataset: PairedDataset) -> None:
    for caption in dataset.captions:
        colors = {d.color for d in caption.named}
        shape_names = {d.shape for d in caption.named}
        for color, words in COLOR_WORDS.items():
            assert _mentions(caption.text, list(words)) == (color in colors), caption.text
        for shape, words in SHAPE_WORDS.items():
            assert _mentions(caption.text, _words(words)) == (shape in shape_names), caption.text
        for d in caption.named:
            if d.count > 1 and (d.shape or d.color):  # vague ones may say "some shapes"
                assert NUMBER_WORDS[d.count] in caption.text.split(), caption.text


def test_captions_cover_every_kind(dataset: PairedDataset) -> None:
    texts = [c.text for c in dataset.captions]
    named = [c.named for c in dataset.captions]
    assert any(re.search(r"\b(left of|right of|above|below)\b", t) for t in texts)
    assert any(all(d.shape is None and d.color is None for d in n) for n in named)  # vague
    assert any(len(n) < len(set(dataset.image(c.image_id).objects)) for c, n in
               zip(dataset.captions, named, strict=True))  # partial  # fmt: skip
    assert any(d.count >= 2 for n in named for d in n)  # counts
    synonyms = ["box", "ball", "round shape", "crimson", "rhombus", "violet", "golden"]
    assert sum(_mentions(t, synonyms) for t in texts) >= 10


def test_objects_stay_visible_and_backgrounds_are_never_object_coloured() -> None:
    for index in range(150):
        scene = sample_scene(11, index)
        pixels = np.asarray(render_scene(scene), dtype=np.float32)  # (H, W, 3)
        assert all(v >= MIN_VISIBLE for v in scene.visible)
        for obj in scene.objects:
            inside = coverage(obj) > 0.99  # (H, W)
            close = np.abs(pixels - np.array(COLORS[obj.color])).max(axis=-1) <= 2  # (H, W)
            assert (inside & close).sum() >= 0.5 * MIN_VISIBLE * inside.sum()
        background = render_background(scene.background)  # (H, W, 3)
        chroma = background.max(axis=-1) - background.min(axis=-1)
        assert chroma.max() <= 40.0
    assert min(max(rgb) - min(rgb) for rgb in COLORS.values()) >= 120


def test_refuses_non_empty_directory_unless_overwrite(tmp_path: Path, generated: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(DatasetError, match="not empty"):
        generate_shapes(tmp_path, 5, progress=False)
    generate_shapes(tmp_path, NUM_IMAGES, SEED, overwrite=True, progress=False)
    hashes = tree_hashes(tmp_path)
    assert hashes.pop("notes.txt")
    assert hashes == tree_hashes(generated)
    with pytest.raises(DatasetError, match="at least 1"):
        generate_shapes(tmp_path / "new", 0)


runner = CliRunner()


def test_cli_writes_a_loadable_dataset(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    result = runner.invoke(app, ["shapes", "--out", str(out), "--images", "12", "--seed", "5"])
    assert result.exit_code == 0, result.output
    assert "wrote 12 images" in result.stdout
    assert len(load_dataset(out).images) == 12
    check = runner.invoke(app, ["check", str(out)])
    assert check.exit_code == 0 and "train" in check.stdout


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["shapes", "--out", "{tmp}/x", "--images", "0"], 2, "--images"),
        (["shapes", "--out", "{tmp}/x", "--images", "3", "--seed", "-1"], 2, "--seed"),
        (["shapes", "--images", "3"], 2, "--out"),
        (["shapes", "--out", "{tmp}", "--images", "3"], 1, "not empty"),
        (["check", "{tmp}/absent"], 1, "does not exist"),
        (["check", "{tmp}"], 1, "dataset.json is missing"),
    ],
)
def test_cli_bad_arguments(tmp_path: Path, args: list[str], code: int, fragment: str) -> None:
    (tmp_path / "occupied.txt").write_text("x")
    result = runner.invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert result.exit_code == code
    assert fragment in result.stderr
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
