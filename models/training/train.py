"""Training loop: Adam, the objective of models.objectives, validation with the model's metric
(its served one where it names search_with) judged by plausible matches, lr decay on plateau,
early stopping with the best-on-validation checkpoint, resumable epochs, ONNX export at the
end."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from tqdm import tqdm

from models.datasets.records import load_dataset
from models.distance.gaussian import pairwise_distance
from models.evaluation.retrieval_metrics import count_top_hits, first_positive_rank, recall_at_k
from models.networks.feature_novelty import save_bank
from models.networks.heads import fraction_at_bound
from models.networks.model_config import (
    CHECKPOINT_FILE,
    TOKENIZER_FILE,
    VOCAB_FILE,
    ConfigError,
    ModelConfig,
    TrainConfig,
)
from models.networks.probabilistic_model import (
    HeadsModel,
    ProbabilisticModel,
    build_model,
    load_model,
    save_checkpoint,
)
from models.networks.tokenizer import PAD, UNK, Tokenizer
from models.objectives import INITIAL_MATCH, BatchEmbeddings, batch_loss, match_learning_rate
from models.objectives.hinge import similarity_matrix
from models.objectives.labels import ImageProbes
from models.onnx.export import export_encoders
from models.pvse.training import pvse_batch_loss, pvse_similarity
from models.scoring.known_words import KnownWords
from models.scoring.uncertainty import log_det
from models.training.batches import PreparedBatch, prefetched, prepare_batch
from models.training.feature_splits import load_feature_splits
from models.training.gallery_spread import GALLERY_TARGETS, GallerySpread
from models.training.mixed_samples import soft_match_targets
from models.training.training_data import (
    SplitTensors,
    caption_batch,
    epoch_batches,
    image_batch,
    load_splits,
)

OUTLIER_STREAM = 7  # the synthetic outliers' random stream, apart from batches and dropout
MIX_STREAM = 11  # the mixed samples' random stream (mixed_sample_fraction)
LAST_STATE_FILE = "last.pt"  # optimizer + model state after the latest epoch (for --resume)
HISTORY_FILE = "history.json"  # one report per epoch
RECALL_KS = (1, 5, 10)
# What picks the checkpoint: plausible t2i P@1 and R-Precision, and exact R@5. Not i2t P@1:
# ranking the vaguest captions ("an object") first makes it near 100% for a useless model, and
# an early epoch that does so would be kept.
VALIDATION_SCORE = ("t2i_P@1", "i2t_R-P", "t2i_R-P", "i2t_R@5", "t2i_R@5")


@dataclass
class EpochReport:
    """One line of the training log.

    `recalls` holds exact-pair R@K and the plausible-match P@1 and R-Precision per direction
    (%); `score`, the mean of VALIDATION_SCORE, picks the checkpoint and decides when to stop.
    `at_bound` is the fraction of validation items with a variance dimension at a bound.
    """

    epoch: int
    loss: float
    recalls: dict[str, float]
    log_det_image: float
    log_det_caption: float
    at_bound: float
    lr: float
    seconds: float

    @property
    def rsum(self) -> float:
        return sum(v for k, v in self.recalls.items() if "_R@" in k)

    @property
    def score(self) -> float:
        return sum(self.recalls[k] for k in VALIDATION_SCORE) / len(VALIDATION_SCORE)

    def line(self) -> str:
        r = self.recalls
        return (
            f"epoch {self.epoch:3d}  loss {self.loss:.4f}  "
            f"P@1 i2t/t2i {r['i2t_P@1']:.1f}/{r['t2i_P@1']:.1f}  "
            f"R-P {r['i2t_R-P']:.1f}/{r['t2i_R-P']:.1f}  rsum {self.rsum:.1f}  "
            f"logdet img {self.log_det_image:.2f} cap {self.log_det_caption:.2f}  "
            f"at bound {100 * self.at_bound:.1f}%  lr {self.lr:.0e}  ({self.seconds:.1f}s)"
        )


@contextlib.contextmanager
def deterministic(seed: int) -> Iterator[None]:
    """Seed torch and use deterministic kernels for the duration of a run."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


