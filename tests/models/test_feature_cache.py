"""Backbone features are computed once per split and read back while the split is unchanged."""

import hashlib
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from models.backbones.feature_cache import FEATURES_DIR, split_features, weights_fingerprint
from models.datasets.records import load_dataset


class CountingEncoder:
    """A stand-in backbone: a caption's vector is its length and vowel count; an image's is
    its mean pixel per channel. Counts the items it encodes."""

    def __init__(self) -> None:
        self.seen = 0
        self.batches: list[list] = []

    def __call__(self, batch) -> torch.Tensor:
        self.seen += len(batch)
        self.batches.append(list(batch))
        if isinstance(batch[0], str):
            return torch.tensor(
                [[len(t), sum(c in "aeiou" for c in t)] for t in batch], dtype=torch.float32
            )
        return torch.tensor(np.stack([np.asarray(i, np.float32).mean(axis=(0, 1)) for i in batch]))


@pytest.fixture
def dataset_dir(shapes_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(shapes_dir, tmp_path / "shapes"))


def test_features_are_computed_once_then_read_back(dataset_dir: Path) -> None:
    dataset, encoder = load_dataset(dataset_dir), CountingEncoder()
    ids, first = split_features(dataset, "val", "text", "counting-1", encoder, batch_size=7)
    assert encoder.seen == len(ids) == len(dataset.split("val").captions) > 0
    assert ids == [c.id for c in dataset.split("val").captions]
    assert first.shape == (len(ids), 2) and first.dtype == np.float32
    captions = dataset.split("val").captions  # each row is its own caption's, in the split's order
    expected = [[len(c.text), sum(ch in "aeiou" for ch in c.text)] for c in captions]
    np.testing.assert_array_equal(first, expected)
    lengths = [len(text) for batch in encoder.batches for text in batch]
    assert lengths == sorted(lengths)  # encoded shortest first: little padding per batch
    again_ids, again = split_features(dataset, "val", "text", "counting-1", encoder)
    assert encoder.seen == len(ids) and again_ids == ids
    np.testing.assert_array_equal(again, first)
    images, pixels = split_features(dataset, "test", "image", "counting-1", encoder, batch_size=16)
    assert pixels.shape == (len(images), 3) and encoder.seen == len(ids) + len(images)


def test_another_backbone_or_changed_items_or_a_broken_file_are_computed_again(
    dataset_dir: Path,
) -> None:
    dataset, encoder = load_dataset(dataset_dir), CountingEncoder()
    ids, _ = split_features(dataset, "val", "text", "counting-1", encoder)
    split_features(dataset, "val", "text", "counting-2", encoder)
    assert encoder.seen == 2 * len(ids)
    fewer = load_dataset(dataset_dir)
    fewer.captions.remove(fewer.split("val").captions[0])
    kept, _ = split_features(fewer, "val", "text", "counting-1", encoder)
    assert kept == ids[1:] and encoder.seen == 3 * len(ids) - 1
    cache = dataset_dir / FEATURES_DIR / "counting-1" / "val-text.npz"
    cache.write_bytes(b"not a numpy file")
    split_features(fewer, "val", "text", "counting-1", encoder)
    assert encoder.seen == 4 * len(ids) - 2
    assert not list(cache.parent.glob(".*.tmp"))


class MeetingEncoder(CountingEncoder):
    """A CountingEncoder whose first batch takes a while and must run alone (as a backbone's
    export would), and whose second and third batches wait for each other: they can only both
    finish when two threads encode at once (else the barrier breaks after its timeout)."""

    def __init__(self) -> None:
        super().__init__()
        self.barrier = threading.Barrier(2, timeout=20)
        self.threads: set[int] = set()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.first_alone = True

    def __call__(self, batch) -> torch.Tensor:
        with self.lock:
            self.threads.add(threading.get_ident())
            number = len(self.batches)
            self.in_flight += 1
            out = super().__call__(batch)
        if number == 0:
            time.sleep(0.3)
            self.first_alone = self.in_flight == 1
        if number in (1, 2):
            self.barrier.wait()
        with self.lock:
            self.in_flight -= 1
        return out


def test_workers_encode_batches_at_once_and_give_the_same_features(
    dataset_dir: Path, tmp_path: Path
) -> None:
    alone, together = CountingEncoder(), MeetingEncoder()
    dataset = load_dataset(dataset_dir)
    ids, one = split_features(dataset, "val", "text", "one", alone, batch_size=5)
    same_ids, two = split_features(dataset, "val", "text", "two", together, 5, workers=2)
    assert same_ids == ids and len(together.threads) >= 2 and together.first_alone
    np.testing.assert_array_equal(two, one)
    assert sorted(map(tuple, together.batches)) == sorted(map(tuple, alone.batches))
    ids, pixels = split_features(dataset, "test", "image", "one", alone, batch_size=4)
    same_ids, pixels_two = split_features(dataset, "test", "image", "two", MeetingEncoder(), 4, 2)
    assert same_ids == ids
    np.testing.assert_array_equal(pixels_two, pixels)


def test_the_weights_fingerprint_is_the_files_sha256(tmp_path: Path) -> None:
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"abc" * 1_000_000)
    assert weights_fingerprint(weights) == hashlib.sha256(weights.read_bytes()).hexdigest()[:12]
