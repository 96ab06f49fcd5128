"""Evaluation of a model dir on a dataset split: retrieval, rejection, uncertainty and the crop
experiment, as one JSON-ready report (models.evaluation.report renders it)."""

from __future__ import annotations

import logging
import math
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
from models.distance.gaussian import (
    UnknownMetricError,
    check_metric,
    elementwise_distance,
    pairwise_distance,
)
from models.evaluation.rejection_metrics import auroc, rejection_summary, spearman
from models.evaluation.retrieval_metrics import (
    DistanceChunk,
    GroupRelevance,
    RankingResult,
    per_distinct_query,
    pmrp_relevances,
    rank_queries,
    summarize_ranking,
)
from models.networks.heads import fraction_at_bound
from models.networks.model_config import ModelConfig
from models.networks.preprocess import load_image
from models.onnx.encoder_runtime import Embeddings, OnnxEncoder
from models.pvse.max_pair import MAX_PAIR, max_pair_distance, shortlist_max_pair_distance
from models.scoring.baseline_scores import baseline_scores
from models.scoring.query_scores import (
    TEMPERATURE_SCORES,
    CaptionFit,
    query_scores,
    shortlist_distances,
)
from models.scoring.rerank import compute_device, gather_rows
from models.scoring.uncertainty import log_det, total_variance

logger = logging.getLogger(__name__)

DIRECTIONS: tuple[str, ...] = ("i2t", "t2i")
# Scores the evaluation reports but the service does not compute (not in SCORE_NAMES), so none
# is ever chosen as a reject score: total_variance is PCME++'s own uncertainty (issue 40).
DESCRIPTIVE_SCORES: tuple[str, ...] = ("total_variance",)


class EvaluationError(ValueError):
    """An evaluation that cannot run as asked (empty split, bad settings); says how to fix it."""


def check_eval_metric(metric: str) -> str:
    """`metric` if eval can rank with it: a models.distance.gaussian metric, or max_pair (pvse
    models: 1 - the best cosine over the K x K embedding pairs); UnknownMetricError otherwise."""
    if metric == MAX_PAIR:
        return metric
    try:
        return check_metric(metric)
    except UnknownMetricError as e:
        raise UnknownMetricError(f"{e}, or {MAX_PAIR} (pvse models)") from e


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
    ood_dir: str | None = None  # images unlike the dataset (e.g. photographs), for dataset shift
    extra_ood_dirs: tuple[str, ...] = ()  # more such folders, reported apart by folder name

    def __post_init__(self) -> None:
        for metric in self.metrics:
            check_eval_metric(metric)
        if self.mc_samples < 0 or self.shortlist_size < 1 or self.chunk_size < 1:
            raise EvaluationError("mc_samples must be >= 0, shortlist_size and chunk_size >= 1")
        if not self.temperatures or any(not t > 0 for t in self.temperatures):
            raise EvaluationError(f"temperatures must all be > 0; got {self.temperatures}")


@dataclass
class SplitEmbeddings:
    """Both galleries of one split, embedded, with the pairing and labels the metrics need."""

    dataset: PairedDataset
    images: Embeddings  # mu/logvar (I, D), mc_* (L, I, D) or None; pvse: embeddings (I, K, D)
    captions: Embeddings  # mu/logvar (C, D), mc_* (L, C, D) or None; pvse: (C, K, D)
    caption_image: np.ndarray  # (C,) int64 row of each caption's image
    image_labels: np.ndarray  # (I, K) 0/1 multi-hot over dataset.label_names
    encoders: dict[str, OnnxEncoder] = field(repr=False, default_factory=dict)


def torch_device(device: str) -> torch.device:
    """The scoring device (models.scoring.rerank.compute_device); EvaluationError if unknown."""
    try:
        return compute_device(device)
    except ValueError as e:
        raise EvaluationError(str(e)) from e


