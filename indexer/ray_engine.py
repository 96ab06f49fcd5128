"""`reindex --engine ray`: the gallery's chunks become a Ray dataset, embedded by a pool of ONNX
Runtime encoder actors into the same chunk files the local path writes (indexer.embed).

The chunking, the reuse of finished chunks, the per-chunk embedding and the chunk format are
indexer.embed's; only who runs embed_chunk changes. Each actor loads the encoder once and
writes every chunk it embeds atomically into the work dir (a shared volume on a cluster), so a
killed run loses at most the chunks in flight. Duplicate ids across chunks (which the local
path catches with its running `seen` set) are resolved afterwards on the driver, in chunk order.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from indexer.embed import (
    DUPLICATE_DETAIL,
    Chunk,
    EmbedSummary,
    batched,
    chunk_path,
    drop_stale_chunks,
    embed_chunk,
    load_chunk,
    reusable_chunk,
    save_chunk,
)
from indexer.report import BadItem
from indexer.sources import GalleryItem
from models.networks.model_config import ModelConfig
from models.onnx import ENCODE_BATCH
from models.threads import ThreadBudget, available_cpus

log = logging.getLogger(__name__)

RAY_MISSING = (
    "--engine ray needs Ray, which is not installed: pip install 'probsearch[ray]'"
    " (in a checkout: pip install -e '.[cpu,ray]'), or use --engine local"
)


class RayEngineError(ValueError):
    """Ray is missing, unreachable, or a Ray worker failed; nothing was published."""


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide the Ray run is.

    address: an existing cluster ("auto", "ray://head:10001", "head:6379"); None starts a
        local Ray runtime for the command and stops it afterwards.
    workers: encoder actors; default one per GPU of the cluster, else one per `threads` CPUs.
    threads: CPUs each actor reserves, so actors x threads never oversubscribe a node: a CPU
        actor's ONNX Runtime intra-op threads, and any actor's image-decoding threads (default
        1: one single-threaded encoder per CPU). A GPU actor also reserves one GPU; its CPUs
        decode the images its encoder then runs on the GPU, which one decoding thread holds
        to about half of what an H100 embeds (benchmarks/results/gpu_encoder_check.md).
    """

    address: str | None = None
    workers: int | None = None
    threads: int = 1


@dataclass(frozen=True)
class ActorPool:
    """The resolved pool: how many actors, each with which resources and device."""

    workers: int
    threads: int
    num_gpus: int
    device: str


def import_ray() -> Any:
    """The ray module (with Ray Data), or RayEngineError naming the extra to install."""
    try:
        import ray
        import ray.data  # Ray Data comes with the ray[data] extra only
    except ImportError:
        raise RayEngineError(RAY_MISSING) from None
    return ray


