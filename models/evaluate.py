"""Evaluation of a model dir on a dataset split: retrieval, rejection, uncertainty and the crop
experiment, as one JSON-ready report (models.evaluation_report renders it)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from models.datasets.crops import CropPair, crop_pairs
from models.datasets.records import (
    CaptionRecord,
    DatasetError,
    ImageRecord,
    PairedDataset,
    load_dataset,
    plausible_match_matrix,
)
from models.encoder_runtime import Embeddings, OnnxEncoder
from models.gaussian import check_metric, elementwise_distance, pairwise_distance
from models.preprocess import load_image
from models.rejection_metrics import rejection_summary
from models.retrieval_metrics import (
    DistanceChunk,
    GroupRelevance,
    pmrp_relevances,
    rank_queries,
    summarize_ranking,
)
from models.uncertainty import feature_uncertainty, log_det, mutual_information

logger = logging.getLogger(__name__)

DIRECTIONS: tuple[str, ...] = ("i2t", "t2i")


class EvaluationError(ValueError):
    """An evaluation that cannot run as asked (empty split, bad settings); says how to fix it."""


@dataclass(frozen=True)
class EvalConfig:
    """How to evaluate. `metrics` empty = the model's default search metric."""

    metrics: tuple[str, ...] = ()
    mc_samples: int = 10
    seed: int = 0
    shortlist_size: int = 100  # m: top-m of the deterministic ranking that MI is computed over
    temperatures: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0)
    chunk_size: int = 256  # queries per distance chunk: memory is chunk_size x gallery size
    batch_size: int = 256  # items per encoder call
    device: str = "auto"  # torch device for distances: auto, cpu or cuda
    deciles: int = 10
    histogram_bins: int = 30

    def __post_init__(self) -> None:
        for metric in self.metrics:
            check_metric(metric)
        if self.mc_samples < 0 or self.shortlist_size < 1 or self.chunk_size < 1:
            raise EvaluationError("mc_samples must be >= 0, shortlist_size and chunk_size >= 1")
        if any(not t > 0 for t in self.temperatures):
            raise EvaluationError(f"temperatures must all be > 0; got {self.temperatures}")


@dataclass
class SplitEmbeddings:
    """Both galleries of one split, embedded, with the pairing and labels the metrics need."""

    dataset: PairedDataset
    images: Embeddings  # mu/logvar (I, D), mc_* (L, I, D) or None
    captions: Embeddings  # mu/logvar (C, D), mc_* (L, C, D) or None
    caption_image: np.ndarray  # (C,) int64 row of each caption's image
    image_labels: np.ndarray  # (I, K) 0/1 multi-hot over dataset.label_names
    encoders: dict[str, OnnxEncoder] = field(repr=False, default_factory=dict)