def _concat(parts: list[Embeddings]) -> Embeddings:
    """Batches joined along the items (axis 0, or 1 for the MC draws); a field that one batch
    lacks is None."""

    def join(name: str, axis: int = 0) -> np.ndarray | None:
        arrays = [getattr(p, name) for p in parts]
        return None if any(a is None for a in arrays) else np.concatenate(arrays, axis=axis)

    return Embeddings(
        mu=join("mu"),
        logvar=join("logvar"),
        mc_mu=join("mc_mu", 1),
        mc_logvar=join("mc_logvar", 1),
        embeddings=join("embeddings"),
        mc_embeddings=join("mc_embeddings", 1),
        novelty=join("novelty"),
    )


def multi_embeddings(embeddings: Embeddings, draws: bool = False) -> np.ndarray:
    """The K embeddings (N, K, D), or of the MC draws (L, N, K, D); EvaluationError when the
    encoder gave none (max_pair needs a pvse model)."""
    array = embeddings.mc_embeddings if draws else embeddings.embeddings
    if array is None:
        raise EvaluationError(
            f"metric {MAX_PAIR} needs the K embeddings of a pvse model; this model's encoders "
            "output only mu and logvar (choose a Gaussian metric with --metrics)"
        )
    return array


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


def image_label_matrix(dataset: PairedDataset) -> np.ndarray:
    """(I, K) 0/1 multi-hot of each image's labels over dataset.label_names (PMRP's vectors)."""
    label_col = {name: col for col, name in enumerate(dataset.label_names)}
    image_labels = np.zeros((len(dataset.images), len(label_col)), dtype=np.int64)
    for row, image in enumerate(dataset.images):
        image_labels[row, [label_col[label] for label in image.labels]] = 1
    return image_labels


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
    image_labels = image_label_matrix(dataset)
    torch_device(config.device)  # rejects an unknown device before the encoders load
    encoders = {m: OnnxEncoder(model_dir, m, device=config.device) for m in ("image", "text")}
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
    if metric == MAX_PAIR:
        gallery_k = torch.from_numpy(multi_embeddings(gallery)).to(device)  # (G, K, D)
        queries_k = multi_embeddings(queries)  # (Q, K, D)
        for start in range(0, queries_k.shape[0], chunk_size):
            chunk = torch.from_numpy(queries_k[start : start + chunk_size]).to(device)
            yield start, max_pair_distance(chunk, gallery_k)  # (c, G)
        return
    params = {"seed": seed} if metric == "match_prob" else {}
    mu_g = torch.from_numpy(gallery.mu).to(device)
    logvar_g = torch.from_numpy(gallery.logvar).to(device)
    for start in range(0, queries.mu.shape[0], chunk_size):
        mu_q = torch.from_numpy(queries.mu[start : start + chunk_size]).to(device)
        logvar_q = torch.from_numpy(queries.logvar[start : start + chunk_size]).to(device)
        yield start, pairwise_distance(metric, mu_q, logvar_q, mu_g, logvar_g, **params)


