"""What the reindex benchmarks time: items through indexer.embed.embed_gallery, as a local
reindex embeds them, in a temporary work dir."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from result_header import ROOT  # noqa: F401  (puts this checkout first on sys.path)

from indexer.embed import Encoder, embed_gallery, load_chunk
from indexer.sources import GalleryItem
from models.onnx import ENCODE_BATCH


def timed_embedding(
    items: Iterable[GalleryItem],
    encoder: Encoder,
    modality: str,
    total: int,
    batch_size: int = ENCODE_BATCH,
    decode_threads: int = 1,
) -> tuple[float, dict[str, np.ndarray]]:
    """Items kept a second, and the run's "mu" and "logvar" (N, D)."""
    with tempfile.TemporaryDirectory() as work_dir:
        start = time.perf_counter()
        summary = embed_gallery(
            items, encoder, modality, Path(work_dir), total=total, batch_size=batch_size,
            progress=False, decode_threads=decode_threads,
        )  # fmt: skip
        took = time.perf_counter() - start
        chunks = [load_chunk(path) for path in summary.chunk_paths]
    arrays = {key: np.concatenate([getattr(c, key) for c in chunks]) for key in ("mu", "logvar")}
    return summary.kept / took, arrays
