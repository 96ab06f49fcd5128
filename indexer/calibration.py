"""Calibration of the rejection rule: per metric, the score, its temperature T and threshold tau.

Held-out queries (a split the gallery does not hold) go through the same steps as a served
request: encode with MC-dropout draws, shortlist from the index, exact re-rank and every
uncertainty score over the shortlist (models.scoring, the service's own code). A query counts
as answered correctly when its top result is a plausible match
(models.datasets.records.is_plausible_match). Then:

- the score and T are the pair whose values rank the queries best for rejection: the largest
  normalised AUPRC, (AUPRC - random) / (oracle - random), of precision against the fraction
  of queries kept (T matters only to mutual information and posterior entropy);
- tau is the largest value of that score that still meets the target: the precision of the
  kept queries (score <= tau) is at least P, or at least a fraction C of the queries is kept.

Image queries must also be rejected when the image is unlike anything the model was trained
on, which held-out queries cannot show: the score that ranks wrong answers best need not rank
such images high. So for an image-query gallery, OUTLIER_QUERIES synthetic outlier images
(models.datasets.outliers: 1/f textures from a stream of their own, never fitted to real
photographs) are scored too. The familiarity gate reads one of GATE_SCORES (novelty, for a
model on pretrained backbones, else log_det): the one that ranks the outliers above the
held-out queries best, when its AUROC >= OUTLIER_AUROC_FLOOR. Its limit is the
FAMILIAR_QUANTILE quantile of the held-out queries' values: a query above it is rejected
whatever its reject score (the service names the gate's score as its reject score then).
calibration.json records each score's AUROC for the outliers and how many the gate and the
whole rule reject.
"""

import json
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from indexer.manifest import Calibration, read_manifest, sha256_file, write_manifest
from indexer.store import IndexVersion
from indexer.version_writer import update_calibration
from models.datasets.outliers import synthetic_outliers
from models.datasets.records import (
    CaptionRecord,
    ImageRecord,
    PairedDataset,
    is_plausible_match,
    load_dataset,
)
from models.evaluation.rejection_metrics import (
    auroc,
    is_constant,
    normalized_auprc,
    oracle_rejection,
    precision_coverage,
    random_rejection,
)
from models.networks.preprocess import load_image
from models.onnx.encoder_runtime import Embeddings, OnnxEncoder
from models.scoring.query_scores import TEMPERATURE_SCORES, gated, score_shortlists
from models.scoring.rerank import compute_device
from models.threads import ThreadBudget, concurrent_batches, thread_budget

CALIBRATION_FILE = "calibration.json"
RERANK_BLOCK = 1024  # queries re-ranked together (memory: RERANK_BLOCK x shortlist x D)
DEFAULT_TEMPERATURES = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
OUTLIER_QUERIES = 250
OUTLIER_AUROC_FLOOR = 0.8
FAMILIAR_QUANTILE = 0.99  # the gate rejects about 1% of familiar image queries
GATE_SCORES = ("novelty", "log_det")  # what the familiarity gate may read; ties: the first
OUTLIER_STREAM = 7_919  # the outliers' random stream, apart from training's


class CalibrationError(ValueError):
    """Calibration cannot run on this input (no queries, unknown metric, bad target)."""


@dataclass(frozen=True)
class Target:
    """What tau must achieve: a precision of the kept queries, or a fraction kept."""

    precision: float | None = None
    coverage: float | None = None

    def __post_init__(self) -> None:
        if (self.precision is None) == (self.coverage is None):
            raise CalibrationError("give exactly one of --target-precision and --target-coverage")
        value = self.precision if self.precision is not None else self.coverage
        if not 0.0 < float(value) <= 1.0:
            raise CalibrationError(f"the target must lie in (0, 1], got {value}")