def direction_scores(
    metric: str,
    queries: Embeddings,
    gallery: Embeddings,
    shortlist: np.ndarray,
    config: EvalConfig,
    caption_query: bool | None = None,
) -> dict[str, np.ndarray]:
    """Every uncertainty score of every query over its shortlist (models.scoring), with the
    temperature-dependent ones once per temperature, named "<score>@T<t>", then the
    training-free baselines (models.scoring.baseline_scores) the learned ones must beat, and
    the DESCRIPTIVE_SCORES.
    caption_query: the queries are captions (True) or images (False), for top_mahalanobis;
    None leaves it out."""
    device = torch_device(config.device)
    parts: dict[str, list[np.ndarray]] = {}
    has_draws = queries.mc_mu is not None and queries.mc_mu.shape[0] >= 1
    for start in range(0, shortlist.shape[0], config.chunk_size):
        stop = min(start + config.chunk_size, shortlist.shape[0])
        rows = shortlist[start:stop]  # (c, m)
        query = tuple(
            torch.from_numpy(a[start:stop]).to(device) for a in (queries.mu, queries.logvar)
        )
        draws = None
        if has_draws:
            draws = tuple(
                torch.from_numpy(a[:, start:stop]).to(device)
                for a in (queries.mc_mu, queries.mc_logvar)
            )
        fit = means = None
        if metric == MAX_PAIR:
            distances, mc_distances = max_pair_shortlist_distances(
                queries, gallery, rows, slice(start, stop), has_draws, device
            )
        else:
            candidates = (
                gather_rows(gallery.mu, rows, device),
                gather_rows(gallery.logvar, rows, device),
            )
            distances, mc_distances = shortlist_distances(metric, query, draws, candidates)
            means = (query[0], candidates[0])
            if caption_query is not None:
                fit = CaptionFit(query[0], candidates, caption_query)
        mc_mu = None if draws is None else draws[0]
        novelty = None if queries.novelty is None else queries.novelty[start:stop]
        for t, temperature in enumerate(config.temperatures):
            scores = query_scores(
                query[1], distances, temperature, mc_mu, mc_distances, fit, novelty
            )
            for name, values in scores.available().items():
                if name in TEMPERATURE_SCORES:
                    parts.setdefault(f"{name}@T{temperature:g}", []).append(values)
                elif t == 0:
                    parts.setdefault(name, []).append(values)
        for name, values in chunk_baselines(distances, mc_distances, means).items():
            parts.setdefault(name, []).append(values)
        parts.setdefault("total_variance", []).append(
            total_variance(query[1]).double().cpu().numpy()
        )
    return {name: np.concatenate(values) for name, values in parts.items()}