@contextlib.contextmanager
def _threads_for_heads(config: ModelConfig) -> Iterator[None]:
    """One torch thread while the heads of a model on backbones train on cached features:
    their matrices are small enough that a second thread costs more in hand-offs than it
    gains (the demo's heads: 1.9 s an epoch on 2 threads, 1.3 s on 1, on 2 cores). The
    backbone features, computed before, keep the command's threads."""
    if not config.pretrained:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def pick_device() -> torch.device:
    """CUDA when torch sees a GPU, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@torch.no_grad()
def encode_split(
    model: ProbabilisticModel, split: SplitTensors, device: torch.device, batch_size: int = 512
) -> tuple[torch.Tensor, ...]:
    """Deterministic (image_mu, image_logvar, caption_mu, caption_logvar) of a whole split."""
    model.eval()
    parts: list[list[torch.Tensor]] = [[], [], [], []]
    for start in range(0, split.num_images, batch_size):
        rows = torch.arange(start, min(start + batch_size, split.num_images))
        mu, logvar = model.encode_images(image_batch(split, rows, model.config).to(device))
        parts[0].append(mu)
        parts[1].append(logvar)
    for start in range(0, split.num_captions, batch_size):
        rows = torch.arange(start, min(start + batch_size, split.num_captions))
        ids, lengths = caption_batch(split, rows)
        mu, logvar = model.encode_texts(ids.to(device), lengths.to(device))
        parts[2].append(mu)
        parts[3].append(logvar)
    return tuple(torch.cat(p) for p in parts)


def _plausible_precisions(distances: torch.Tensor, plausible: torch.Tensor) -> tuple[float, float]:
    """P@1 and R-Precision (%) of queries (rows) ranking a gallery (columns) by distance, with
    ties broken against the model; queries with no plausible match are left out."""
    counts = plausible.sum(dim=1)  # (Q,)
    keep = counts > 0
    distances, plausible, counts = distances[keep], plausible[keep], counts[keep]
    top1 = count_top_hits(distances, plausible, torch.ones_like(counts)).double()
    r_hits = count_top_hits(distances, plausible, counts).double() / counts.double()
    return 100.0 * float(top1.mean()), 100.0 * float(r_hits.mean())


def validate(
    model: ProbabilisticModel, split: SplitTensors, device: torch.device
) -> tuple[dict[str, float], float, float, float]:
    """Exact-pair R@1/5/10 and plausible-match P@1 and R-Precision in both directions, the
    mean log-det of each modality and the fraction of items with a variance at a bound."""
    image_mu, image_logvar, caption_mu, caption_logvar = encode_split(model, split, device)
    config = model.config
    embedded = (image_mu, image_logvar, caption_mu, caption_logvar)
    distances, caption_distances = _validation_distances(model, split, embedded, device)
    owner = split.caption_image  # (N_cap,)
    positive = owner[None, :] == torch.arange(split.num_images)[:, None]  # (N_img, N_cap)
    i2t = first_positive_rank(distances, positive).numpy()
    t2i = first_positive_rank(caption_distances, positive.T).numpy()
    recalls = {
        f"{name}_R@{k}": recall_at_k(ranks, k)
        for name, ranks in (("i2t", i2t), ("t2i", t2i))
        for k in RECALL_KS
    }
    plausible = split.plausible if split.plausible is not None else positive.T  # (N_cap, N_img)
    recalls["t2i_P@1"], recalls["t2i_R-P"] = _plausible_precisions(caption_distances, plausible)
    recalls["i2t_P@1"], recalls["i2t_R-P"] = _plausible_precisions(distances, plausible.T)
    low, high = config.logvar_bounds
    gaussian = [lv for lv, g in ((image_logvar, config.gaussian_images),
                                 (caption_logvar, config.gaussian_captions)) if g]  # fmt: skip
    at_bound = fraction_at_bound(torch.cat(gaussian).cpu(), low, high) if gaussian else 0.0
    return (
        recalls,
        float(log_det(image_logvar).mean()),
        float(log_det(caption_logvar).mean()),
        at_bound,
    )


def _validation_distances(
    model: ProbabilisticModel,
    split: SplitTensors,
    embedded: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(image-query distances (N_img, N_cap), caption-query distances (N_cap, N_img)) on CPU.

    A model that names `search_with` is validated as the service ranks it (each direction by
    its default metric, the query first: query_mahalanobis reads the query's variance), so the
    best-on-validation checkpoint is the best at what it will serve; any other by its training
    metric's similarity, one matrix for both directions."""
    config = model.config
    image_mu, image_logvar, caption_mu, caption_logvar = embedded
    if config.search_with and config.model_type != "pvse":
        images, captions = (image_mu, image_logvar), (caption_mu, caption_logvar)
        i2t = pairwise_distance(config.default_metric("text"), *images, *captions)
        t2i = pairwise_distance(config.default_metric("image"), *captions, *images)
        return i2t.float().cpu(), t2i.float().cpu()
    if config.model_type == "pvse":
        similarity = pvse_similarity(model, split, device)  # (N_img, N_cap)
    else:
        params = {"seed": 0} if config.metric == "match_prob" else {}
        similarity = similarity_matrix(
            config.model_type, config.metric, *embedded, **params
        )  # (N_img, N_cap)
    distances = -similarity.float().cpu()
    return distances, distances.T