@dataclass(frozen=True)
class MetricCalibration:
    """The outcome for one metric, with the evidence behind it."""

    metric: str
    score: str
    temperature: float
    threshold: float
    normalized_auprc: dict[str, float]  # "<score>" or "<score>@T<t>" -> normalised AUPRC
    accuracy: float  # plausible P@1 with no rejection
    kept_fraction: float  # of the calibration queries, at tau
    kept_precision: float  # plausible P@1 of the kept queries, at tau
    target_met: bool
    queries: int
    gate_score: str = "log_det"  # what the familiarity gate reads (GATE_SCORES)
    gate_limit: float | None = None  # the familiarity gate (image queries), or none
    # "<score>" or "<score>@T<t>" -> AUROC of synthetic outlier images against the queries
    # (image queries only; empty otherwise)
    outlier_auroc: dict[str, float] = field(default_factory=dict)
    outliers_rejected: float | None = None  # fraction of those outliers the rule rejects

    def gate_note(self) -> str:
        """For image queries, "; <score> gate L, rejects X% of outlier images" (no gate: only
        the fraction); else ""."""
        if self.outliers_rejected is None:
            return ""
        gate = "" if self.gate_limit is None else f"{self.gate_score} gate {self.gate_limit:.4g}, "
        return f"; {gate}rejects {100 * self.outliers_rejected:.0f}% of outlier images"


def select_threshold(score: np.ndarray, correct: np.ndarray, target: Target) -> tuple[float, int]:
    """The tau meeting `target` on these queries and how many queries it keeps (score <= tau).

    Queries are kept from the most certain on; tau only falls between distinct values, so
    ties are kept or rejected together. When no tau meets a precision target, the most certain
    group alone is kept.
    """
    order = np.argsort(score, kind="stable")
    sorted_score, sorted_correct = score[order], correct[order].astype(np.float64)
    kept = np.arange(1, len(score) + 1)
    boundary = np.append(sorted_score[1:] != sorted_score[:-1], True)  # last of each value group
    if target.coverage is not None:
        eligible = boundary & (kept >= math.ceil(target.coverage * len(score) - 1e-9))
        count = int(kept[eligible][0])
    else:
        precision = np.cumsum(sorted_correct) / kept
        eligible = boundary & (precision >= target.precision - 1e-12)
        count = int(kept[eligible][-1]) if eligible.any() else int(kept[boundary][0])
    return float(sorted_score[count - 1]), count


class Judge:
    """Tells whether a gallery item is a plausible match for held-out query number q."""

    def __init__(self, queries: Sequence, dataset: PairedDataset, gallery: str) -> None:
        self.queries, self.dataset, self.gallery = queries, dataset, gallery
        self.captions = {c.id: c for c in dataset.captions} if gallery == "text" else {}

    def __call__(self, q: int, gallery_id: str) -> bool:
        query = self.queries[q]
        if self.gallery == "image":
            return is_plausible_match(query, self.dataset.image(gallery_id))
        return is_plausible_match(self.captions[gallery_id], query)


def encode_queries(
    encoder: OnnxEncoder, queries: Sequence[CaptionRecord | ImageRecord], mc: int, seed: int
) -> Embeddings:
    """Deterministic embeddings and `mc` MC-dropout draws of the held-out queries."""
    if encoder.modality == "text":
        return encoder.encode_texts([q.text for q in queries], mc, seed)
    images = [load_image(q.path) for q in tqdm(queries, desc="load query images", unit="image")]
    return encoder.encode_images(images, mc, seed)


def outlier_images(count: int, size: int, seed: int) -> list[Image.Image]:
    """`count` synthetic outlier images (size x size RGB) of their own random stream."""
    pixels = synthetic_outliers(count, size, np.random.default_rng([seed, OUTLIER_STREAM]))
    return [Image.fromarray(np.ascontiguousarray(p.transpose(1, 2, 0))) for p in pixels]


def candidate_name(score: str, temperature: float) -> str:
    """Key of a (score, T) candidate: T only for the scores that depend on it."""
    return f"{score}@T{temperature:g}" if score in TEMPERATURE_SCORES else score


