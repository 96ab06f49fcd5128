"""Karpathy-split COCO loader, on a small dataset_coco.json fixture written by the test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.datasets.coco import load_coco_karpathy
from models.datasets.records import DatasetError, is_plausible_match


def entry(imgid: int, cocoid: int, split: str, texts: list[str], first_sentid: int) -> dict:
    """One images[] entry in the layout of Karpathy's dataset_coco.json."""
    folder = "val2014" if split != "train" else "train2014"
    sentences = [
        {"tokens": t.lower().split(), "raw": t, "imgid": imgid, "sentid": first_sentid + k}
        for k, t in enumerate(texts)
    ]
    return {
        "filepath": folder,
        "filename": f"COCO_{folder}_{cocoid:012d}.jpg",
        "imgid": imgid,
        "split": split,
        "sentids": [s["sentid"] for s in sentences],
        "sentences": sentences,
        "cocoid": cocoid,
    }


IMAGES = [
    entry(0, 391895, "test", ["A man riding a bike. ", "A cyclist on a dirt road."], 0),
    entry(1, 522418, "restval", ["A woman cutting a cake."], 2),
    entry(2, 184613, "train", ["A boy holding an umbrella.", "Cows in a field."], 3),
    entry(3, 318219, "val", ["A computer on a desk."], 5),
]


def write_json(path: Path, document) -> Path:
    path.write_text(json.dumps(document))
    return path


@pytest.fixture
def fixture(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "coco"
    root.mkdir()
    return write_json(tmp_path / "dataset_coco.json", {"images": IMAGES, "dataset": "coco"}), root


def test_reads_images_captions_and_splits(fixture: tuple[Path, Path]) -> None:
    json_path, root = fixture
    dataset = load_coco_karpathy(json_path, root)
    assert [im.id for im in dataset.images] == ["391895", "522418", "184613", "318219"]
    assert [im.split for im in dataset.images] == ["test", "train", "train", "val"]
    assert dataset.image("391895").path == root / "val2014" / "COCO_val2014_000000391895.jpg"
    assert dataset.label_names == () and dataset.image("391895").labels == ()
    assert [c.id for c in dataset.captions] == ["0", "1", "2", "3", "4", "5"]
    first = dataset.captions_of("391895")
    assert [c.text for c in first] == ["A man riding a bike.", "A cyclist on a dirt road."]
    assert {c.split for c in first} == {"test"}
    assert dataset.meta["name"] == "coco"


def test_split_filter_maps_restval_to_train(fixture: tuple[Path, Path]) -> None:
    train = load_coco_karpathy(*fixture, split="train")
    assert [im.id for im in train.images] == ["522418", "184613"]
    assert [c.id for c in train.captions] == ["2", "3", "4"]
    assert [im.id for im in load_coco_karpathy(*fixture, split="val").images] == ["318219"]
    with pytest.raises(DatasetError, match="unknown split 'restval'"):
        load_coco_karpathy(*fixture, split="restval")


def test_plausible_match_falls_back_to_own_image(fixture: tuple[Path, Path]) -> None:
    dataset = load_coco_karpathy(*fixture)
    caption = dataset.captions_of("522418")[0]
    assert is_plausible_match(caption, dataset.image("522418"))
    assert not is_plausible_match(caption, dataset.image("391895"))


def test_flickr_style_entry_without_filepath_or_cocoid(tmp_path: Path) -> None:
    flickr = {"filename": "1000092795.jpg", "imgid": 7, "split": "train",
              "sentences": [{"raw": "Two young guys.", "imgid": 7, "sentid": 35}]}  # fmt: skip
    json_path = write_json(tmp_path / "dataset_flickr30k.json", {"images": [flickr]})
    dataset = load_coco_karpathy(json_path, tmp_path)
    assert dataset.images[0].id == "7" and dataset.images[0].path == tmp_path / "1000092795.jpg"


def _broken(mutate) -> list[dict]:
    images = json.loads(json.dumps(IMAGES))
    mutate(images)
    return images


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ({"annotations": []}, "'images' list"),
        ({"images": _broken(lambda ims: ims[1].pop("filename"))},
         "images[1]: missing field 'filename'"),
        ({"images": _broken(lambda ims: ims[2].update(split="dev"))}, "images[2]: split 'dev'"),
        ({"images": _broken(lambda ims: ims[0]["sentences"][1].pop("raw"))},
         "images[0].sentences[1]: missing field 'raw'"),
        ({"images": _broken(lambda ims: ims[3]["sentences"][0].update(raw="  "))}, "empty caption"),
        ({"images": _broken(lambda ims: ims[3]["sentences"][0].update(imgid=0))}, "differs"),
        ({"images": _broken(lambda ims: ims[3].update(cocoid=391895))}, "duplicate image id"),
        ({"images": _broken(lambda ims: ims[3]["sentences"][0].update(sentid=0))},
         "duplicate sentid"),
        ({"images": _broken(lambda ims: ims[0].update(cocoid="391895"))}, "'cocoid'"),
    ],
)  # fmt: skip
def test_malformed_json_raises_dataset_error(tmp_path: Path, document, fragment: str) -> None:
    json_path = write_json(tmp_path / "dataset_coco.json", document)
    with pytest.raises(DatasetError) as info:
        load_coco_karpathy(json_path, tmp_path)
    assert fragment in str(info.value)
    assert str(json_path) in str(info.value)


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_coco_karpathy(tmp_path / "absent.json", tmp_path)
    json_path = write_json(tmp_path / "dataset_coco.json", {"images": IMAGES})
    with pytest.raises(DatasetError, match="image root"):
        load_coco_karpathy(json_path, tmp_path / "no-images")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(DatasetError, match="not valid JSON"):
        load_coco_karpathy(tmp_path / "bad.json", tmp_path)