def train_epoch(
    model: ProbabilisticModel,
    optimizer: torch.optim.Optimizer,
    split: SplitTensors,
    config: TrainConfig,
    epoch: int,
    device: torch.device,
    progress: bool,
    probes: ImageProbes | None = None,
    average: AveragedModel | None = None,
) -> float:
    """One pass over the training images; returns the mean batch loss (with `probes`, plus
    their weighted losses). `average`, if any, takes the weights after every step."""
    targets = _gallery_targets(model, split, config, device)
    model.train()
    generator = torch.Generator(device=device).manual_seed(config.seed * 100_003 + epoch)
    negatives = "sum" if epoch < config.warmup_epochs else config.negatives
    outlier_rng = np.random.default_rng([config.seed, epoch, OUTLIER_STREAM])
    mix_rng = np.random.default_rng([config.seed, epoch, MIX_STREAM])
    total, steps = 0.0, 0
    batches = list(
        epoch_batches(split, config.batch_size, config.captions_per_image, config.seed, epoch)
    )
    prepare = functools.partial(
        prepare_batch, split=split, config=config, model_config=model.config,
        outlier_rng=outlier_rng, mix_rng=mix_rng,
    )  # fmt: skip
    for batch in tqdm(
        prefetched(batches, prepare), total=len(batches), desc=f"epoch {epoch}", leave=False,
        disable=not progress,
    ):  # fmt: skip
        if model.config.model_type == "pvse":
            plausible = None if batch.plausible is None else batch.plausible.to(device)
            loss = pvse_batch_loss(
                model, batch.images.to(device), (batch.ids.to(device), batch.lengths.to(device)),
                batch.rows[2].to(device), plausible, config, negatives, generator,
            )  # fmt: skip
        else:
            loss = _gaussian_batch_loss(
                model, split, config, batch, negatives, generator, probes, targets
            )
        total, steps = total + _step(model, optimizer, loss, config), steps + 1
        if average is not None:
            average.update_parameters(model)
    return total / max(steps, 1)


