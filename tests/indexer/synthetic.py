"""Seeded synthetic Gaussian galleries and a helper that publishes one as a version dir."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from indexer.manifest import Calibration, Manifest, checksum_dir, write_manifest
from indexer.registry import ActiveRegistry
from indexer.version_writer import served_metrics, write_arrays_and_metadata, write_version_indexes
from models.scoring.rerank import rerank_batch

LOGVAR_MIN, LOGVAR_MAX = np.log(0.1), np.log(10.0)


def clustered_gaussians(
    n: int, dim: int, seed: int = 0, clusters: int = 200
) -> tuple[np.ndarray, np.ndarray]:
    """mu, logvar (n, dim) float32 drawn around `clusters` centres, like trained embeddings."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, clusters, n)
    centres = rng.standard_normal((clusters, dim))
    centre_logvar = rng.normal(-0.5, 0.4, (clusters, dim))
    mu = centres[labels] + 0.3 * rng.standard_normal((n, dim))
    logvar = centre_logvar[labels] + 0.2 * rng.standard_normal((n, dim))
    return mu.astype(np.float32), np.clip(logvar, LOGVAR_MIN, LOGVAR_MAX).astype(np.float32)


def nearby_queries(
    mu: np.ndarray, logvar: np.ndarray, num: int, seed: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Queries (num, D) near random gallery items, with another item's variances."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, len(mu), num)
    mu_q = mu[rows] + 0.3 * rng.standard_normal(mu[rows].shape)
    logvar_q = logvar[rng.integers(0, len(mu), num)]
    return mu_q.astype(np.float32), logvar_q.astype(np.float32)


def write_synthetic_version(
    version_dir: Path,
    mu: np.ndarray,
    logvar: np.ndarray,
    metrics: tuple[str, ...] = ("w2",),
    index_type: str = "flat",
    modality: str = "text",
    dtype: str = "float32",
) -> Manifest:
    """A complete version dir (arrays, metadata, indexes, manifest) for synthetic embeddings."""
    version_dir.mkdir(parents=True)
    count, dim = mu.shape
    records = [{"id": f"item-{i}", "text": f"caption {i}", "extra": {"i": i}} for i in range(count)]
    write_arrays_and_metadata(version_dir, [(mu, logvar, records)], count, dim, dtype)
    indexes = write_version_indexes(version_dir, metrics, index_type, 10**12)
    served = served_metrics(indexes.families)
    manifest = Manifest(
        version=version_dir.name,
        modality=modality,
        model_name="synthetic",
        model_hash="0" * 64,
        dim=dim,
        count=count,
        metrics=served,
        families=indexes.families,
        index_type=indexes.index_type,
        index_params=indexes.index_params,
        search_params=indexes.search_params,
        calibration={m: Calibration() for m in served},
        created_at="2024-01-01T00:00:00+00:00",
        dtype=dtype,
    ).with_files(checksum_dir(version_dir))
    write_manifest(version_dir, manifest)
    return manifest


def publish_synthetic(
    registry: ActiveRegistry, modality: str, version: str, n: int = 200, seed: int = 0
) -> Path:
    """Write a small flat version straight into place (no temp dir) and return its path."""
    mu, logvar = clustered_gaussians(n, 8, seed=seed, clusters=10)
    path = registry.version_path(modality, version)
    write_synthetic_version(path, mu, logvar, ("w2",), "flat", modality)
    return path


def exact_top(version, metric: str, mu_q: np.ndarray, logvar_q: np.ndarray, k: int):
    """What a search returns from `version`: its shortlist of `k` per family, re-ranked exactly
    (the service's re-rank) -> distances (Q, k) as numpy and rows (Q, k)."""
    rows = version.shortlist(metric, mu_q, logvar_q, k)
    ranked = rerank_batch(
        metric, mu_q, logvar_q, version.mu, version.logvar, rows, k, torch.device("cpu")
    )
    return ranked.distances.numpy(), ranked.rows
