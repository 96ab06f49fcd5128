"""A reindex decodes a batch's images in threads (decode_threads locally, a Ray actor's CPUs on
Ray) and embeds exactly what one decoding thread embeds: the same vectors, records and bad
items, in the same order."""

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

import indexer.embed as embed
from indexer.embed import embed_gallery, load_chunk
from indexer.ray_engine import ChunkEmbedder, _item_row
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


@pytest.fixture
def decodes_meet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first two image decodes wait for each other: one decode at a time breaks the
    barrier (BrokenBarrierError after 20 s)."""
    meeting, lock, calls = threading.Barrier(2, timeout=20), threading.Lock(), []
    decode = embed.decode_image

    def decode_beside_another(data: bytes, **kwargs):
        with lock:
            calls.append(data)
            meet = len(calls) <= 2
        if meet:
            meeting.wait()
        return decode(data, **kwargs)

    monkeypatch.setattr(embed, "decode_image", decode_beside_another)


def test_images_decoded_in_threads_embed_as_one_thread_does(
    small_shapes: Path, random_model: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    items = gallery_items(small_shapes, tmp_path)
    mu, records, bad = embedded(items, random_model, tmp_path / "one", 1)
    request.getfixturevalue("decodes_meet")
    threaded = embedded(items, random_model, tmp_path / "threads", 4)
    np.testing.assert_array_equal(threaded[0], mu)
    assert threaded[1] == records
    assert threaded[2] == bad
    assert {b.reason for b in bad} == {"unreadable_image", "duplicate_id"}
    assert len(mu) == len(items) - 2


def test_a_ray_actor_with_two_cpus_decodes_in_two_threads(
    small_shapes: Path, random_model: Path, tmp_path: Path, decodes_meet: None
) -> None:
    """The actor class itself, called in this process as Ray would call it."""
    items = gallery_items(small_shapes, tmp_path)[:40]
    (tmp_path / "work").mkdir()
    actor = ChunkEmbedder(str(random_model), "image", "cpu", 2, str(tmp_path / "work"), 16, 100)
    payload = json.dumps([_item_row(item) for item in items])
    out = actor({"chunk": np.array([0]), "items": np.array([payload])})
    assert out["kept"].tolist() == [len(items) - 2]