def torch_device(device: str) -> torch.device:
    """ "auto" -> cuda when torch sees a GPU, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda"):
        raise EvaluationError(f"unknown device {device!r}; choose auto, cpu or cuda")
    return torch.device(device)


def _concat(parts: list[Embeddings]) -> Embeddings:
    mc = parts[0].mc_mu is not None
    return Embeddings(
        mu=np.concatenate([p.mu for p in parts]),
        logvar=np.concatenate([p.logvar for p in parts]),
        mc_mu=np.concatenate([p.mc_mu for p in parts], axis=1) if mc else None,
        mc_logvar=np.concatenate([p.mc_logvar for p in parts], axis=1) if mc else None,
    )


def embed_images(
    encoder: OnnxEncoder, images: Sequence[ImageRecord], mc_samples: int, seed: int, batch: int
) -> Embeddings:
    """Embed image files in batches (batch b draws its MC masks with seed + b)."""
    parts = []
    for b, start in enumerate(tqdm(range(0, len(images), batch), desc="images", leave=False)):
        pil = [load_image(record.path) for record in images[start : start + batch]]
        parts.append(encoder.encode_images(pil, mc_samples=mc_samples, seed=seed + b))
    return _concat(parts)


def embed_images_pil(encoder: OnnxEncoder, images: Sequence, batch: int) -> Embeddings:
    """Deterministic embeddings of in-memory PIL images, in batches."""
    starts = range(0, len(images), batch)
    return _concat([encoder.encode_images(images[s : s + batch]) for s in starts])


def embed_texts(
    encoder: OnnxEncoder, texts: Sequence[str], mc_samples: int, seed: int, batch: int
) -> Embeddings:
    """Embed captions in batches (batch b draws its MC masks with seed + b)."""
    parts = []
    for b, start in enumerate(tqdm(range(0, len(texts), batch), desc="captions", leave=False)):
        chunk = list(texts[start : start + batch])
        parts.append(encoder.encode_texts(chunk, mc_samples=mc_samples, seed=seed + b))
    return _concat(parts)


def embed_split(model_dir: Path, dataset: PairedDataset, config: EvalConfig) -> SplitEmbeddings:
    """Load both encoders and embed every image and caption of `dataset` (one split)."""
    if not dataset.images or not dataset.captions:
        raise EvaluationError(
            f"the split has {len(dataset.images)} images and {len(dataset.captions)} captions; "
            "evaluation needs at least one of each (choose another --split)"
        )
    row_of = {image.id: row for row, image in enumerate(dataset.images)}
    caption_image = np.array([row_of[c.image_id] for c in dataset.captions], dtype=np.int64)
    uncaptioned = len(dataset.images) - len(set(caption_image.tolist()))
    if uncaptioned:
        raise EvaluationError(
            f"{uncaptioned} images of the split have no caption; image-to-text evaluation "
            "needs at least one caption per image"
        )
    label_col = {name: col for col, name in enumerate(dataset.label_names)}
    image_labels = np.zeros((len(dataset.images), len(label_col)), dtype=np.int64)
    for row, image in enumerate(dataset.images):
        image_labels[row, [label_col[label] for label in image.labels]] = 1
    device = "cuda" if torch_device(config.device).type == "cuda" else "cpu"
    encoders = {m: OnnxEncoder(model_dir, m, device=device) for m in ("image", "text")}
    images = embed_images(
        encoders["image"], dataset.images, config.mc_samples, config.seed, config.batch_size
    )
    texts = [c.text for c in dataset.captions]
    captions = embed_texts(
        encoders["text"], texts, config.mc_samples, config.seed, config.batch_size
    )
    return SplitEmbeddings(dataset, images, captions, caption_image, image_labels, encoders)


def distance_chunks(
    metric: str,
    queries: Embeddings,
    gallery: Embeddings,
    chunk_size: int,
    device: torch.device,
    seed: int = 0,
) -> Iterator[DistanceChunk]:
    """Distances (c, G) of successive chunks of queries to the whole gallery."""
    params = {"seed": seed} if metric == "match_prob" else {}
    mu_g = torch.from_numpy(gallery.mu).to(device)
    logvar_g = torch.from_numpy(gallery.logvar).to(device)
    for start in range(0, queries.mu.shape[0], chunk_size):
        mu_q = torch.from_numpy(queries.mu[start : start + chunk_size]).to(device)
        logvar_q = torch.from_numpy(queries.logvar[start : start + chunk_size]).to(device)
        yield start, pairwise_distance(metric, mu_q, logvar_q, mu_g, logvar_g, **params)


def shortlist_draw_distances(
    metric: str,
    queries: Embeddings,
    gallery: Embeddings,
    shortlist: np.ndarray,
    device: torch.device,
    seed: int = 0,
    chunk_size: int = 256,
) -> torch.Tensor:
    """Distance of every MC draw of every query to its shortlist: (L, Q, m) float32 on CPU,
    computed for `chunk_size` queries at a time."""
    assert queries.mc_mu is not None and queries.mc_logvar is not None
    params = {"seed": seed} if metric == "match_prob" else {}
    num_draws, num_queries = queries.mc_mu.shape[:2]
    m = shortlist.shape[1]
    out = torch.empty((num_draws, num_queries, m), dtype=torch.float32)
    for start in range(0, num_queries, chunk_size):
        stop = min(start + chunk_size, num_queries)
        rows = torch.from_numpy(shortlist[start:stop].reshape(-1))  # (c * m,)
        mu_g = torch.from_numpy(gallery.mu)[rows].to(device)  # (c * m, D)
        logvar_g = torch.from_numpy(gallery.logvar)[rows].to(device)
        for draw in range(num_draws):
            mu_q = torch.from_numpy(queries.mc_mu[draw, start:stop]).to(device)  # (c, D)
            logvar_q = torch.from_numpy(queries.mc_logvar[draw, start:stop]).to(device)
            d = elementwise_distance(
                metric,
                mu_q.repeat_interleave(m, dim=0),  # (c * m, D), query i repeated m times
                logvar_q.repeat_interleave(m, dim=0),
                mu_g,
                logvar_g,
                **params,
            )  # (c * m,)
            out[draw, start:stop] = d.reshape(stop - start, m).float().cpu()
    return out


def query_uncertainties(
    metric: str,
    queries: Embeddings,
    gallery: Embeddings,
    shortlist: np.ndarray,
    config: EvalConfig,
) -> dict[str, np.ndarray]:
    """Per-query uncertainty by each method: log-det, and with >= 2 MC draws feature uncertainty
    and the mutual information over the shortlist at every temperature."""
    out = {"log_det": log_det(torch.from_numpy(queries.logvar)).double().numpy()}
    if queries.mc_mu is None or queries.mc_mu.shape[0] < 2:
        return out
    out["feature_uncertainty"] = feature_uncertainty(torch.from_numpy(queries.mc_mu)).numpy()
    device = torch_device(config.device)
    distances = shortlist_draw_distances(
        metric, queries, gallery, shortlist, device, config.seed, config.chunk_size
    )
    for temperature in config.temperatures:
        out[f"mi_T{temperature:g}"] = mutual_information(distances, temperature).double().numpy()
    return out


@dataclass(frozen=True)
class PlausibleMatchRelevance:
    """The dataset's exact plausible matches (models.datasets.records), computed per chunk."""

    captions: Sequence[CaptionRecord]
    images: Sequence[ImageRecord]
    queries_are_captions: bool

    def mask(self, rows: np.ndarray) -> np.ndarray:
        if self.queries_are_captions:
            return plausible_match_matrix([self.captions[r] for r in rows], self.images)
        return plausible_match_matrix(self.captions, [self.images[r] for r in rows]).T