def query_scores_by_candidate(
    version: IndexVersion,
    metric: str,
    embeddings: Embeddings,
    judge: Judge,
    temperatures: Sequence[float],
    shortlist: int,
    device: torch.device,
    progress: Callable[[int], object] | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every (score, T) candidate's value per query, and plausible-P@1 correctness per query,
    computed as the service computes them: the version's shortlist, then
    models.scoring.query_scores.score_shortlists, the service's own last stage. `progress` is
    told how many queries each block scored (else a progress bar of its own shows it).

    Returns:
        scores: candidate_name(score, T) -> (Q,) values.
        correct: (Q,) whether the top result is a plausible match.
    """
    candidates = version.shortlist(metric, embeddings.mu, embeddings.logvar, shortlist)  # (Q, C)
    correct = np.zeros(len(candidates), dtype=bool)
    values: dict[str, np.ndarray] = {}
    captions = version.manifest.modality == "image"  # an image gallery is searched by captions
    gallery = (version.mu, version.logvar)
    bar = None
    if progress is None:
        bar = tqdm(total=len(candidates), desc=f"calibrate {metric}", unit="query")
        progress = bar.update
    for start in range(0, len(candidates), RERANK_BLOCK):
        block = slice(start, start + RERANK_BLOCK)
        queries = _queries(embeddings, block)
        scored = score_shortlists(
            metric, queries, gallery, candidates[block], shortlist, temperatures, captions, device
        )
        tops = version.metadata([int(r) for r in scored.ranked.rows[:, 0]])
        correct[block] = [judge(start + offset, top["id"]) for offset, top in enumerate(tops)]
        for temperature in temperatures:
            for name, value in scored.values(temperature).items():
                key = candidate_name(name, temperature)
                values.setdefault(key, np.zeros(len(candidates)))[block] = value
        progress(len(tops))
    if bar is not None:
        bar.close()
    return values, correct


def _queries(embeddings: Embeddings, block: slice) -> Embeddings:
    """The queries of `block`, their draws and novelty."""
    mc_mu, mc_logvar = embeddings.mc_mu, embeddings.mc_logvar
    return Embeddings(
        embeddings.mu[block],
        embeddings.logvar[block],
        None if mc_mu is None else mc_mu[:, block],
        None if mc_logvar is None else mc_logvar[:, block],
        identical_draws=embeddings.identical_draws,
        novelty=None if embeddings.novelty is None else embeddings.novelty[block],
    )


def summarise(
    metric: str,
    temperatures: Sequence[float],
    scores: dict[str, np.ndarray],
    correct: np.ndarray,
    target: Target,
    outliers: dict[str, np.ndarray] | None = None,
) -> MetricCalibration:
    """Pick the (score, T) with the best normalised AUPRC, and tau by the target. A score that
    is constant up to round-off (MI and feature uncertainty of a model without dropout) cannot
    rank queries: its round-off would, so it is never picked. With `outliers` (each
    candidate's values on synthetic outlier queries), also the familiarity gate on log_det."""
    chance, best = random_rejection(correct).auprc, oracle_rejection(correct).auprc
    quality = {
        name: normalized_auprc(precision_coverage(values, correct).auprc, chance, best)
        for name, values in scores.items()
    }
    ranked = [n for n in quality if not math.isnan(quality[n]) and not is_constant(scores[n])]
    ranked = ranked or list(quality)
    outlier_auroc = {n: auroc(scores[n], outliers[n]) for n in scores} if outliers else {}
    gate, limit = _gate(scores, outlier_auroc)
    chosen = max(ranked, key=lambda n: (quality[n], -ranked.index(n)))
    score, _, t = chosen.partition("@T")
    temperature = float(t) if t else _posterior_temperature(ranked, quality, temperatures)
    values = scores[chosen] if limit is None else gated(scores[chosen], scores[gate], limit)
    threshold, kept = select_threshold(values, correct, target)
    if math.isinf(threshold):  # a target only met by keeping gated queries: keep the others
        threshold = float(values[np.isfinite(values)].max())
    kept_mask = values <= threshold
    kept = int(kept_mask.sum())
    kept_precision = float(correct[kept_mask].mean())
    met = (
        kept_precision >= target.precision - 1e-12
        if target.precision is not None
        else kept / len(correct) >= target.coverage - 1e-12
    )
    return MetricCalibration(
        metric=metric,
        score=score,
        temperature=temperature,
        threshold=threshold,
        normalized_auprc=quality,
        accuracy=float(correct.mean()),
        kept_fraction=kept / len(correct),
        kept_precision=kept_precision,
        target_met=bool(met),
        queries=len(correct),
        gate_score=gate,
        gate_limit=limit,
        outlier_auroc=outlier_auroc,
        outliers_rejected=_outliers_rejected(outliers, chosen, threshold, gate, limit),
    )


def _gate(
    scores: dict[str, np.ndarray], outlier_auroc: dict[str, float]
) -> tuple[str, float | None]:
    """The familiarity gate: of GATE_SCORES, the one with the best outlier AUROC, if that is at
    least OUTLIER_AUROC_FLOOR, and its limit at FAMILIAR_QUANTILE of the held-out queries
    ("log_det", None: no gate)."""
    usable = [n for n in GATE_SCORES if outlier_auroc.get(n, 0.0) >= OUTLIER_AUROC_FLOOR]
    if not usable:
        return "log_det", None
    name = max(usable, key=lambda n: (outlier_auroc[n], -GATE_SCORES.index(n)))
    return name, float(np.quantile(scores[name], FAMILIAR_QUANTILE))


def _posterior_temperature(
    ranked: list[str], quality: dict[str, float], temperatures: Sequence[float]
) -> float:
    """T for a chosen score that does not depend on it (it still sets the posterior each
    result's `score` shows): that of the best temperature-dependent candidate."""
    tempered = [n for n in ranked if "@T" in n]
    if not tempered:
        return float(temperatures[0])
    return float(max(tempered, key=lambda n: quality[n]).partition("@T")[2])


def _outliers_rejected(
    outliers: dict[str, np.ndarray] | None,
    chosen: str,
    threshold: float,
    gate: str,
    limit: float | None,
) -> float | None:
    """The fraction of the synthetic outlier queries the rule rejects (None without them)."""
    if not outliers:
        return None
    values = outliers[chosen] if limit is None else gated(outliers[chosen], outliers[gate], limit)
    return float((values > threshold).mean())


def record(version_dir: Path, results: Sequence[MetricCalibration], data_dir: Path, split: str,
           target: Target, mc_samples: int) -> None:  # fmt: skip
    """Write score, T and tau into the manifest and the evidence into calibration.json."""
    update_calibration(
        version_dir,
        {
            r.metric: Calibration(r.temperature, r.threshold, r.score, r.gate_score, r.gate_limit)
            for r in results
        },
    )
    evidence = {
        "data": str(data_dir),
        "data_captions_sha256": sha256_file(data_dir / "captions.jsonl"),
        "split": split,
        "target": asdict(target),
        "mc_samples": mc_samples,
        "metrics": {r.metric: asdict(r) for r in results},
    }
    path = version_dir / CALIBRATION_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(evidence, indent=2, sort_keys=True))
    tmp.replace(path)
    manifest = read_manifest(version_dir)
    files = {**manifest.files, CALIBRATION_FILE: sha256_file(path)}
    write_manifest(version_dir, manifest.with_files(files))


@dataclass(frozen=True)
class CalibrationJob:
    """One `probsearch calibrate` run on one gallery's version dir."""

    version_dir: Path
    model_dir: Path
    data_dir: Path
    target: Target
    split: str = "val"
    metrics: tuple[str, ...] = ()  # empty: every metric the version serves
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    mc_samples: int = 16
    shortlist: int = 100
    seed: int = 0
    device: str = "auto"
    threads: ThreadBudget | None = None  # the encoder's pools; None: the batch budget


class SharedBar:
    """One progress bar for the metrics that each_metric scores at once: tqdm draws one bar
    per instance, and two bars written from two threads overwrite each other's line."""

    def __init__(self, **bar: Any) -> None:
        self._bar = tqdm(**bar)
        self._lock = threading.Lock()  # tqdm's counter is a plain attribute

    def update(self, count: int) -> None:
        with self._lock:
            self._bar.update(count)

    def __enter__(self) -> "SharedBar":
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.close()


def each_metric(
    calibrated: Callable[[str], MetricCalibration], metrics: Sequence[str], workers: int
) -> list[MetricCalibration]:
    """`calibrated(metric)` of each metric, in order: `workers` metrics at once, each in a
    thread of its own, when there are more than one of both. The metrics share nothing but
    the read-only version, so the results are those of one at a time; on 2 cores with the
    batch budget's one thread a pool, one at a time left a core idle through the scoring
    (benchmarks/results/calibrate_metrics.md)."""
    if workers < 2 or len(metrics) < 2:
        return [calibrated(metric) for metric in metrics]
    with ThreadPoolExecutor(min(workers, len(metrics))) as pool:
        return list(pool.map(calibrated, metrics))


def run_calibration(job: CalibrationJob) -> list[MetricCalibration]:
    """Calibrate T and tau for each metric of the version and record them in its manifest."""
    if job.mc_samples < 2:
        raise CalibrationError("the draw-based scores need at least 2 MC draws (--mc-samples)")
    version = IndexVersion(job.version_dir)
    try:
        gallery = version.manifest.modality
        metrics = job.metrics or version.manifest.metrics
        unknown = [m for m in metrics if not version.supports(m)]
        if unknown:
            raise CalibrationError(
                f"the {gallery} version {version.manifest.version} does not serve {unknown}; "
                f"it serves {', '.join(version.manifest.metrics)}"
            )
        dataset = load_dataset(job.data_dir)
        held_out = dataset.split(job.split)
        queries = held_out.captions if gallery == "image" else held_out.images
        if not queries:
            raise CalibrationError(f"split {job.split!r} of {job.data_dir} has no queries")
        query_kind = "text" if gallery == "image" else "image"
        threads = job.threads or thread_budget("batch")
        encoder = OnnxEncoder(
            job.model_dir, query_kind, job.device, threads=threads,
            workers=concurrent_batches(threads),
        )  # fmt: skip
        embeddings = encode_queries(encoder, queries, job.mc_samples, job.seed)
        outliers = None
        if encoder.modality == "image":
            images = outlier_images(OUTLIER_QUERIES, encoder.config.image_size, job.seed)
            outliers = encoder.encode_images(images, job.mc_samples, job.seed)
        judge = Judge(queries, dataset, gallery)
        device = compute_device(job.device)
        per_metric = len(queries) + (0 if outliers is None else len(outliers.mu))
        bar = SharedBar(
            total=per_metric * len(metrics), unit="query",
            desc=f"calibrate the {gallery} gallery ({', '.join(metrics)})",
        )  # fmt: skip

        def calibrated(metric: str) -> MetricCalibration:
            scores, correct = query_scores_by_candidate(
                version, metric, embeddings, judge, job.temperatures, job.shortlist, device,
                bar.update,
            )  # fmt: skip
            outlier_scores = None
            if outliers is not None:
                outlier_scores, _ = query_scores_by_candidate(
                    version, metric, outliers, lambda q, item: False, job.temperatures,
                    job.shortlist, device, bar.update,
                )  # fmt: skip
            return summarise(metric, job.temperatures, scores, correct, job.target, outlier_scores)

        with bar:
            results = each_metric(calibrated, metrics, concurrent_batches(threads))
    finally:
        version.close()
    record(job.version_dir, results, job.data_dir, job.split, job.target, job.mc_samples)
    return results