def _gallery_targets(
    model: ProbabilisticModel, split: SplitTensors, config: TrainConfig, device: torch.device
) -> GallerySpread | None:
    """The epoch's whole-gallery targets (variance_objective "gallery_spread",
    "plausible_count" or "partner_distance"), from the deterministic means of the heads as they
    start the epoch; None for other objectives."""
    targets = GALLERY_TARGETS.get(config.variance_objective)
    if targets is None or model.config.model_type == "pvse":
        return None
    if isinstance(model, HeadsModel):
        image_mu, caption_mu = encode_split_means(model, split, device)
    else:
        image_mu, _, caption_mu, _ = encode_split(model, split, device)
    return targets(image_mu, caption_mu, split.plausible_pairs)


@torch.no_grad()
def encode_split_means(
    model: HeadsModel, split: SplitTensors, device: torch.device, batch_size: int = 512
) -> tuple[torch.Tensor, torch.Tensor]:
    """The deterministic means of a split's images and captions, as encode_split gives them,
    without the log-variance heads: the whole-gallery targets read the means alone, and on
    the style backbone's 7,032 features skipping the variance head nearly halves this pass (0.58
    against 1.03 s per epoch for the demo's training split, the same targets to the bit)."""
    model.eval()
    encoders = ((model.image_encoder, split.pixels), (model.text_encoder, split.ids))
    return tuple(
        torch.cat(
            [
                heads.means(rows[s : s + batch_size].to(device))
                for s in range(0, len(rows), batch_size)
            ]
        )
        for heads, rows in encoders
    )  # type: ignore[return-value]


def _gaussian_batch_loss(
    model: ProbabilisticModel,
    split: SplitTensors,
    config: TrainConfig,
    batch: PreparedBatch,
    negatives: str,
    generator: torch.Generator,
    probes: ImageProbes | None,
    targets: GallerySpread | None = None,
) -> torch.Tensor:
    """The objective of one batch of a non-pvse model. Synthetic outliers, when asked for,
    join the images after the real ones and match no caption; swapped images are encoded with
    them and scored apart. `targets`: the epoch's whole-gallery targets, if any."""
    device = next(model.parameters()).device
    image_rows, caption_rows, owner = batch.rows
    owner = owner.to(device)
    (image_mu, image_logvar), features, swapped_images = _encode_with_swaps(
        model, batch.images.to(device), batch.image_swaps, generator
    )
    captions = (batch.ids.to(device), batch.lengths.to(device))
    caption_mu, caption_logvar = model.encode_texts(*captions, generator, stochastic=True)
    plausible = None if batch.plausible is None else batch.plausible.to(device)
    own = torch.arange(len(image_mu), device=device)[:, None] == owner[None, :]
    matches = own if config.positives == "pairs" else plausible
    if config.mixed_sample_fraction > 0 or config.match_label_smoothing > 0:
        # float soft labels: the pcmepp objective, the only one allowed these, takes them
        matches = soft_match_targets(matches, batch.mixed, config.match_label_smoothing)
    embedded = BatchEmbeddings(
        image_mu, image_logvar, caption_mu, caption_logvar, owner, matches, plausible,
        batch.outliers, _swapped_captions(model, split, caption_rows, generator, config),
        swapped_images,
        None if targets is None else targets.of_batch(image_rows, caption_rows, batch.outliers),
    )  # fmt: skip
    match = (model.match_scale, model.match_shift)
    loss = batch_loss(embedded, model.config, config, match, negatives, generator)
    if probes is not None:
        real = len(image_rows)
        labels, attributes = (t[image_rows].to(device) for t in (split.labels, split.attributes))
        loss = loss + probes.loss(image_mu[:real], features[:real], labels, attributes)
    return loss


def _encode_with_swaps(
    model: ProbabilisticModel,
    images: torch.Tensor,
    image_swaps: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    generator: torch.Generator,
) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """Encode the batch's images and its swapped images in one pass (one set of batch-norm
    statistics): ((mu, logvar) of `images`, their trunk features, (mu, logvar, caption
    position) of each swapped image per caption it makes miss, or None)."""
    if image_swaps is None:
        embedded, features = model.encode_images_with_features(images, generator, True)
        return embedded, features, None
    pixels, missed, position = (t.to(images.device) for t in image_swaps)
    both = torch.cat([images, pixels])
    (mu, logvar), features = model.encode_images_with_features(both, generator, True)
    real = len(images)
    swapped = (mu[real:][position], logvar[real:][position], missed)
    return (mu[:real], logvar[:real]), features[:real], swapped


