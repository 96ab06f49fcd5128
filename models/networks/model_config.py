"""Architecture, preprocessing and training settings of a model dir, stored as model.json.

A field annotated with Option is an option of `probsearch train` (--field-name, the field's
type and default, the Option's help; models.cli builds the options from the fields)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from models.distance.gaussian import METRICS as GAUSSIAN_METRICS

ModelType = Literal["gcie", "gce", "gie", "vse", "pvse"]
# How PCME's and PCME++'s match BCE weighs its pairs (models.objectives.match_probability).
MATCH_WEIGHTINGS = ("balanced", "all_pairs")
Covariance = Literal["ellipsoidal", "spherical-avgpool", "spherical-one-value"]

MODEL_TYPES: tuple[str, ...] = ("gcie", "gce", "gie", "vse", "pvse")
COVARIANCES: tuple[str, ...] = ("ellipsoidal", "spherical-avgpool", "spherical-one-value")
IMAGE_POOLINGS: tuple[str, ...] = ("grid", "objects")
POSITIVES: tuple[str, ...] = ("pairs", "plausible", "plausible_images")
VARIANCE_OBJECTIVES: tuple[str, ...] = (
    "",
    "spread",
    "gallery_spread",
    "plausible_count",
    "partner_distance",
    "pcmepp",
)
OBJECTIVES: tuple[str, ...] = ("hinge", "infonce", "pcme", "pcmepp")
COUNTERFACTUALS: tuple[str, ...] = ("captions", "images", "both")
CAPTION_SWAPS: tuple[str, ...] = ("shape", "color", "size")  # words a swapped caption changes

# Similarities the training loss supports per model type (the loss uses -distance for the
# Gaussian metrics of models.distance.gaussian and the dot product of unit means for "cosine").
TRAIN_METRICS: dict[str, tuple[str, ...]] = {
    "gcie": (
        "w2",
        "kl",
        "min_kl",
        "kl_reverse",
        "js",
        "csd",
        "bhattacharyya",
        "match_prob",
        "cosine",
    ),
    "gce": ("mahalanobis", "w2", "kl", "min_kl", "csd", "match_prob"),
    "gie": ("mahalanobis", "w2", "kl", "min_kl", "csd", "match_prob"),
    "vse": ("cosine",),
    "pvse": ("max_pair",),  # best cosine over the K x K embedding pairs (models.pvse)
}
DEFAULT_METRIC: dict[str, str] = {
    "gcie": "w2",
    "gce": "mahalanobis",
    "gie": "mahalanobis",
    "vse": "cosine",
    "pvse": "max_pair",
}

FORMAT_VERSION = 1
MODEL_FILE = "model.json"
VOCAB_FILE = "vocab.json"
CHECKPOINT_FILE = "checkpoint.pt"
IMAGE_ONNX_FILE = "image_encoder.onnx"
TEXT_ONNX_FILE = "text_encoder.onnx"
# A pretrained model's heads alone (a backbone vector in), and its text backbone's tokenizer.
IMAGE_HEADS_ONNX_FILE = "image_heads.onnx"
TEXT_HEADS_ONNX_FILE = "text_heads.onnx"
TOKENIZER_FILE = "tokenizer.json"
OPSET = 17  # ONNX opset of the exported encoders


class ConfigError(ValueError):
    """A model configuration or model dir that cannot be used (the message says how to fix it)."""


@dataclass(frozen=True)
class Option:
    """Marks a config field (`Annotated[type, Option(help)]`) as an option of `probsearch
    train`, with its help (models.cli)."""

    help: str | None = None


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to rebuild the encoders and preprocess their inputs.

    `metric` is the training similarity and the service's default unless `search_with` names
    another; `search_metric` maps the point baseline's "cosine" to "w2", which ranks unit-norm
    points with a constant variance exactly like cosine. `image_query_metric` ranks the
    captions for an image query instead ("" = `search_metric`): chosen on validation data per
    direction, since an image query and a caption query ask different things of the variance
    (`default_metric`). `point_logvar` is
    the constant log-variance a point modality outputs, so every gallery has both mu and
    logvar. `training` and `validation` record how the model was trained and its best
    validation recalls (informational).
    """

    model_type: Annotated[ModelType, Option("gcie | gce | gie | vse | pvse")] = "gcie"
    embed_dim: Annotated[int, Option("embedding dimension D")] = 32
    covariance: Annotated[
        Covariance, Option("ellipsoidal | spherical-avgpool | spherical-one-value")
    ] = "ellipsoidal"
    # "" = the model type's default (DEFAULT_METRIC).
    metric: Annotated[
        str, Option("training similarity; default: w2 (gcie), mahalanobis (gce, gie), cosine (vse)")
    ] = ""
    # The service's default; "" = the training metric's (search_metric).
    search_with: Annotated[
        str,
        Option(
            "metric the service ranks with when a query names none (default: the training "
            "metric's; cosine ranks with w2)"
        ),
    ] = ""
    # The default metric of the caption gallery; "" = search_metric.
    image_query_metric: Annotated[
        str,
        Option(
            "metric the service ranks captions with for an image query that names none (default: "
            "the training metric's)"
        ),
    ] = ""
    name: str = "probsearch-shapes"
    version: int = FORMAT_VERSION
    # Safety bounds of the variance, far outside its working range.
    var_min: Annotated[float, Option("lower safety bound of the variance")] = 1e-6
    var_max: Annotated[float, Option("upper safety bound of the variance")] = 1e3
    logvar_init: float = -4.0  # log-variance of a new model (sigma about 0.14 per dim)
    # Its loss then cannot pull the features away from what the means need.
    variance_reads_only: Annotated[
        bool, Option("the variance head reads the trunk's features without training them")
    ] = False
    point_logvar: float = 0.0
    normalize_mu: bool = True
    dropout: Annotated[float, Option("MC-dropout probability p")] = 0.1
    image_size: int = 64
    image_mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    image_std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    cnn_channels: tuple[int, ...] = (16, 32, 64, 128)
    stem_stride: Annotated[
        int, Option("stride of the first conv (1 keeps the full resolution)")
    ] = 2
    # How the last feature map becomes the trunk's features: "grid" flattens its 4x4 cells
    # (layout kept, a detector learned per cell); "objects" adds a 1x1-conv detector shared by
    # every cell, averaged over the map, so "a purple star" is found wherever it is.
    image_pooling: Annotated[
        str, Option("grid (flattened 4x4 map) | objects (plus per-cell detectors)")
    ] = "grid"
    # Implemented in models.networks.
    cnn_downsample: Annotated[
        str, Option("stride (stride-2 convs) | maxpool (full-resolution convs)")
    ] = "stride"
    image_features: int = 128
    word_dim: int = 64
    text_hidden: int = 128
    vocab_size: int = 2
    max_caption_tokens: int = 32
    # The paper uses 2 to 4. On backbones PIE-Net has no local features to attend over (a
    # pooled vector): K residual heads of the vector take the place of the K attention-weighted
    # local features, fused with the global branch as PIE-Net fuses them
    # (models.pvse.network.PvseFeatureHeads).
    num_embeds: Annotated[
        int, Option("pvse: K embeddings per item (on backbones: K residual heads of the vector)")
    ] = 2
    # A frozen pretrained backbone per modality instead of the small encoders trained from
    # scratch: a name of models.backbones.registry.SHIPPED or the path of an ONNX graph
    # (models.backbones.onnx_backbone; a text graph with tokenizer.json beside it). Only the
    # heads (models.networks.feature_heads) are trained, on cached features.
    image_backbone: Annotated[
        str, Option("'' (CNN from scratch) | efficientnet-lite0[-style] | an ONNX image encoder")
    ] = ""
    text_backbone: Annotated[
        str, Option("'' (GRU from scratch) | all-minilm-l6-v2[-layers] | an ONNX text encoder")
    ] = ""
    image_backbone_dim: int = 0  # the backbones' feature widths, recorded when training starts
    text_backbone_dim: int = 0
    head_hidden: Annotated[int, Option("hidden width of the heads on a pretrained backbone")] = 512
    # The image heads read the backbone vector's coordinates on its first K principal
    # components of the train split (models.networks.principal_components); 0 = the vector.
    image_components: Annotated[
        int, Option("pretrained: image heads read the first K principal components (0: off)")
    ] = 0
    # The log-variance head reads the backbone vector itself, not the hidden units that the
    # mean's objective shapes (models.networks.feature_heads).
    variance_reads_backbone: Annotated[
        bool, Option("pretrained: the variance head reads the backbone vector")
    ] = False
    # The served text graph's backbone with int8 MatMul weights (models.onnx.quantize): about
    # 1.8x faster on CPU; the heads still train on the float features.
    text_backbone_int8: Annotated[
        bool, Option("pretrained: serve the text backbone with int8 weights (1.8x faster on CPU)")
    ] = False
    # Training image vectors kept for the novelty score of image queries (models.networks.
    # feature_novelty); at most this many, fewer when the train split has fewer images.
    novelty_bank: Annotated[
        int, Option("pretrained: training image vectors kept to score novelty (0: no score)")
    ] = 4096
    training: Mapping[str, Any] = field(default_factory=dict)
    validation: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ConfigError(
                f"unknown model type {self.model_type!r}; choose one of {', '.join(MODEL_TYPES)}"
            )
        if self.covariance not in COVARIANCES:
            raise ConfigError(
                f"unknown covariance {self.covariance!r}; choose one of {', '.join(COVARIANCES)}"
            )
        if not self.metric:
            object.__setattr__(self, "metric", DEFAULT_METRIC[self.model_type])
        allowed = TRAIN_METRICS[self.model_type]
        if self.metric not in allowed:
            raise ConfigError(
                f"metric {self.metric!r} cannot train a {self.model_type} model; "
                f"choose one of {', '.join(allowed)}"
            )
        for name, value in (
            ("search", self.search_with),
            ("image query", self.image_query_metric),
        ):
            if value and value not in GAUSSIAN_METRICS:
                raise ConfigError(
                    f"unknown {name} metric {value!r}; choose one of {', '.join(GAUSSIAN_METRICS)}"
                )
        if not 0 < self.var_min < self.var_max:
            raise ConfigError(f"need 0 < var_min < var_max, got {self.var_min}, {self.var_max}")
        if self.image_pooling not in IMAGE_POOLINGS:
            raise ConfigError(
                f"unknown image pooling {self.image_pooling!r}; "
                f"choose one of {', '.join(IMAGE_POOLINGS)}"
            )
        if self.stem_stride not in (1, 2):
            raise ConfigError(f"stem stride must be 1 or 2, got {self.stem_stride}")
        if self.cnn_downsample not in ("stride", "maxpool"):
            raise ConfigError(
                f"unknown cnn downsample {self.cnn_downsample!r}; choose stride or maxpool"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")
        if bool(self.image_backbone) != bool(self.text_backbone):
            raise ConfigError(
                "name both backbones (--image-backbone and --text-backbone) or neither"
            )
        if self.variance_reads_backbone and not self.pretrained:
            raise ConfigError(
                "variance_reads_backbone needs pretrained backbones (--image-backbone and "
                "--text-backbone)"
            )
        if self.image_components and not self.pretrained:
            raise ConfigError(
                "image_components needs pretrained backbones (--image-backbone and --text-backbone)"
            )
        if self.image_components < 0:
            raise ConfigError(f"image_components must be >= 0, got {self.image_components}")
        if self.image_backbone_dim and self.image_components > self.image_backbone_dim:
            raise ConfigError(
                f"image_components ({self.image_components}) cannot exceed the image "
                f"backbone's {self.image_backbone_dim} features"
            )
        if self.text_backbone_int8 and not self.pretrained:
            raise ConfigError(
                "text_backbone_int8 needs pretrained backbones (--image-backbone and "
                "--text-backbone)"
            )
        if self.variance_reads_backbone and self.model_type == "pvse":
            raise ConfigError(
                "variance_reads_backbone is for a learned variance head; pvse's variance is the "
                "spread of its K embeddings"
            )
        for name in (
            "embed_dim",
            "head_hidden",
            "image_size",
            "image_features",
            "word_dim",
            "text_hidden",
            "max_caption_tokens",
            "num_embeds",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.novelty_bank < 0:
            raise ConfigError(f"novelty_bank must be >= 0, got {self.novelty_bank}")

    @property
    def gaussian_images(self) -> bool:
        """Whether images get a learned variance (else a point with `point_logvar`)."""
        return self.model_type in ("gcie", "gie")

    @property
    def gaussian_captions(self) -> bool:
        """Whether captions get a learned variance (else a point with `point_logvar`)."""
        return self.model_type in ("gcie", "gce")

    @property
    def pretrained(self) -> bool:
        """Whether the encoders are frozen pretrained backbones with trained heads."""
        return bool(self.image_backbone)

    def backbone_dim(self, modality: str) -> int:
        """The feature width of the image or text backbone (pretrained models)."""
        return self.image_backbone_dim if modality == "image" else self.text_backbone_dim

    def heads_input_dim(self, modality: str) -> int:
        """The width of the vector a pretrained model's heads read: the backbone's, or its
        number of principal components (image_components)."""
        if modality == "image" and self.image_components:
            return self.image_components
        return self.backbone_dim(modality)

    def head_mask_width(self, modality: str) -> int:
        """Width of a pretrained model's dropout mask: one entry per feature the heads read,
        then one per hidden unit of the heads (models.networks.feature_heads)."""
        return self.heads_input_dim(modality) + self.head_hidden

    @property
    def search_metric(self) -> str:
        """The models.distance.gaussian metric the service should rank with by default:
        `search_with`, else the training metric (cosine: w2, its Gaussian equal on points)."""
        if self.search_with:
            return self.search_with
        return "w2" if self.metric == "cosine" else self.metric

    def default_metric(self, gallery: str) -> str:
        """The metric the service ranks `gallery` ("image" or "text") with when a query names
        none: the caption gallery answers image queries with `image_query_metric` if set."""
        if gallery == "text" and self.image_query_metric:
            return self.image_query_metric
        return self.search_metric

    @property
    def logvar_bounds(self) -> tuple[float, float]:
        """(min, max) of the predicted log-variance."""
        return math.log(self.var_min), math.log(self.var_max)

    @property
    def image_mask_width(self) -> int:
        """Width of an image dropout mask: one entry per channel of every conv block (trunk)
        and one per feature before the heads; for a pretrained model, head_mask_width."""
        if self.pretrained:
            return self.head_mask_width("image")
        return sum(self.cnn_channels) + self.image_features

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        data = dataclasses.asdict(self)
        data["training"] = dict(self.training)
        data["validation"] = dict(self.validation)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        """Build from a dict, ignoring the derived keys that save() adds."""
        known = {f.name for f in dataclasses.fields(cls)}
        extra = set(data) - known - {"onnx_io", "search_metric"}
        if extra:
            raise ConfigError(f"unknown keys in model config: {', '.join(sorted(extra))}")
        if data.get("version", FORMAT_VERSION) != FORMAT_VERSION:
            raise ConfigError(
                f"model.json version {data.get('version')} is not supported "
                f"(this code reads version {FORMAT_VERSION})"
            )
        values = {k: v for k, v in data.items() if k in known}
        values.setdefault("novelty_bank", 0)  # a model.json written before the novelty score
        for name in ("image_mean", "image_std", "cnn_channels"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)

    def save(self, model_dir: Path | str) -> Path:
        """Write MODEL_DIR/model.json (with the ONNX input/output description) and return it."""
        path = Path(model_dir) / MODEL_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.to_dict()
        data["search_metric"] = self.search_metric
        data["onnx_io"] = onnx_io_description(self)
        path.write_text(json.dumps(data, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, model_dir: Path | str) -> ModelConfig:
        """Read MODEL_DIR/model.json; ConfigError if it is missing or malformed."""
        path = Path(model_dir) / MODEL_FILE
        if not path.is_file():
            raise ConfigError(
                f"{path} not found: is {model_dir} a model dir written by `probsearch train`?"
            )
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a JSON object")
        try:
            return cls.from_dict(data)
        except TypeError as e:
            raise ConfigError(f"{path}: {e}") from e


def model_fingerprint(model_dir: Path, modality: str) -> tuple[str, str]:
    """(model name, sha256 over model.json and the modality's ONNX encoder): the identity an
    index version records, and the service checks, of the model that embedded its gallery."""
    config = ModelConfig.load(model_dir)
    digest = hashlib.sha256()
    for name in (MODEL_FILE, IMAGE_ONNX_FILE if modality == "image" else TEXT_ONNX_FILE):
        with open(model_dir / name, "rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
    return config.name, digest.hexdigest()


def onnx_io_description(config: ModelConfig) -> dict[str, Any]:
    """Names, dtypes and shapes of the two graphs' inputs and outputs (stored in model.json)."""
    rows = "S*N"
    outputs = {
        "mu": ["float32", [rows, config.embed_dim]],
        "logvar": ["float32", [rows, config.embed_dim]],
    }
    if config.model_type == "pvse":
        outputs["embeddings"] = ["float32", [rows, config.num_embeds, config.embed_dim]]
    size = config.image_size
    if config.pretrained:
        return _pretrained_io(config, outputs)
    return {
        "opset": OPSET,
        "layout": "outputs are draw-major: row s*N + n; s = 0 is the deterministic all-ones "
        "mask block, s = 1..L the MC-dropout draws; mask entries are 0 or 1/(1-p)",
        IMAGE_ONNX_FILE: {
            "inputs": {
                "images": ["float32", ["N", 3, size, size]],
                "dropout_masks": ["float32", ["S", "N", config.image_mask_width]],
            },
            "outputs": outputs,
        },
        TEXT_ONNX_FILE: {
            "inputs": {
                "token_ids": ["int64", ["N", "T"]],
                "lengths": ["int64", ["N"]],
                "word_masks": ["float32", ["S", "N", "T", config.word_dim]],
                "head_masks": ["float32", ["S", "N", config.text_hidden]],
            },
            "outputs": outputs,
        },
    }


def _pretrained_io(config: ModelConfig, outputs: dict[str, Any]) -> dict[str, Any]:
    """onnx_io_description of a model on pretrained backbones: the whole path per modality
    and the heads alone, each with one dropout mask over backbone features and hidden units."""

    def masks(modality: str) -> list[Any]:
        return ["float32", ["S", "N", config.head_mask_width(modality)]]

    size = config.image_size
    novelty = {"novelty": ["float32", ["N"]]} if config.novelty_bank else {}
    return {
        "opset": OPSET,
        "layout": "as for the small encoders; the backbone runs once per input, the heads once "
        "per draw",
        IMAGE_ONNX_FILE: {
            "inputs": {"pixels": ["uint8", ["N", 3, size, size]], "dropout_masks": masks("image")},
            "outputs": outputs | novelty,
        },
        TEXT_ONNX_FILE: {
            "inputs": {
                "input_ids": ["int64", ["N", "T"]],
                "attention_mask": ["int64", ["N", "T"]],
                "dropout_masks": masks("text"),
            },
            "outputs": outputs,
        },
        **{
            name: {
                "inputs": {
                    "features": ["float32", ["N", config.backbone_dim(modality)]],
                    "dropout_masks": masks(modality),
                },
                "outputs": outputs | (novelty if modality == "image" else {}),
            }
            for modality, name in (("image", IMAGE_HEADS_ONNX_FILE), ("text", TEXT_HEADS_ONNX_FILE))
        },
    }


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings (stored in model.json under "training").

    Defaults differ from VSE++ (lr 2e-4, batch 128, hardest negative) because these encoders
    train from scratch in minutes on CPU: on 1000 shapes images (15 epochs) the hardest
    negative collapsed every embedding together (loss stuck at 2 x margin, rsum 93 against
    135 for the sum), and batch 32 at lr 2e-3 reached in 15 epochs what batch 128 at 2e-4
    had not in 30. The hardest negative stays available (negatives="hardest"), after
    `warmup_epochs` epochs of the sum.
    """

    # At most: training stops earlier when validation stops improving.
    epochs: Annotated[int, Option("at most this many epochs (with --resume: up to this)")] = 60
    patience: Annotated[
        int, Option("stop after this many epochs without a better validation score (0: never)")
    ] = 8
    batch_size: Annotated[int, Option("images per batch, each with its captions")] = 32
    lr: Annotated[float, Option("Adam learning rate (x0.1 when validation stops improving)")] = 2e-3
    lr_patience: int = 3  # epochs without improvement before lr *= lr_decay
    lr_decay: float = 0.1
    # AdamW's decoupled weight decay on the encoders' weights (0: Adam, as always before).
    weight_decay: Annotated[
        float, Option("AdamW weight decay of the encoders' weights (0: plain Adam)")
    ] = 0.0
    # Validate, keep and export an exponential moving average of the weights, updated after
    # every step at this decay (0: the weights as trained; models.training.train).
    ema_decay: Annotated[
        float, Option("decay of the weights' moving average that is validated and kept (0: off)")
    ] = 0.0
    # Implemented in models.objectives.
    objective: Annotated[
        str,
        Option(
            "hinge (triplet on -distance) | infonce (symmetric contrastive cross-entropy at "
            "--temperature) | pcme (sampled match probability) | pcmepp (closed-form sampled "
            "distance, pseudo-positives)"
        ),
    ] = "hinge"
    # Fit the variances alone, on the detached means (models.objectives).
    variance_objective: Annotated[
        str,
        Option(
            "'' | spread (the spread of the plausible matches in the batch) | gallery_spread "
            "(the same over the training split) | plausible_count (floor to gallery spread, "
            "geometric in #plausible) | partner_distance (mean square distance to the "
            "plausible matches over the training split) | pcmepp (PCME++ on the detached means)"
        ),
    ] = ""
    # Which pairs of a batch are never negatives; with "plausible_images" an image still ranks
    # its own captions above all others (models.objectives.hinge).
    positives: Annotated[
        str,
        Option(
            "pairs (own captions only) | plausible (no plausible pair is a negative) | "
            "plausible_images (no image a caption plausibly describes is its negative)"
        ),
    ] = "pairs"
    margin: Annotated[float, Option("hinge margin")] = 0.2
    # Of the similarity (cosine, or -distance; models.objectives.infonce). On clip-art val
    # (pretrained backbones, vse, 3 seeds) 0.01 to 0.1 tied on the val score with own pairs
    # as positives, 0.1 with the best t2i P@1; with positives "plausible" 0.1 (score 38.5 +- 0.3)
    # matched 0.05 (38.2 +- 0.7).
    temperature: Annotated[float, Option("infonce: the logits are similarity / temperature")] = 0.1
    negatives: Annotated[
        str,
        Option(
            "sum (all violating negatives) | hardest (VSE++ max violation, after one epoch of sum)"
        ),
    ] = "sum"
    warmup_epochs: int = 1  # epochs with the sum-over-negatives loss before `negatives`
    vib_beta: Annotated[
        float, Option("weight of KL(N(mu, sigma^2) || N(0, I)) per Gaussian modality")
    ] = 0.0
    # None: PCME's own weight for pcme, 0 otherwise (models.objectives.uniformity_weight).
    uniformity_weight: Annotated[
        float | None,
        Option("weight of the uniformity loss on the means (not given: 0.1 for pcme, else 0)"),
    ] = None
    match_samples: Annotated[int, Option("J of PCME's J x J sampled match probability")] = 7
    # Adam lr of the match probability's a and b (pcme, pcmepp); None: PCME++'s 0.05, PCME at
    # the encoders' lr (models.objectives.match_learning_rate).
    match_lr: float | None = None
    # How the match BCE weighs its pairs (models.objectives.match_probability.pair_mean):
    # balanced, the mean over the matching pairs plus the mean over the others (trained from
    # scratch, the papers' weighting stayed at its trivial value: docs/results-pcme.md);
    # all_pairs, the mean over every pair, as PCME++'s code.
    match_weighting: Annotated[
        str, Option("pcme, pcmepp: balanced | all_pairs (the mean over every pair, as the papers)")
    ] = "balanced"
    pseudo_positive_weight: Annotated[
        float, Option("PCME++ weight of the pseudo-positive loss")
    ] = 0.1
    # PCME++'s mixed-sample data augmentation (models.training.mixed_samples): this share of
    # each batch's images is mixed with another image of the batch (mixup or cutmix), and
    # matches the two images' captions with soft labels lambda and 1 - lambda (the paper:
    # 0.25). Pixels only: refused on pretrained backbones (their cached features are no
    # images). pcmepp objective only, the one whose BCE takes soft labels. 0 = off.
    mixed_sample_fraction: Annotated[
        float, Option("pcmepp, pixels only: share of each batch's images mixed (mixup / cutmix)")
    ] = 0.0
    # PCME++'s label smoothing of the match labels: t -> (1 - s) t + s (1 - t) (the paper:
    # 1e-4, with the mixed samples). pcmepp objective only. 0 = off.
    match_label_smoothing: Annotated[
        float, Option("pcmepp: label smoothing of the match labels")
    ] = 0.0
    grad_clip: float = 2.0
    captions_per_image: int = 0  # captions of each image per batch (0 = all of them)
    # The labels (e.g. "purple star") are read off the image mean by a linear probe
    # (models.objectives.labels).
    label_weight: Annotated[
        float, Option("weight of the auxiliary loss on the dataset's image labels")
    ] = 0.0
    # Which attribute values an image holds (models.objectives.labels; datasets with object
    # annotations).
    attribute_weight: Annotated[
        float,
        Option(
            "weight of the auxiliary loss that reads each image's object attributes (shapes, "
            "colours, sizes) off its trunk features"
        ),
    ] = 0.0
    # The outliers (models.datasets.outliers) are negatives of every caption, and with variance
    # "spread" fitted to the spread of all captions.
    outlier_fraction: Annotated[
        float, Option("synthetic outlier images per real image of a batch (0 = none)")
    ] = 0.0
    # A hinge: each outlier's log-det at least D ln 2 above every real image's of the batch
    # (models.objectives.regularizers.outlier_ranking_loss).
    outlier_ranking_weight: Annotated[
        float,
        Option(
            "weight of ranking each synthetic outlier's image log-det above every real image's "
            "(outlier exposure; needs --outlier-fraction; 0 = off)"
        ),
    ] = 0.0
    # A hinge (models.datasets.counterfactuals; shapes-style datasets).
    counterfactual_weight: Annotated[
        float, Option("weight of ranking each pair above its swapped counterparts (0 = off)")
    ] = 0.0
    counterfactuals: Annotated[
        str,
        Option(
            "what the counterfactual weight applies to: captions (a shape, colour or size word "
            "swapped), images (one object's shape swapped; shapes data only) or both"
        ),
    ] = "both"
    # Comma-separated from CAPTION_SWAPS: each caption gets one swap per attribute named here
    # that it has a word of.
    caption_swaps: Annotated[
        str, Option("which words swapped captions change: some of shape,color,size")
    ] = "shape,color,size"
    # lambda_1 of the paper.
    div_weight: Annotated[float, Option("pvse: weight of the diversity loss")] = 0.1
    # lambda_2 of the paper.
    mmd_weight: Annotated[float, Option("pvse: weight of the MMD loss")] = 0.01
    seed: Annotated[int, Option()] = 0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 2:
            raise ConfigError("need epochs >= 1 and batch size >= 2")
        if self.lr <= 0 or self.margin < 0:
            raise ConfigError("need lr > 0 and margin >= 0")
        if self.match_lr is not None and not self.match_lr > 0:
            raise ConfigError(f"match lr must be > 0 (or None), got {self.match_lr}")
        if not self.weight_decay >= 0.0:
            raise ConfigError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
        if self.patience < 0 or self.lr_patience < 0:
            raise ConfigError("need patience >= 0 and lr patience >= 0")
        if self.negatives not in ("hardest", "sum"):
            raise ConfigError(f"unknown negatives {self.negatives!r}; choose hardest or sum")
        if self.objective not in OBJECTIVES:
            raise ConfigError(
                f"unknown objective {self.objective!r}; choose one of {', '.join(OBJECTIVES)}"
            )
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if self.variance_objective not in VARIANCE_OBJECTIVES:
            raise ConfigError(
                f"unknown variance objective {self.variance_objective!r}; choose one of "
                f"{', '.join(VARIANCE_OBJECTIVES[1:])} or none"
            )
        if self.positives not in POSITIVES:
            raise ConfigError(
                f"unknown positives {self.positives!r}; choose one of {', '.join(POSITIVES)}"
            )
        weights = (self.vib_beta, self.uniformity_weight or 0.0, self.pseudo_positive_weight,
                   self.div_weight, self.mmd_weight, self.label_weight,
                   self.attribute_weight, self.counterfactual_weight)  # fmt: skip
        if min(weights) < 0:
            raise ConfigError("regulariser weights must be >= 0")
        if self.counterfactuals not in COUNTERFACTUALS:
            raise ConfigError(
                f"unknown counterfactuals {self.counterfactuals!r}; "
                f"choose one of {', '.join(COUNTERFACTUALS)}"
            )
        swaps = self.caption_swaps.split(",")
        if not swaps or any(a not in CAPTION_SWAPS for a in swaps):
            raise ConfigError(
                f"unknown caption swaps {self.caption_swaps!r}; name some of "
                f"{', '.join(CAPTION_SWAPS)}, comma-separated"
            )
        if not 0.0 <= self.outlier_fraction <= 1.0:
            raise ConfigError(f"outlier fraction must be in [0, 1], got {self.outlier_fraction}")
        if self.outlier_ranking_weight < 0:
            raise ConfigError(
                f"outlier ranking weight must be >= 0, got {self.outlier_ranking_weight}"
            )
        if self.outlier_ranking_weight > 0 and self.outlier_fraction == 0:
            raise ConfigError(
                "outlier ranking weight needs outlier fraction > 0 (outliers to rank)"
            )
        if self.outlier_fraction > 0 and self.objective != "hinge":
            raise ConfigError("synthetic outliers train with the hinge objective only")
        if self.match_samples < 1:
            raise ConfigError("match samples J must be >= 1")
        if self.match_weighting not in MATCH_WEIGHTINGS:
            raise ConfigError(
                f"match weighting must be one of {', '.join(MATCH_WEIGHTINGS)}, got "
                f"{self.match_weighting!r}"
            )
        if not 0.0 <= self.mixed_sample_fraction <= 1.0:
            raise ConfigError(
                f"mixed sample fraction must be in [0, 1], got {self.mixed_sample_fraction}"
            )
        if not 0.0 <= self.match_label_smoothing < 0.5:
            raise ConfigError(
                f"match label smoothing must be in [0, 0.5), got {self.match_label_smoothing}"
            )
        soft = self.mixed_sample_fraction > 0 or self.match_label_smoothing > 0
        if soft and self.objective != "pcmepp":
            raise ConfigError(
                "mixed samples and match label smoothing give soft match labels, which only "
                "the pcmepp objective takes"
            )
        # Their targets are those of the unmixed images.
        aids = ("counterfactual_weight", "label_weight", "attribute_weight")
        if self.mixed_sample_fraction > 0 and any(getattr(self, a) for a in aids):
            raise ConfigError(
                "mixed samples cannot train with counterfactual_weight, label_weight or "
                "attribute_weight (their targets are the unmixed images'); leave them at 0"
            )
