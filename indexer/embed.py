"""Batched, resumable embedding of a gallery stream into chunk files on disk.

The stream is cut into chunks of a fixed number of source items. Each finished chunk is written
atomically as `chunk-NNNNNN.npz` (mu, logvar, kept records, skipped items, source ids) in a work
dir; a rerun after a crash reuses every chunk whose source ids still match and embeds the rest.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from PIL import Image
from tqdm import tqdm

from indexer.report import BadItem
from indexer.sources import GalleryItem
from models.networks.preprocess import DEFAULT_MAX_PIXELS, InvalidImageError, decode_image
from models.onnx import ENCODE_BATCH

log = logging.getLogger(__name__)

CHUNK_ITEMS = 4096
MAX_CAPTION_CHARS = 1000
DUPLICATE_DETAIL = "an earlier item has the same id; kept the first"


class Encoder(Protocol):
    """What the embedder needs from models.onnx.encoder_runtime.OnnxEncoder."""

    embed_dim: int

    def encode_texts(self, texts: Sequence[str]) -> Any: ...

    def encode_images(self, images: Sequence[Image.Image]) -> Any: ...


@dataclass
class Chunk:
    """One embedded chunk: mu, logvar (n, D) float32 of the kept items and their records."""

    mu: np.ndarray
    logvar: np.ndarray
    records: list[dict[str, Any]]  # {"id", "text" | "uri", "extra"} per kept row
    bad: list[BadItem]
    source_ids: list[str]  # ids of every source item of the chunk, kept or not
    embeddings: np.ndarray | None = None  # (n, K, D) of a pvse encoder, else None
    novelty: np.ndarray | None = None  # (n,) of an image encoder on a pretrained backbone


@dataclass(frozen=True)
class EmbedSummary:
    """What embedding produced: the chunk files in order, and how many were reused."""

    chunk_paths: list[Path]
    total: int
    kept: int
    bad: list[BadItem]
    reused_chunks: int
    dim: int


def chunk_path(work_dir: Path, index: int) -> Path:
    """Path of chunk `index` in the work dir."""
    return work_dir / f"chunk-{index:06d}.npz"


def save_chunk(path: Path, chunk: Chunk) -> None:
    """Write a chunk atomically (temp file + fsync + rename)."""
    meta = {
        "records": chunk.records,
        "bad": [asdict(b) for b in chunk.bad],
        "source_ids": chunk.source_ids,
    }
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        optional = {
            name: array
            for name, array in (("embeddings", chunk.embeddings), ("novelty", chunk.novelty))
            if array is not None
        }
        np.savez(f, mu=chunk.mu, logvar=chunk.logvar, meta=np.array(json.dumps(meta)), **optional)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_chunk(path: Path) -> Chunk:
    """Read a chunk written by save_chunk."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        return Chunk(
            mu=data["mu"],
            logvar=data["logvar"],
            records=meta["records"],
            bad=[BadItem(**b) for b in meta["bad"]],
            source_ids=meta["source_ids"],
            embeddings=data["embeddings"] if "embeddings" in data.files else None,
            novelty=data["novelty"] if "novelty" in data.files else None,
        )


def batched(items: Iterable[GalleryItem], size: int) -> Iterator[list[GalleryItem]]:
    """Consecutive lists of `size` items (the last may be shorter): the chunks and batches."""
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def embed_gallery(
    items: Iterable[GalleryItem],
    encoder: Encoder,
    modality: str,
    work_dir: Path,
    *,
    total: int | None = None,
    chunk_items: int = CHUNK_ITEMS,
    batch_size: int = ENCODE_BATCH,
    max_caption_chars: int = MAX_CAPTION_CHARS,
    progress: bool = True,
    decode_threads: int = 1,
) -> EmbedSummary:
    """Embed every item into chunk files under `work_dir`, reusing matching finished chunks;
    images are decoded `decode_threads` at a time."""
    work_dir.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    paths: list[Path] = []
    bad: list[BadItem] = []
    kept = reused = count = 0
    bar = tqdm(total=total, unit="item", desc=f"embedding {modality}", disable=not progress)
    decoding = ThreadPoolExecutor(decode_threads) if decode_threads > 1 else None
    with decoding or contextlib.nullcontext():
        for index, source_items in enumerate(batched(items, chunk_items)):
            path = chunk_path(work_dir, index)
            chunk = reusable_chunk(path, source_items)
            if chunk is None:
                chunk = embed_chunk(
                    source_items, encoder, modality, seen, batch_size, max_caption_chars,
                    decoding,
                )  # fmt: skip
                save_chunk(path, chunk)
            else:
                reused += 1
            seen.update(r["id"] for r in chunk.records)
            paths.append(path)
            bad.extend(chunk.bad)
            kept += len(chunk.records)
            count += len(source_items)
            bar.update(len(source_items))
    bar.close()
    drop_stale_chunks(work_dir, len(paths))
    if reused:
        log.info("reused %d of %d embedded chunks from %s", reused, len(paths), work_dir)
    return EmbedSummary(paths, count, kept, bad, reused, encoder.embed_dim)