def _swapped_captions(
    model: ProbabilisticModel,
    split: SplitTensors,
    caption_rows: torch.Tensor,
    generator: torch.Generator,
    config: TrainConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The batch's counterfactual captions, embedded: (mu, logvar, caption position), or None
    when the run does not use them."""
    if config.counterfactual_weight == 0 or split.counterfactuals is None:
        return None
    ids, lengths, of = split.counterfactuals.of(caption_rows)
    if len(of) == 0:
        return None
    device = next(model.parameters()).device
    mu, logvar = model.encode_texts(ids.to(device), lengths.to(device), generator, stochastic=True)
    return mu, logvar, of.to(device)


def _step(
    model: ProbabilisticModel,
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    config: TrainConfig,
) -> float:
    """One optimiser step on `loss` (gradients clipped); returns the loss."""
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    return loss.item()


def start_match(model: ProbabilisticModel, objective: str) -> None:
    """Set the match logit's a and b to where `objective` starts them (INITIAL_MATCH)."""
    if objective in INITIAL_MATCH:
        scale, shift = INITIAL_MATCH[objective]
        with torch.no_grad():
            model.match_log_scale.fill_(math.log(scale))
            model.match_shift.fill_(shift)


@dataclass
class TrainResult:
    """What a run produced: the model dir, the best epoch's recalls and every epoch's report."""

    model_dir: Path
    best_epoch: int
    best_recalls: dict[str, float]
    history: list[dict[str, Any]]
    onnx_max_difference: dict[str, float]


def _start_state(
    out_dir: Path, model_config: ModelConfig, train_config: TrainConfig, resume: bool
) -> tuple[ModelConfig, TrainConfig, dict[str, Any] | None]:
    """Configs to train with, and the saved state of the last epoch when resuming."""
    state_path = out_dir / LAST_STATE_FILE
    if not resume:
        if state_path.exists() or (out_dir / CHECKPOINT_FILE).exists():
            raise ConfigError(
                f"{out_dir} already holds a trained model; pass --resume to "
                "continue it or choose another --out"
            )
        return model_config, train_config, None
    if not state_path.is_file():
        raise ConfigError(f"nothing to resume: {state_path} not found")
    state = torch.load(state_path, map_location="cpu", weights_only=True)
    saved = TrainConfig(**state["train_config"])
    return (
        ModelConfig.from_dict(state["model_config"]),
        dataclasses.replace(saved, epochs=train_config.epochs),
        state,
    )


def _save_epoch_state(
    out_dir: Path,
    model: ProbabilisticModel,
    model_config: ModelConfig,
    train_config: TrainConfig,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    history: list[dict[str, Any]],
    best: dict[str, Any],
    probes: ImageProbes | None = None,
    average: AveragedModel | None = None,
) -> None:
    """Write last.pt (everything --resume needs) and history.json after an epoch."""
    torch.save(
        {
            "probes": probes.state_dict() if probes is not None else None,
            "average": average.state_dict() if average is not None else None,
            "model_config": model_config.to_dict(),
            "train_config": dataclasses.asdict(train_config),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "history": history,
            "best": best,
        },
        out_dir / LAST_STATE_FILE,
    )
    (out_dir / HISTORY_FILE).write_text(json.dumps(history, indent=1) + "\n")


def _training_info(
    data_dir: Path,
    train_config: TrainConfig,
    train_split: SplitTensors,
    val_split: SplitTensors,
    device: torch.device,
) -> dict[str, Any]:
    """What model.json records under "training"."""
    return {
        **dataclasses.asdict(train_config),
        "data": str(data_dir),
        "train_images": train_split.num_images,
        "train_captions": train_split.num_captions,
        "val_images": val_split.num_images,
        "val_captions": val_split.num_captions,
        "device": device.type,
    }


def _training_splits(
    data_dir: Path,
    out_dir: Path,
    model_config: ModelConfig,
    train_config: TrainConfig,
    resumed: bool,
    features: Path | None = None,
) -> tuple[SplitTensors, SplitTensors, ModelConfig]:
    """The train and val splits and the config completed from the data; writes the model
    dir's tokenizer: the vocabulary built from the train captions (vocab.json, reused when
    resuming), or a pretrained text backbone's tokenizer.json."""
    if features is not None and not model_config.pretrained:
        raise ConfigError("--features trains heads on backbone vectors: name both backbones too")
    out_dir.mkdir(parents=True, exist_ok=True)
    if model_config.pretrained:
        _refuse_for_backbones(train_config)
        train_split, val_split, model_config, text = load_feature_splits(
            data_dir, model_config, features
        )
        if text.tokenizer_file is not None:
            shutil.copyfile(text.tokenizer_file, out_dir / TOKENIZER_FILE)
        train_captions = load_dataset(data_dir, "train").captions
        KnownWords.from_captions(c.text for c in train_captions).save(out_dir)
        return train_split, val_split, model_config
    tokenizer = Tokenizer.load(out_dir / VOCAB_FILE) if resumed else None
    swaps = train_config.seed if train_config.counterfactual_weight > 0 else None
    train_split, val_split, tokenizer = load_splits(
        data_dir,
        model_config,
        tokenizer,
        swaps,
        train_config.counterfactuals,
        tuple(train_config.caption_swaps.split(",")),
    )
    tokenizer.save(out_dir / VOCAB_FILE)
    KnownWords(t for t in tokenizer.tokens if t not in (PAD, UNK)).save(out_dir)
    return train_split, val_split, model_config.replace(vocab_size=len(tokenizer))


def _fit_variance_inputs(model: ProbabilisticModel, split: SplitTensors) -> None:
    """Standardise the backbone vectors a pretrained model's variance heads read
    (variance_reads_backbone) with the train split's mean and sd."""
    for encoder, features in ((model.image_encoder, split.pixels), (model.text_encoder, split.ids)):
        standardize = getattr(encoder, "standardize", None)
        if standardize is not None:
            standardize.fit(features.float())


def _projected(
    model: ProbabilisticModel, train: SplitTensors, val: SplitTensors
) -> tuple[SplitTensors, SplitTensors]:
    """With image_components, fit the image projection on the train split's backbone vectors
    and return both splits with their image vectors projected, once for the whole training
    (a resumed run fits the same projection: the fit is seeded)."""
    projection = getattr(model, "image_projection", None)
    if projection is None:
        return train, val
    try:
        projection.fit(train.pixels)
    except ValueError as error:
        raise ConfigError(f"image_components: {error}; choose fewer") from error
    with torch.no_grad():
        return tuple(  # type: ignore[return-value]
            dataclasses.replace(split, pixels=_project(projection, split.pixels))
            for split in (train, val)
        )


def _project(projection: torch.nn.Module, vectors: torch.Tensor) -> torch.Tensor:
    """The vectors projected where the projection lives, returned where they were."""
    device = projection.centre.device
    return projection(vectors.to(device).float()).to(vectors.device)


def _fit_novelty(model: ProbabilisticModel, split: SplitTensors, seed: int, out: Path) -> None:
    """Fill the image heads' novelty bank from the train split's backbone vectors and save it
    into the model dir (models on pretrained backbones; a resumed run fits the same bank)."""
    novelty = getattr(model.image_encoder, "novelty", None)
    if novelty is not None:
        novelty.fit(split.pixels, seed)
        save_bank(novelty, out)


def _refuse_for_backbones(config: TrainConfig) -> None:
    """The training aids that need pixels or a trunk to train: synthetic outlier images,
    swapped captions and images, the label and attribute probes of the trunk, and mixed
    samples (a mixture of two cached feature vectors is no feature of a mixed image)."""
    for name in (
        "outlier_fraction",
        "mixed_sample_fraction",
        "counterfactual_weight",
        "label_weight",
        "attribute_weight",
    ):
        if getattr(config, name):
            raise ConfigError(f"{name} is not supported on pretrained backbones; leave it at 0")


def parameter_groups(model: ProbabilisticModel, config: TrainConfig) -> list[dict[str, Any]]:
    """The encoders at `lr` with `weight_decay`, the match probability's a and b at
    `match_learning_rate` without it."""
    match = [model.match_log_scale, model.match_shift]
    ids = {id(p) for p in match}
    encoders = [p for p in model.parameters() if id(p) not in ids]
    match_lr = match_learning_rate(config)
    return [
        {"params": encoders, "lr": config.lr, "weight_decay": config.weight_decay},
        {"params": match, "lr": match_lr, "weight_decay": 0.0},
    ]


def _optimizer(groups: list[dict[str, Any]], config: TrainConfig) -> torch.optim.Optimizer:
    """Adam, or AdamW (decay decoupled from the gradient's scale) when weight_decay is set."""
    return torch.optim.AdamW(groups) if config.weight_decay else torch.optim.Adam(groups)


def _image_probes(
    model_config: ModelConfig, train_config: TrainConfig, split: SplitTensors
) -> ImageProbes | None:
    """The probes of `label_weight` and `attribute_weight` (None when both are 0); refuses
    the options a pvse model cannot train with, and a probe the dataset has no targets for."""
    if model_config.model_type == "pvse":
        for name in (
            "label_weight",
            "attribute_weight",
            "outlier_fraction",
            "outlier_ranking_weight",
            "counterfactual_weight",
            "mixed_sample_fraction",
            "match_label_smoothing",
        ):
            if getattr(train_config, name):
                raise ConfigError(f"{name} is not supported for pvse models; leave it at 0")
    weights = (train_config.label_weight, train_config.attribute_weight)
    if not any(weights):
        return None
    targets = (split.labels, split.attributes)
    needs = ("image labels (dataset.json 'label_names')", "object annotations (image 'objects')")
    for name, weight, target, need in zip(
        ("label_weight", "attribute_weight"), weights, targets, needs, strict=True
    ):
        if weight and (target is None or target.shape[1] == 0):
            raise ConfigError(f"{name} needs a dataset with {need}")
    num_labels, num_attributes = (0 if t is None else t.shape[1] for t in targets)
    return ImageProbes(
        model_config.embed_dim, num_labels, model_config.image_features, num_attributes, weights
    )


def _moving_average(model: ProbabilisticModel, decay: float) -> AveragedModel | None:
    """The exponential moving average of `model`'s weights at `decay` (None when 0): after
    step t it holds decay * average + (1 - decay) * weights, starting at the weights of the
    first step. Buffers (batch-norm statistics, fitted standardisations, the novelty bank) are
    not averaged: torch copies the model's into it after every step."""
    if decay == 0.0:
        return None
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=False)


