"""A reindex job end to end: embed -> build in a temp dir -> verify -> atomic rename -> activate.

Nothing becomes visible before the final os.rename, and activation happens only after it, so
Ctrl-C or a crash at any point leaves the active version untouched. Embedded chunks stay in
<root>/<modality>/.work/<key>/ until a version is published, so a rerun resumes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from indexer.build import (
    COMPRESSED_TYPES,
    INDEX_TYPES,
    IndexBuildError,
    default_memory_budget,
)
from indexer.calibration_inheritance import (
    InheritedCalibration,
    active_manifest,
    familiarity_gate,
    inherit_calibration,
)
from indexer.embed import CHUNK_ITEMS, MAX_CAPTION_CHARS, EmbedSummary, embed_gallery, load_chunk
from indexer.job_owner import mark_owner, release_owner, remove_debris
from indexer.manifest import (
    Calibration,
    Manifest,
    checksum_dir,
    read_manifest,
    verify_checksums,
    write_manifest,
)
from indexer.milvus_store import MilvusBackend
from indexer.milvus_writer import write_version_dir
from indexer.multivector import write_multivector
from indexer.ray_engine import RayOptions
from indexer.registry import ActiveRegistry
from indexer.report import build_report, check_bad_fraction, write_report
from indexer.shortlist_backends import make_backend
from indexer.sources import GallerySource, open_source
from indexer.store import REPORT_NAME, open_version
from indexer.version_writer import (
    families_for,
    served_metrics,
    write_arrays_and_metadata,
    write_novelty,
    write_version_indexes,
)
from models.distance.gaussian import METRICS, check_metric
from models.networks.model_config import ModelConfig, model_fingerprint
from models.onnx import ENCODE_BATCH
from models.scoring.item_familiarity import ItemGate
from models.scoring.uncertainty import log_det
from models.threads import ThreadBudget, concurrent_batches, thread_budget

log = logging.getLogger(__name__)

SANITY_SAMPLES = 100
ENGINES = ("local", "ray")


class VerificationError(ValueError):
    """A freshly built version failed its checks; it was not published."""


@dataclass(frozen=True)
class ReindexJob:
    """Everything one `probsearch reindex` run needs (built from settings + flags by the CLI)."""

    modality: str
    source: Path
    model_dir: Path
    index_root: Path
    metrics: tuple[str, ...] = ("w2",)  # empty: inherited_metrics
    index_type: str = "auto"
    dtype: str = "float32"
    batch_size: int = ENCODE_BATCH
    chunk_items: int = CHUNK_ITEMS
    activate: bool = False
    redis_url: str | None = None
    namespace: str | None = None  # of the Redis keys; None: registry.namespace_of(index_root)
    max_bad_fraction: float = 0.01
    max_caption_chars: int = MAX_CAPTION_CHARS
    split: str | None = None
    image_root: Path | None = None
    memory_budget: int | None = None
    device: str = "auto"
    progress: bool = True
    seed: int = 0
    engine: str = "local"  # "local" (this process) or "ray" (indexer.ray_engine)
    ray: RayOptions = field(default_factory=RayOptions)
    shortlist_backend: str = "faiss"  # "milvus": also write each family into a collection
    milvus_uri: str | None = None
    threads: ThreadBudget | None = None  # the local encoder's pools; None: the batch budget

    def validate(self) -> None:
        """Refuse bad settings before any work is done (ValueError with the fix)."""
        for metric in self.metrics:
            check_metric(metric)
        if not self.metrics:
            raise ValueError("--metrics is empty; name at least one metric, e.g. w2")
        if self.index_type not in INDEX_TYPES:
            raise IndexBuildError(
                f"unknown index type {self.index_type!r}; choose one of {', '.join(INDEX_TYPES)}"
            )
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"unknown dtype {self.dtype!r}; choose float32 or float16")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ValueError(f"--max-bad-fraction must be in [0, 1]; got {self.max_bad_fraction}")
        if self.batch_size < 1 or self.chunk_items < 1:
            raise ValueError("--batch-size and --chunk-items must be >= 1")
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; choose {' or '.join(ENGINES)}")


@dataclass(frozen=True)
class PublishResult:
    """The published version and what the job did."""

    version: str
    path: Path
    activated: bool
    report: dict[str, Any]
    reused_chunks: int
    calibration_note: str = ""
    unfamiliar_note: str = ""  # pictures past the familiarity gate (unfamiliar_note)


def new_version_name(key: str) -> str:
    """A name that sorts by creation time: UTC timestamp (ms) + a short hash."""
    now = datetime.now(UTC)
    stamp = now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"
    suffix = hashlib.sha256(f"{key}{time.time_ns()}{os.getpid()}".encode()).hexdigest()[:8]
    return f"{stamp}-{suffix}"


def run_reindex(job: ReindexJob) -> PublishResult:
    """Embed the gallery, build and verify a version, publish it, optionally activate it."""
    milvus = milvus_backend(job.shortlist_backend, job.milvus_uri)
    registry = ActiveRegistry(job.index_root, job.redis_url, milvus, namespace=job.namespace)
    if not job.metrics:
        job = replace(job, metrics=inherited_metrics(job, active_manifest(registry, job.modality)))
    job.validate()
    modality_dir = registry.modality_dir(job.modality)
    for name in remove_debris(modality_dir):
        log.warning("removed %s, left in %s by a job that is gone", name, modality_dir)
    source = open_source(job.source, job.modality, job.split, job.image_root)
    model_name, model_hash = model_fingerprint(job.model_dir, job.modality)
    key = hashlib.sha256(
        f"{source.fingerprint}|{model_hash}|{job.chunk_items}|{job.max_caption_chars}".encode()
    ).hexdigest()[:16]
    work_dir = modality_dir / ".work" / key
    summary = embed_source(job, source, work_dir)
    report = build_report(summary.total, summary.bad)
    write_report(work_dir / REPORT_NAME, report)
    check_bad_fraction(report, job.max_bad_fraction, work_dir / REPORT_NAME)
    version = new_version_name(key)
    tmp_dir = modality_dir / f".tmp-{version}"
    try:
        tmp_dir.mkdir(parents=True)
        mark_owner(tmp_dir)
        info = {
            "model_name": model_name,
            "model_hash": model_hash,
            "source": str(job.source.resolve()),
            "image_root": "" if source.image_root is None else str(source.image_root.resolve()),
        }
        inherited = inherit_calibration(
            active_manifest(registry, job.modality), model_name, model_hash, version_metrics(job)
        )
        build_version(tmp_dir, job, summary, version, report, info, inherited)
        collections = write_version_dir(milvus, tmp_dir) if milvus is not None else []
        try:
            path = publish_version(tmp_dir, registry, job.modality, version, job.activate)
        except BaseException:
            if tmp_dir.exists() and milvus is not None:  # not published: no orphan collections
                milvus.drop(collections)
            raise
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)  # gone after the rename; cleanup on failure
        release_owner(tmp_dir)
    shutil.rmtree(work_dir, ignore_errors=True)
    captions = active_manifest(registry, "text") if job.modality == "image" else None
    same_model = captions is not None and captions.model_name == model_name
    gate = familiarity_gate(captions) if same_model else None
    return PublishResult(
        version, path, job.activate, report, summary.reused_chunks, inherited.note,
        unfamiliar_note(path, gate),
    )  # fmt: skip


def unfamiliar_note(version_dir: Path, gate: ItemGate | None) -> str:
    """How many pictures of an image version the caption gallery's familiarity gate would
    refuse as queries (searches mark them), as a warning sentence; "" when none or no gate."""
    if gate is None:
        return ""
    version = open_version(version_dir)
    try:
        log_dets = log_det(torch.from_numpy(np.array(version.logvar, np.float32))).numpy()
        flags = gate.flags(log_dets, version.novelty)
    finally:
        version.close()
    if flags is None or not flags.any():
        return ""
    return (
        f"{int(flags.sum())} of {len(flags)} pictures look unlike anything the model was trained "
        f"on ({gate.describe()}, the familiarity gate of the active caption gallery): searches "
        "mark them, and their distances mean little"
    )


def inherited_metrics(job: ReindexJob, active: Manifest | None) -> tuple[str, ...]:
    """The metrics of a reindex that names none: the active version's when the same model
    built it (a new version must not drop a metric the service and its clients use), else
    the one the model ranks this gallery with (ModelConfig.default_metric); w2 for a pvse
    model (max_pair is searched from the multi-vector index every version has)."""
    if active is not None:
        _, model_hash = model_fingerprint(job.model_dir, job.modality)
        if active.model_hash == model_hash:
            return tuple(m for m in active.metrics if m in METRICS) or ("w2",)
    metric = ModelConfig.load(job.model_dir).default_metric(job.modality)
    return (metric if metric in METRICS else "w2",)


def milvus_backend(name: str, uri: str | None) -> MilvusBackend | None:
    """The Milvus backend when the shortlist backend is "milvus" (None for "faiss")."""
    if name == "faiss":
        return None
    backend = make_backend(name, uri)
    assert isinstance(backend, MilvusBackend)
    return backend


def embed_source(job: ReindexJob, source: GallerySource, work_dir: Path) -> EmbedSummary:
    """Embed the gallery into chunk files in `work_dir` with the job's engine: this process
    (indexer.embed) or a Ray cluster (indexer.ray_engine); both write the same chunks."""
    if job.engine == "ray":
        from indexer.ray_engine import embed_gallery_ray

        return embed_gallery_ray(
            source.items(),
            job.model_dir,
            job.modality,
            work_dir,
            job.ray,
            device=job.device,
            chunk_items=job.chunk_items,
            batch_size=job.batch_size,
            max_caption_chars=job.max_caption_chars,
            progress=job.progress,
        )
    from models.onnx.encoder_runtime import OnnxEncoder

    # Each call gets `workers` batches, which the encoder runs at once, one per pool: on 2
    # cores with the batch budget's one thread, one batch at a time left a core idle
    # (benchmarks/results/reindex_workers.md).
    threads = job.threads or thread_budget("batch")
    workers = concurrent_batches(threads)
    encoder = OnnxEncoder(
        job.model_dir, job.modality, job.device, job.batch_size, threads, workers=workers
    )
    return embed_gallery(
        source.items(),
        encoder,
        job.modality,
        work_dir,
        total=source.count,
        chunk_items=job.chunk_items,
        batch_size=job.batch_size * workers,
        max_caption_chars=job.max_caption_chars,
        progress=job.progress,
        decode_threads=workers * threads.intra_op,
    )


def version_metrics(job: ReindexJob) -> tuple[str, ...]:
    """The metrics a version built by `job` serves: those of its index families, then the
    requested ones (which may be re-ranked from a candidate family)."""
    return tuple(dict.fromkeys(served_metrics(families_for(job.metrics)) + tuple(job.metrics)))


def build_version(
    version_dir: Path,
    job: ReindexJob,
    summary: EmbedSummary,
    version: str,
    report: dict[str, Any],
    info: dict[str, str],
    inherited: InheritedCalibration | None = None,
) -> Manifest:
    """Write arrays, metadata, indexes, report and manifest of a new version into version_dir.

    The calibration is `inherited` (see indexer.calibration_inheritance), else none.
    """
    parts = ((c.mu, c.logvar, c.records) for c in map(load_chunk, summary.chunk_paths))
    write_arrays_and_metadata(version_dir, parts, summary.kept, summary.dim, job.dtype)
    write_report(version_dir / REPORT_NAME, report)
    write_multivector(version_dir, (load_chunk(p).embeddings for p in summary.chunk_paths))
    write_novelty(version_dir, (load_chunk(p).novelty for p in summary.chunk_paths))
    budget = job.memory_budget or default_memory_budget()
    indexes = write_version_indexes(version_dir, job.metrics, job.index_type, budget, job.seed)
    metrics = version_metrics(job)
    if inherited is None:
        inherited = InheritedCalibration({metric: Calibration() for metric in metrics}, None, "")
    manifest = Manifest(
        version=version,
        modality=job.modality,
        model_name=info["model_name"],
        model_hash=info["model_hash"],
        dim=summary.dim,
        count=summary.kept,
        metrics=metrics,
        families=indexes.families,
        index_type=indexes.index_type,
        index_params=indexes.index_params,
        search_params=indexes.search_params,
        calibration=inherited.calibration,
        calibration_inherited_from=inherited.source,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        dtype=job.dtype,
        source=info["source"],
        image_root=info.get("image_root", ""),
        engine=job.engine,
    )
    manifest = manifest.with_files(checksum_dir(version_dir))
    write_manifest(version_dir, manifest)
    return manifest


def verify_version(version_dir: Path, samples: int = SANITY_SAMPLES, seed: int = 0) -> None:
    """Checksums, counts, and a self-search: sampled items must find themselves first.

    Self-search runs in every family whose distance is 0 exactly at the item itself (all but
    csd). An exact duplicate embedding found in its place counts as found. Exact (flat) indexes
    must pass for every sample, approximate ones for 90% (SQ/PQ codes: within the top 10).
    """
    manifest = read_manifest(version_dir)
    try:
        verify_checksums(version_dir, manifest)
        version = open_version(version_dir, device="cpu")
    except ValueError as e:
        raise VerificationError(f"new version failed verification: {e}") from e
    try:
        rng = np.random.default_rng(seed)
        rows = np.sort(rng.choice(manifest.count, min(samples, manifest.count), replace=False))
        mu_q = np.asarray(version.mu[rows], np.float32)  # (S, D)
        logvar_q = np.asarray(version.logvar[rows], np.float32)
        depth = 10 if manifest.index_type in COMPRESSED_TYPES else 1
        needed = 1.0 if manifest.index_type == "flat" else 0.9
        for family in (f for f in manifest.families if f != "csd"):
            _, found = version.search_family(family, mu_q, logvar_q, depth)  # (S, depth)
            hits = [_finds_itself(version, row, got) for row, got in zip(rows, found, strict=True)]
            if np.mean(hits) < needed:
                raise VerificationError(
                    f"self-search failed in the {family} index: only {np.mean(hits):.0%} of"
                    f" {len(rows)} sampled items found themselves (needed {needed:.0%});"
                    " the index and the arrays disagree, nothing was published"
                )
    finally:
        version.close()


def _finds_itself(version: Any, row: int, found: np.ndarray) -> bool:
    if row in found:
        return True
    twins = found[found >= 0]
    return any(
        np.array_equal(version.mu[t], version.mu[row])
        and np.array_equal(version.logvar[t], version.logvar[row])
        for t in twins
    )


def publish_version(
    tmp_dir: Path, registry: ActiveRegistry, modality: str, version: str, activate: bool
) -> Path:
    """Verify tmp_dir, then under the publish lock rename it into place and maybe activate."""
    verify_version(tmp_dir)
    final = registry.version_path(modality, version)
    with registry.publish_lock(modality):
        os.rename(tmp_dir, final)
        _fsync_dir(final.parent)
        if activate:
            registry.activate(modality, version)
    return final


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