def direction_setup(split: SplitEmbeddings, direction: str):
    """(queries, gallery, ground-truth relevance, R-Precision sets) of i2t or t2i."""
    images, captions = split.dataset.images, split.dataset.captions
    num_images = len(images)
    caption_labels = split.image_labels[split.caption_image]  # a caption takes its image's labels
    if direction == "i2t":
        positives = GroupRelevance(np.arange(num_images), split.caption_image)
        exact = PlausibleMatchRelevance(captions, images, queries_are_captions=False)
        pmrp = pmrp_relevances(split.image_labels, caption_labels)
        return split.images, split.captions, positives, {"r_precision": exact, **pmrp}
    positives = GroupRelevance(split.caption_image, np.arange(num_images))
    exact = PlausibleMatchRelevance(captions, images, queries_are_captions=True)
    pmrp = pmrp_relevances(caption_labels, split.image_labels)
    return split.captions, split.images, positives, {"r_precision": exact, **pmrp}


def evaluate_direction(
    split: SplitEmbeddings, metric: str, direction: str, config: EvalConfig
) -> dict:
    """Retrieval and rejection metrics of one direction with one metric."""
    queries, gallery, positives, sets = direction_setup(split, direction)
    if split.image_labels.shape[1] == 0:  # no label vectors (e.g. COCO captions only): no PMRP
        sets = {"r_precision": sets["r_precision"]}
    device = torch_device(config.device)
    chunks = distance_chunks(metric, queries, gallery, config.chunk_size, device, config.seed)
    result = rank_queries(chunks, queries.mu.shape[0], positives, sets, config.shortlist_size)
    uncertainties = query_uncertainties(metric, queries, gallery, result.shortlist, config)
    ranks = result.first_positive_rank
    correct_at = {1: ranks < 1, 10: ranks < 10}
    return {
        "retrieval": summarize_ranking(result),
        "rejection": rejection_summary(uncertainties, correct_at, config.deciles, config.seed),
    }