def chunk_baselines(
    distances: torch.Tensor,
    mc_distances: torch.Tensor | None,
    means: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict[str, np.ndarray]:
    """The training-free baselines of a chunk of queries from its shortlist distances (c, m),
    its draws' (L, c, m) and the means of the queries (c, D) and candidates (c, m, D): they do
    not depend on the temperature, so computed once."""
    draws = None if mc_distances is None else mc_distances.double().cpu().numpy()
    pair = None if means is None else tuple(m.double().cpu().numpy() for m in means)
    return baseline_scores(distances.double().cpu().numpy(), draws, pair)


def max_pair_shortlist_distances(
    queries: Embeddings,
    gallery: Embeddings,
    rows: np.ndarray,
    chunk: slice,
    has_draws: bool,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """max_pair distances (c, m) of a chunk of queries and (L, c, m) of their MC draws' K
    embeddings to each query's shortlisted rows (c, m), as the service computes them."""
    candidates = torch.from_numpy(multi_embeddings(gallery)[rows]).to(device)  # (c, m, K, D)
    query = torch.from_numpy(multi_embeddings(queries)[chunk]).to(device)  # (c, K, D)
    distances = shortlist_max_pair_distance(query, candidates)  # (c, m)
    if not has_draws:
        return distances, None
    draws = torch.from_numpy(multi_embeddings(queries, draws=True)[:, chunk]).to(device)
    return distances, shortlist_max_pair_distance(draws, candidates)  # (L, c, m)


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


def is_single_object(caption: CaptionRecord) -> bool:
    """A caption that names one object by colour and shape, e.g. "a purple star"."""
    if len(caption.named) != 1:
        return False
    (only,) = caption.named
    return only.count == 1 and only.shape is not None and only.color is not None


def caption_query_subsets(
    captions: Sequence[CaptionRecord], result: RankingResult
) -> dict[str, float | int]:
    """t2i P@1 (%) of the captions that name one object, and over distinct caption texts
    (retrieval_metrics.per_distinct_query), with their query counts."""
    top1 = result.top1_hit["r_precision"]
    single = np.array([is_single_object(c) for c in captions], dtype=bool)
    answerable = result.relevant_count["r_precision"] > 0
    texts = [c.text for c, keep in zip(captions, answerable, strict=True) if keep]
    return {
        "P@1_single_object": 100.0 * float(top1[single].mean()) if single.any() else math.nan,
        "single_object_queries": int(single.sum()),
        "P@1_distinct_texts": per_distinct_query(top1[answerable], texts),
        "distinct_text_queries": len(set(texts)),
    }


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
) -> tuple[dict, dict[str, np.ndarray]]:
    """Retrieval, rejection and ambiguity figures of one direction with one metric.

    A query is answered correctly when its first result is a plausible match (the dataset's
    plausible-match matrix); rejection is judged on that, and each score's Spearman
    correlation with ln(#plausible matches) says whether it grows with ambiguity. Returns the
    report section and the per-query scores.
    """
    queries, gallery, positives, sets = direction_setup(split, direction)
    if split.image_labels.shape[1] == 0:  # no label vectors (e.g. COCO captions only): no PMRP
        sets = {"r_precision": sets["r_precision"]}
    device = torch_device(config.device)
    chunks = distance_chunks(metric, queries, gallery, config.chunk_size, device, config.seed)
    result = rank_queries(chunks, queries.mu.shape[0], positives, sets, config.shortlist_size)
    scores = direction_scores(
        metric, queries, gallery, result.shortlist, config, caption_query=direction == "t2i"
    )
    correct = result.top1_hit["r_precision"]
    ambiguity = np.log(np.maximum(result.relevant_count["r_precision"], 1))
    retrieval = summarize_ranking(result)
    if direction == "t2i":
        retrieval |= caption_query_subsets(split.dataset.captions, result)
    section = {
        "retrieval": retrieval,
        "rejection": rejection_summary(scores, correct, config.deciles, config.seed),
        "ambiguity_spearman": {name: spearman(v, ambiguity) for name, v in scores.items()},
    }
    return section, scores


def _selection_accuracy(
    metric: str, queries: tuple[Embeddings, Embeddings], candidates: tuple[Embeddings, Embeddings]
) -> dict[str, float]:
    """Binary selection (%): query view 0 (part A) should be closer to candidate 0 than to
    candidate 1, query view 1 (union A+B) closer to candidate 1; a tie counts as wrong."""

    def distance(query: Embeddings, candidate: Embeddings) -> np.ndarray:
        if metric == MAX_PAIR:
            a, b = (torch.from_numpy(multi_embeddings(e)) for e in (query, candidate))
            return shortlist_max_pair_distance(a, b[:, None]).double().numpy()[:, 0]  # (P,)
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

    def item_log_det(embeddings: Embeddings) -> np.ndarray:
        return log_det(torch.from_numpy(embeddings.logvar)).double().numpy()  # (P,)

    def summary(part_a: Embeddings, union: Embeddings) -> dict[str, float]:
        a, ab = item_log_det(part_a), item_log_det(union)
        return {
            "part_a": float(a.mean()),
            "union": float(ab.mean()),
            "a_larger": float(np.mean(a > ab)),
        }

    return {
        "tuples": len(pairs),
        "metrics": per_metric,
        "log_det": {"image": summary(image_a, image_ab), "text": summary(text_a, text_ab)},
    }


def log_det_summary(embeddings: Embeddings, bins: int, bounds: tuple[float, float]) -> dict:
    """Mean, std and histogram of the per-item log-det of one gallery, and the fraction of
    items with a variance dimension at one of the model's bounds."""
    logvar = torch.from_numpy(embeddings.logvar)
    values = log_det(logvar).double().numpy()
    counts, edges = np.histogram(values, bins=bins)
    return {
        "mean": float(values.mean()),
        "std": float(values.std()),
        "at_bound": fraction_at_bound(logvar, *bounds),
        "histogram": {"counts": counts.tolist(), "edges": edges.tolist()},
    }


def default_metrics(model_config: ModelConfig) -> dict[str, str]:
    """The metric each direction is ranked with when none is asked for, as the service ranks
    it: t2i searches the image gallery, i2t the caption gallery (ModelConfig.default_metric)."""
    return {"t2i": model_config.default_metric("image"), "i2t": model_config.default_metric("text")}


def direction_results(report: dict, metric: str = "") -> dict[str, dict]:
    """Each direction's section of `report`, ranked with `metric` ("" = the direction's
    default metric, `report["default_metrics"]`)."""
    return {d: report["metrics"][metric or report["default_metrics"][d]][d] for d in DIRECTIONS}


def evaluate_model(
    model_dir: Path | str,
    data_dir: Path | str,
    split: str = "test",
    config: EvalConfig | None = None,
) -> dict:
    """Every evaluation of issue 6 on one split, as a JSON-ready dict (models.evaluation.report
    renders it)."""
    config = config or EvalConfig()
    model_dir = Path(model_dir)
    dataset = load_dataset(data_dir, split)
    embedded = embed_split(model_dir, dataset, config)
    model_config = embedded.encoders["image"].config
    defaults = default_metrics(model_config)
    metrics = config.metrics or tuple(dict.fromkeys(defaults[d] for d in DIRECTIONS))
    bounds = model_config.logvar_bounds
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
        "default_metrics": defaults,
        "log_det": {
            "image": log_det_summary(embedded.images, config.histogram_bins, bounds),
            "text": log_det_summary(embedded.captions, config.histogram_bins, bounds),
        },
        "metrics": {},
    }
    ood = _ood_images(config.ood_dir, embedded, config) if config.ood_dir else None
    extra = {Path(d).name: _ood_images(d, embedded, config) for d in config.extra_ood_dirs}
    for metric in metrics:
        logger.info("evaluating %s", metric)
        per_direction, image_query_scores = {}, {}
        for direction in DIRECTIONS:
            per_direction[direction], scores = evaluate_direction(
                embedded, metric, direction, config
            )
            if direction == "i2t":
                image_query_scores = scores
        rsum = sum(per_direction[d]["retrieval"]["rsum"] for d in DIRECTIONS)
        report["metrics"][metric] = {"rsum": rsum, **per_direction}
        if ood is not None:
            report["metrics"][metric]["ood"] = ood_auroc(
                metric, ood, embedded.captions, image_query_scores, config
            )
        report["metrics"][metric]["no_match"] = no_match_rejection(embedded, metric, config)
        if extra:
            report["metrics"][metric]["ood_extra"] = {
                name: ood_auroc(metric, probes, embedded.captions, image_query_scores, config)
                for name, probes in extra.items()
            }
    report["crop"] = crop_experiment(embedded, metrics, config)
    return report