def _patience_spent(history: list[dict[str, Any]], best: dict[str, Any], patience: int) -> bool:
    """Whether `patience` epochs have passed since the best one (patience 0: never stop)."""
    return patience > 0 and len(history) - int(best["epoch"]) >= patience


def train(
    data_dir: Path | str,
    out_dir: Path | str,
    model_config: ModelConfig,
    train_config: TrainConfig,
    resume: bool = False,
    progress: bool = True,
    export: bool = True,
    log: Callable[[str], None] = tqdm.write,
    features: Path | None = None,
) -> TrainResult:
    """Train on DATA_DIR and write OUT_DIR: model.json, checkpoint.pt (the epoch with the best
    validation score), vocab.json, known_words.json, history.json, last.pt and the two ONNX
    encoders.

    The learning rate falls by `lr_decay` after `lr_patience` epochs without a better
    validation score, and training stops after `patience` such epochs (or at `epochs`).

    With `resume`, the model and training configs, vocabulary, weights, optimizer and epoch
    counter come from OUT_DIR/last.pt and training continues up to `train_config.epochs`;
    the result is bit-identical to an uninterrupted run on the same machine.

    A model on pretrained backbones trains its heads on the backbones' features, computed once
    and cached beside the dataset, or read from `features`, a folder of the user's own vectors
    (models.training.feature_splits).
    """
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    model_config, train_config, state = _start_state(out_dir, model_config, train_config, resume)
    with deterministic(train_config.seed), contextlib.ExitStack() as stack:
        train_split, val_split, model_config = _training_splits(
            data_dir, out_dir, model_config, train_config, state is not None, features
        )
        stack.enter_context(_threads_for_heads(model_config))
        device = pick_device()
        model = build_model(model_config).to(device)
        start_match(model, train_config.objective)  # a resumed run loads its own below
        backbone_vectors = train_split  # the novelty bank keeps them whole
        train_split, val_split = _projected(model, train_split, val_split)
        _fit_novelty(model, backbone_vectors, train_config.seed, out_dir)
        _fit_variance_inputs(model, train_split)
        probes = _image_probes(model_config, train_config, train_split)
        groups = parameter_groups(model, train_config)
        if probes is not None:
            probes.to(device)
            groups.append(
                {"params": list(probes.parameters()), "lr": train_config.lr, "weight_decay": 0.0}
            )
        optimizer = _optimizer(groups, train_config)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="max", factor=train_config.lr_decay, patience=train_config.lr_patience
        )
        history: list[dict[str, Any]] = state["history"] if state else []
        best: dict[str, Any] = (
            state["best"] if state else {"score": -1.0, "epoch": 0, "recalls": {}}
        )
        average = _moving_average(model, train_config.ema_decay)
        if state:
            model.load_state_dict(state["model"])
            if average is not None:
                average.load_state_dict(state["average"])
            if probes is not None:
                probes.load_state_dict(state["probes"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
        info = _training_info(data_dir, train_config, train_split, val_split, device)
        for epoch in range(len(history), train_config.epochs):
            if _patience_spent(history, best, train_config.patience):
                log(f"stopping: no better validation score for {train_config.patience} epochs")
                break
            started = time.perf_counter()
            lr = optimizer.param_groups[0]["lr"]
            loss = train_epoch(
                model, optimizer, train_split, train_config, epoch, device, progress, probes,
                average,
            )  # fmt: skip
            kept = model if average is None else average.module
            recalls, ld_image, ld_caption, at_bound = validate(kept, val_split, device)
            report = EpochReport(
                epoch + 1, loss, recalls, ld_image, ld_caption, at_bound, lr,
                time.perf_counter() - started,
            )  # fmt: skip
            scheduler.step(report.score)
            log(report.line())
            history.append(
                dataclasses.asdict(report) | {"rsum": report.rsum, "score": report.score}
            )
            if report.score > best["score"]:
                best = {
                    "score": report.score,
                    "rsum": report.rsum,
                    "epoch": epoch + 1,
                    "recalls": recalls,
                    "log_det_image": ld_image,
                    "log_det_caption": ld_caption,
                    "at_bound": at_bound,
                }
                kept.config = model_config.replace(training=info, validation=best)
                save_checkpoint(kept, out_dir / CHECKPOINT_FILE, epoch + 1)
                kept.config.save(out_dir)
            _save_epoch_state(
                out_dir, model, model_config, train_config, optimizer, scheduler, history, best,
                probes, average,
            )  # fmt: skip
    parity = export_encoders(load_model(out_dir), out_dir) if export else {}
    return TrainResult(out_dir, int(best["epoch"]), dict(best["recalls"]), history, parity)