def _selection_accuracy(
    metric: str, queries: tuple[Embeddings, Embeddings], candidates: tuple[Embeddings, Embeddings]
) -> dict[str, float]:
    """Binary selection (%): query view 0 (part A) should be closer to candidate 0 than to
    candidate 1, query view 1 (union A+B) closer to candidate 1; a tie counts as wrong."""

    def distance(query: Embeddings, candidate: Embeddings) -> np.ndarray:
        tensors = [
            torch.from_numpy(a) for a in (query.mu, query.logvar, candidate.mu, candidate.logvar)
        ]
        params = {"seed": 0} if metric == "match_prob" else {}
        return elementwise_distance(metric, *tensors, **params).double().numpy()  # (P,)

    part_a = distance(queries[0], candidates[0]) < distance(queries[0], candidates[1])
    union = distance(queries[1], candidates[1]) < distance(queries[1], candidates[0])
    return {
        "part_a": 100.0 * float(part_a.mean()),
        "union": 100.0 * float(union.mean()),
        "overall": 50.0 * float(part_a.mean() + union.mean()),
    }


def crop_experiment(split: SplitEmbeddings, metrics: Sequence[str], config: EvalConfig) -> dict:
    """Pishdad et al. sec. 4.6 on the split's images with >= 2 objects: selection accuracy of
    part A vs union A+B (image views vs captions "A" / "A and B"), and their mean log-det."""
    try:
        pairs: list[CropPair] = list(crop_pairs(split.dataset))
    except DatasetError as e:
        return {"note": f"skipped: {e}"}
    if not pairs:
        return {"note": "skipped: no image of the split has two objects"}
    batch = config.batch_size
    image_a = embed_images_pil(split.encoders["image"], [p.image_a for p in pairs], batch)
    image_ab = embed_images_pil(split.encoders["image"], [p.image_ab for p in pairs], batch)
    text_a = embed_texts(split.encoders["text"], [p.caption_a for p in pairs], 0, 0, batch)
    text_ab = embed_texts(split.encoders["text"], [p.caption_ab for p in pairs], 0, 0, batch)
    per_metric = {
        metric: {
            "i2t": _selection_accuracy(metric, (image_a, image_ab), (text_a, text_ab)),
            "t2i": _selection_accuracy(metric, (text_a, text_ab), (image_a, image_ab)),
        }
        for metric in metrics
    }

    def mean_log_det(embeddings: Embeddings) -> float:
        return float(log_det(torch.from_numpy(embeddings.logvar)).double().mean())

    return {
        "tuples": len(pairs),
        "metrics": per_metric,
        "mean_log_det": {
            "image": {"part_a": mean_log_det(image_a), "union": mean_log_det(image_ab)},
            "text": {"part_a": mean_log_det(text_a), "union": mean_log_det(text_ab)},
        },
    }


def log_det_summary(embeddings: Embeddings, bins: int) -> dict:
    """Mean, std and histogram of the per-item log-det of one gallery."""
    values = log_det(torch.from_numpy(embeddings.logvar)).double().numpy()
    counts, edges = np.histogram(values, bins=bins)
    return {
        "mean": float(values.mean()),
        "std": float(values.std()),
        "histogram": {"counts": counts.tolist(), "edges": edges.tolist()},
    }


def evaluate_model(
    model_dir: Path | str,
    data_dir: Path | str,
    split: str = "test",
    config: EvalConfig | None = None,
) -> dict:
    """Every evaluation of issue 6 on one split, as a JSON-ready dict (see evaluation_report)."""
    config = config or EvalConfig()
    model_dir = Path(model_dir)
    dataset = load_dataset(data_dir, split)
    embedded = embed_split(model_dir, dataset, config)
    model_config = embedded.encoders["image"].config
    metrics = config.metrics or (model_config.search_metric,)
    report: dict = {
        "model": {
            "dir": str(model_dir),
            "name": model_config.name,
            "model_type": model_config.model_type,
            "train_metric": model_config.metric,
        },
        "data": {
            "dir": str(data_dir),
            "split": split,
            "images": len(dataset.images),
            "captions": len(dataset.captions),
        },
        "settings": {**asdict(config), "metrics": list(metrics)},
        "log_det": {
            "image": log_det_summary(embedded.images, config.histogram_bins),
            "text": log_det_summary(embedded.captions, config.histogram_bins),
        },
        "metrics": {},
    }
    for metric in metrics:
        logger.info("evaluating %s", metric)
        per_direction = {d: evaluate_direction(embedded, metric, d, config) for d in DIRECTIONS}
        rsum = sum(per_direction[d]["retrieval"]["rsum"] for d in DIRECTIONS)
        report["metrics"][metric] = {"rsum": rsum, **per_direction}
    report["crop"] = crop_experiment(embedded, metrics, config)
    return report