def reusable_chunk(path: Path, source_items: list[GalleryItem]) -> Chunk | None:
    """The chunk on disk if it was made from exactly these source items, else None."""
    if not path.is_file():
        return None
    try:
        chunk = load_chunk(path)
    except (OSError, ValueError, KeyError) as e:  # a torn or foreign file: embed again
        log.warning("ignoring unreadable chunk %s (%s)", path, e)
        return None
    return chunk if chunk.source_ids == [item.id for item in source_items] else None


def drop_stale_chunks(work_dir: Path, count: int) -> None:
    """Remove chunk files past the end of the stream (left by a longer, older source)."""
    for path in work_dir.glob("chunk-*.npz"):
        if int(path.stem.split("-")[1]) >= count:
            path.unlink()


def embed_chunk(
    source_items: list[GalleryItem],
    encoder: Encoder,
    modality: str,
    seen: set[str],
    batch_size: int,
    max_caption_chars: int,
    decode_pool: Executor | None = None,
) -> Chunk:
    """Validate, load and embed one chunk's items in batches of `batch_size`, decoding a
    batch's images in `decode_pool`'s threads when one is given."""
    dim = encoder.embed_dim
    mus, logvars, records, bad = [], [], [], []
    multi: list[np.ndarray] = []  # pvse: (n, K, D) per batch
    novelty: list[np.ndarray] = []  # images on a pretrained backbone: (n,) per batch
    chunk_ids: set[str] = set()
    for batch in batched(source_items, batch_size):
        inputs, batch_records = [], []
        for item, load in zip(batch, _loads(batch, modality, decode_pool), strict=True):
            duplicate = item.id in seen or item.id in chunk_ids
            problem = _screen(item, duplicate, max_caption_chars)
            loaded = None
            if problem is None:
                loaded, problem = load()
            if problem is not None:
                bad.append(problem)
                continue
            chunk_ids.add(item.id)
            inputs.append(loaded)
            batch_records.append(_record(item, modality))
        if inputs:
            out = (
                encoder.encode_images(inputs)
                if modality == "image"
                else encoder.encode_texts(inputs)
            )
            mus.append(np.asarray(out.mu, np.float32))  # (n, D)
            logvars.append(np.asarray(out.logvar, np.float32))
            if getattr(out, "embeddings", None) is not None:
                multi.append(np.asarray(out.embeddings, np.float32))
            if getattr(out, "novelty", None) is not None:
                novelty.append(np.asarray(out.novelty, np.float32))
            records.extend(batch_records)
    empty = np.zeros((0, dim), np.float32)
    return Chunk(
        mu=np.concatenate(mus) if mus else empty,
        logvar=np.concatenate(logvars) if logvars else empty,
        records=records,
        bad=bad,
        source_ids=[item.id for item in source_items],
        embeddings=np.concatenate(multi) if multi else None,
        novelty=np.concatenate(novelty) if novelty else None,
    )


def _screen(item: GalleryItem, duplicate: bool, max_caption_chars: int) -> BadItem | None:
    """Problems visible without opening any file."""
    if item.problem is not None:
        return BadItem(item.id, "malformed_record", item.problem)
    if duplicate:
        return BadItem(item.id, "duplicate_id", DUPLICATE_DETAIL)
    if item.text is not None:
        if not item.text.strip():
            return BadItem(item.id, "empty_caption", "caption is empty or whitespace")
        if len(item.text) > max_caption_chars:
            return BadItem(
                item.id,
                "caption_too_long",
                f"{len(item.text)} characters; the limit is {max_caption_chars}",
            )
    return None


def _loads(
    batch: list[GalleryItem], modality: str, pool: Executor | None
) -> list[Callable[[], tuple[Any, BadItem | None]]]:
    """Each item's _load, to call in order: decoded at once in `pool` for well-formed image
    records with a file (PIL and zlib let go of the GIL while they decode), else when called."""
    if pool is None or modality != "image":
        return [functools.partial(_load, item, modality) for item in batch]
    futures = [
        pool.submit(_load, item, modality) if item.path and item.problem is None else None
        for item in batch
    ]
    return [
        future.result if future else functools.partial(_load, item, modality)
        for item, future in zip(batch, futures, strict=True)
    ]


def _load(item: GalleryItem, modality: str) -> tuple[Any, BadItem | None]:
    """The encoder input of an item (its text, or its decoded image), or why it is unusable."""
    if modality == "text":
        return item.text, None
    if item.path is None:
        return None, BadItem(item.id, "malformed_record", "image item without a file path")
    try:
        return decode_image(item.path.read_bytes(), max_pixels=DEFAULT_MAX_PIXELS), None
    except (OSError, InvalidImageError) as e:
        return None, BadItem(item.id, "unreadable_image", f"{item.path}: {e}")


def _record(item: GalleryItem, modality: str) -> dict[str, Any]:
    record: dict[str, Any] = {"id": item.id, "extra": item.extra}
    if modality == "text":
        record["text"] = item.text
    else:
        # relative to the source's image root (indexer.sources); str(path) only for an item a
        # caller built without one
        record["uri"] = item.uri if item.uri is not None else str(item.path)
    return record