@contextmanager
def ray_runtime(address: str | None) -> Iterator[Any]:
    """Connect to the cluster at `address`, or start a local runtime sized to this machine's
    CPUs; disconnect (and stop the local runtime) on exit. A runtime the caller already
    started is used as it is and left running. Without `address` the runtime is always a new
    one (address="local"): plain ray.init() would join any Ray cluster already running on
    this machine, which the command did not ask for."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            ray.init(address="local", num_cpus=available_cpus(), include_dashboard=False, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"the Ray cluster at {address}" if address else "a local Ray runtime"
        raise RayEngineError(f"could not start or reach {where}: {e}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def plan_pool(
    resources: dict[str, float], options: RayOptions, device: str, todo: int
) -> ActorPool:
    """Size the actor pool from the cluster's resources (see RayOptions); never more actors
    than chunks to embed."""
    gpus = int(resources.get("GPU", 0))
    if gpus and device != "cpu":
        workers, threads, num_gpus = options.workers or gpus, max(1, options.threads), 1
    elif device == "cuda":
        raise RayEngineError("--device cuda asked for, but the Ray cluster has no GPUs")
    else:
        threads = max(1, options.threads)
        workers = options.workers or max(1, int(resources.get("CPU", 1)) // threads)
        num_gpus, device = 0, "cpu"
    return ActorPool(max(1, min(workers, todo)), threads, num_gpus, device)


class ChunkEmbedder:
    """A Ray actor: loads the encoder once, then embeds and writes the chunks it is given."""

    def __init__(
        self,
        model_dir: str,
        modality: str,
        device: str,
        threads: int,
        work_dir: str,
        batch_size: int,
        max_caption_chars: int,
    ) -> None:
        from models.onnx.encoder_runtime import OnnxEncoder

        self.encoder = OnnxEncoder(
            model_dir,
            modality,
            device,
            batch_size,
            threads=ThreadBudget(threads),  # type: ignore[arg-type]
        )
        self.modality, self.work_dir = modality, Path(work_dir)
        self.batch_size, self.max_caption_chars = batch_size, max_caption_chars
        self.decode_pool = ThreadPoolExecutor(threads) if threads > 1 else None

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        kept, bad = [], []
        for index, payload in zip(batch["chunk"], batch["items"], strict=True):
            items = [_item_from_row(row) for row in json.loads(str(payload))]
            chunk = embed_chunk(
                items, self.encoder, self.modality, set(), self.batch_size,
                self.max_caption_chars, self.decode_pool,
            )  # fmt: skip
            save_chunk(chunk_path(self.work_dir, int(index)), chunk)
            kept.append(len(chunk.records))
            bad.append(len(chunk.bad))
        return {"chunk": batch["chunk"], "kept": np.array(kept), "bad": np.array(bad)}


def embed_gallery_ray(
    items: Iterable[GalleryItem],
    model_dir: Path,
    modality: str,
    work_dir: Path,
    options: RayOptions,
    *,
    device: str = "auto",
    chunk_items: int,
    batch_size: int = ENCODE_BATCH,
    max_caption_chars: int,
    progress: bool = True,
) -> EmbedSummary:
    """embed_gallery's result (indexer.embed), with the chunks that are not reusable embedded
    on Ray; raises RayEngineError when Ray is missing or a worker fails."""
    ray = import_ray()
    work_dir.mkdir(parents=True, exist_ok=True)
    paths, todo, total, reused = [], [], 0, 0
    for index, source_items in enumerate(batched(items, chunk_items)):
        path = chunk_path(work_dir, index)
        paths.append(path)
        total += len(source_items)
        if reusable_chunk(path, source_items) is None:
            todo.append({"chunk": index, "items": json.dumps(list(map(_item_row, source_items)))})
        else:
            reused += 1
    drop_stale_chunks(work_dir, len(paths))
    if todo:
        with ray_runtime(options.address):
            pool = plan_pool(ray.cluster_resources(), options, device, len(todo))
            log.info("embedding %d chunks on %d Ray actors (%s)", len(todo), pool.workers, pool)
            _run_pool(ray, todo, pool, model_dir, modality, work_dir, batch_size,
                      max_caption_chars, progress)  # fmt: skip
    if reused:
        log.info("reused %d of %d embedded chunks from %s", reused, len(paths), work_dir)
    bad, kept = resolve_duplicates(paths)
    return EmbedSummary(paths, total, kept, bad, reused, ModelConfig.load(model_dir).embed_dim)


def _run_pool(
    ray: Any,
    todo: list[dict[str, Any]],
    pool: ActorPool,
    model_dir: Path,
    modality: str,
    work_dir: Path,
    batch_size: int,
    max_caption_chars: int,
    progress: bool,
) -> None:
    """Embed the `todo` chunks with map_batches on the actor pool, one chunk per call."""
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = progress
    context.print_on_execution_start = False
    dataset = ray.data.from_items(todo, override_num_blocks=len(todo))
    embedded = dataset.map_batches(
        ChunkEmbedder,
        batch_size=1,
        compute=ray.data.ActorPoolStrategy(size=pool.workers),
        num_cpus=pool.threads,
        num_gpus=pool.num_gpus,
        fn_constructor_kwargs={
            "model_dir": str(model_dir.resolve()),
            "modality": modality,
            "device": pool.device,
            "threads": pool.threads,
            "work_dir": str(work_dir.resolve()),
            "batch_size": batch_size,
            "max_caption_chars": max_caption_chars,
        },
    )
    try:
        done = sum(1 for _ in embedded.iter_rows())
    except ray.exceptions.RayError as e:
        raise RayEngineError(f"embedding on Ray failed: {_root_cause(e)}") from None
    if done != len(todo):
        raise RayEngineError(f"Ray embedded {done} of {len(todo)} chunks; nothing was published")


def resolve_duplicates(paths: list[Path]) -> tuple[list[BadItem], int]:
    """Drop, in chunk order, kept rows whose id an earlier chunk kept (as the local path's
    `seen` set does), rewriting the chunks that change; returns (bad items, kept count)."""
    seen: set[str] = set()
    bad: list[BadItem] = []
    kept = 0
    for path in paths:
        chunk = load_chunk(path)
        repeated = [row for row, record in enumerate(chunk.records) if record["id"] in seen]
        if repeated:
            chunk = _drop_rows(chunk, repeated)
            save_chunk(path, chunk)
        seen.update(record["id"] for record in chunk.records)
        bad.extend(chunk.bad)
        kept += len(chunk.records)
    return bad, kept


def _drop_rows(chunk: Chunk, rows: list[int]) -> Chunk:
    """The chunk without kept `rows`, which become duplicate_id bad items in source order."""
    keep = np.ones(len(chunk.records), bool)
    keep[rows] = False
    record_at, bad_at = _source_positions(chunk)
    dropped = [
        (record_at[row], BadItem(chunk.records[row]["id"], "duplicate_id", DUPLICATE_DETAIL))
        for row in rows
    ]
    bad = sorted([*zip(bad_at, chunk.bad, strict=True), *dropped], key=lambda pair: pair[0])
    return replace(
        chunk,
        mu=chunk.mu[keep],
        logvar=chunk.logvar[keep],
        records=[r for r, k in zip(chunk.records, keep, strict=True) if k],
        bad=[item for _, item in bad],
        embeddings=None if chunk.embeddings is None else chunk.embeddings[keep],
        novelty=None if chunk.novelty is None else chunk.novelty[keep],
    )


def _source_positions(chunk: Chunk) -> tuple[list[int], list[int]]:
    """Positions among the chunk's source items of its kept records and of its bad items.

    Each source item became one or the other, in order. When the next of both has the item's
    id, the record came first if that bad item is a duplicate of it (embed_chunk keeps the
    first usable item of an id and marks later ones duplicate_id).
    """
    record_at: list[int] = []
    bad_at: list[int] = []
    for position, item_id in enumerate(chunk.source_ids):
        r, b = len(record_at), len(bad_at)
        is_record = r < len(chunk.records) and chunk.records[r]["id"] == item_id
        is_bad = b < len(chunk.bad) and chunk.bad[b].id == item_id
        if is_record and (not is_bad or chunk.bad[b].reason == "duplicate_id"):
            record_at.append(position)
        else:
            bad_at.append(position)
    return record_at, bad_at


def _item_row(item: GalleryItem) -> dict[str, Any]:
    path = None if item.path is None else str(item.path)
    return {"id": item.id, "text": item.text, "path": path, "extra": item.extra,
            "problem": item.problem, "uri": item.uri}  # fmt: skip


def _item_from_row(row: dict[str, Any]) -> GalleryItem:
    path = None if row["path"] is None else Path(row["path"])
    return GalleryItem(row["id"], row["text"], path, row["extra"], row["problem"], row.get("uri"))


def _root_cause(error: BaseException) -> str:
    """The innermost exception's message: a worker's own error, not Ray's wrapping."""
    while error.__cause__ is not None:
        error = error.__cause__
    cause = getattr(error, "cause", None)
    return str(cause if cause is not None else error).strip().splitlines()[-1]
