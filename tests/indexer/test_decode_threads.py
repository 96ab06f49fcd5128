"""A reindex decodes a batch's images in threads (decode_threads) and embeds exactly what one
decoding thread embeds: the same vectors, records and bad items, in the same order."""

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

import indexer.embed as embed
from indexer.embed import embed_gallery, load_chunk
from indexer.sources import GalleryItem, open_source
from models.onnx.encoder_runtime import OnnxEncoder
from models.threads import ThreadBudget


def gallery_items(small_shapes: Path, tmp_path: Path) -> list[GalleryItem]:
    """The shapes images, a file that is no image, and an id given twice."""
    folder = tmp_path / "photos"
    shutil.copytree(small_shapes / "images", folder)
    (folder / "0_not_an_image.png").write_bytes(b"hello")
    items = list(open_source(folder, "image").items())
    return [*items[:5], items[2], *items[5:]]


def embedded(items: list[GalleryItem], model: Path, work_dir: Path, decode_threads: int):
    encoder = OnnxEncoder(model, "image", "cpu", 16, ThreadBudget(1))
    summary = embed_gallery(
        items, encoder, "image", work_dir, chunk_items=50, batch_size=16, progress=False,
        decode_threads=decode_threads,
    )  # fmt: skip
    chunks = [load_chunk(path) for path in summary.chunk_paths]
    return np.concatenate([c.mu for c in chunks]), [c.records for c in chunks], summary.bad


def test_images_decoded_in_threads_embed_as_one_thread_does(
    small_shapes: Path, random_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = gallery_items(small_shapes, tmp_path)
    mu, records, bad = embedded(items, random_model, tmp_path / "one", 1)
    meeting, lock, calls = threading.Barrier(2, timeout=20), threading.Lock(), []
    decode = embed.decode_image

    def decode_beside_another(data: bytes, **kwargs):
        """The first two decodes wait for each other: one decode at a time breaks the barrier."""
        with lock:
            calls.append(data)
            meet = len(calls) <= 2
        if meet:
            meeting.wait()
        return decode(data, **kwargs)

    monkeypatch.setattr(embed, "decode_image", decode_beside_another)
    threaded = embedded(items, random_model, tmp_path / "threads", 4)
    np.testing.assert_array_equal(threaded[0], mu)
    assert threaded[1] == records
    assert threaded[2] == bad
    assert {b.reason for b in bad} == {"unreadable_image", "duplicate_id"}
    assert len(mu) == len(items) - 2