def _ood_images(ood_dir: str, embedded: SplitEmbeddings, config: EvalConfig) -> Embeddings:
    """MC-dropout embeddings of every image file in `ood_dir` (sorted by name)."""
    paths = sorted(
        p for p in Path(ood_dir).iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg")
    )
    if not paths:
        raise EvaluationError(f"--ood {ood_dir} holds no .png or .jpg images")
    pil = [load_image(p) for p in paths]
    encoder = embedded.encoders["image"]
    parts = [
        encoder.encode_images(pil[s : s + config.batch_size], config.mc_samples, config.seed + b)
        for b, s in enumerate(range(0, len(pil), config.batch_size))
    ]
    return _concat(parts)


def ood_auroc(
    metric: str,
    ood: Embeddings,
    captions: Embeddings,
    in_distribution: dict[str, np.ndarray],
    config: EvalConfig,
) -> dict:
    """Dataset shift (Hama et al. 4.5): AUROC of each score for telling the out-of-distribution
    image queries from the split's own images (higher = the OOD images look more uncertain),
    and the fraction of them each score rejects at the threshold that rejects
    SHIFT_FALSE_REJECTION of the split's own images."""
    scores = shortlist_scores(metric, ood, captions, config, caption_query=False)
    shared = [name for name in scores if name in in_distribution]
    return {
        "images": int(ood.mu.shape[0]),
        "auroc": {name: auroc(in_distribution[name], scores[name]) for name in shared},
        "rejected": {name: rejected_share(in_distribution[name], scores[name]) for name in shared},
    }


