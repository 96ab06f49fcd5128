"""An image's recorded uri is relative to its source's image root (issue 42.4): the image
folder, the dataset dir, or a COCO file's --image-root; the source names that root."""

import json
from pathlib import Path

from indexer.embed import _record
from indexer.sources import open_source


def uris(source) -> list[str]:
    return [_record(item, "image")["uri"] for item in source.items()]


def test_an_image_folder_records_paths_under_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    (folder / "trip").mkdir(parents=True)
    (folder / "a.png").write_bytes(b"x")
    (folder / "trip" / "b.jpg").write_bytes(b"x")
    source = open_source(folder, "image")
    assert source.image_root == folder
    assert uris(source) == ["a.png", "trip/b.jpg"]


def test_a_dataset_dir_records_paths_under_the_dataset(small_shapes: Path) -> None:
    source = open_source(small_shapes, "image")
    assert source.image_root == small_shapes
    recorded = uris(source)
    assert recorded[0] == "images/shapes-000000.png"
    assert all((small_shapes / uri).is_file() for uri in recorded)
    assert open_source(small_shapes, "text").image_root is None


def test_a_coco_file_records_paths_under_its_image_root(tmp_path: Path) -> None:
    images = tmp_path / "coco-images"
    (images / "val2014").mkdir(parents=True)
    (images / "val2014" / "x.jpg").write_bytes(b"x")
    entry = {"filename": "x.jpg", "filepath": "val2014", "split": "val", "cocoid": 7,
             "sentences": [{"raw": "a cat", "sentid": 1}]}  # fmt: skip
    annotations = tmp_path / "meta" / "dataset_coco.json"
    annotations.parent.mkdir()
    annotations.write_text(json.dumps({"images": [entry]}))
    source = open_source(annotations, "image", image_root=images)
    assert source.image_root == images
    assert uris(source) == ["val2014/x.jpg"]