def shortlist_scores(
    metric: str, queries: Embeddings, gallery: Embeddings, config: EvalConfig, caption_query: bool
) -> dict[str, np.ndarray]:
    """Every score of `queries` over their top `shortlist_size` of `gallery` (exhaustive
    distances), for probes outside the split's own query-gallery pairing."""
    device = torch_device(config.device)
    chunks = distance_chunks(metric, queries, gallery, config.chunk_size, device, config.seed)
    m = min(config.shortlist_size, gallery.mu.shape[0])
    shortlist = np.concatenate(
        [torch.topk(d, m, dim=1, largest=False).indices.cpu().numpy() for _, d in chunks]
    )  # (Q, m)
    return direction_scores(metric, queries, gallery, shortlist, config, caption_query)


SHIFT_FALSE_REJECTION = 0.05
# Share of the split's images taken out of the gallery in the no-match experiment.
NO_MATCH_REMOVED = 0.5


def no_match_rejection(split: SplitEmbeddings, metric: str, config: EvalConfig) -> dict:
    """Captions with nothing to find: a seeded half of the split's images is taken out of the
    image gallery, which leaves some captions without any plausible match in what remains.
    AUROC of each score (the learned ones and the training-free baselines) for telling those
    captions from the ones that still have a match, and the share of them rejected at the
    threshold that rejects 5% of the answerable ones (as for dataset shift)."""
    images, captions = split.dataset.images, split.dataset.captions
    kept = np.random.default_rng(config.seed).random(len(images)) >= NO_MATCH_REMOVED
    gallery = _rows(split.images, kept)
    remaining = [image for image, keep in zip(images, kept, strict=True) if keep]
    answerable = plausible_match_matrix(captions, remaining).any(1)  # (Q,)
    scores = shortlist_scores(metric, split.captions, gallery, config, caption_query=True)
    has, lacks = answerable, ~answerable
    counts = {"captions": len(captions), "no_match": int(lacks.sum())}
    counts["gallery_images"] = int(kept.sum())
    if not has.any() or not lacks.any():
        return {**counts, "auroc": {}, "rejected": {}}
    return {
        **counts,
        "auroc": {name: auroc(v[has], v[lacks]) for name, v in scores.items()},
        "rejected": {name: rejected_share(v[has], v[lacks]) for name, v in scores.items()},
    }


def _rows(embeddings: Embeddings, mask: np.ndarray) -> Embeddings:
    """The items of `embeddings` where `mask` is true (draws and pvse vectors included)."""

    def pick(a: np.ndarray | None, axis: int) -> np.ndarray | None:
        return None if a is None else np.compress(mask, a, axis=axis)

    return Embeddings(
        mu=pick(embeddings.mu, 0), logvar=pick(embeddings.logvar, 0),
        mc_mu=pick(embeddings.mc_mu, 1), mc_logvar=pick(embeddings.mc_logvar, 1),
        embeddings=pick(embeddings.embeddings, 0), mc_embeddings=pick(embeddings.mc_embeddings, 1),
        identical_draws=embeddings.identical_draws, novelty=pick(embeddings.novelty, 0),
    )  # fmt: skip


def rejected_share(in_distribution: np.ndarray, shifted: np.ndarray) -> float:
    """Fraction of `shifted` strictly above the (1 - SHIFT_FALSE_REJECTION) quantile of
    `in_distribution`: how often a threshold that refuses 5% of the dataset's own queries
    refuses the shifted ones."""
    threshold = np.quantile(in_distribution, 1.0 - SHIFT_FALSE_REJECTION)
    return float(np.mean(shifted > threshold))
