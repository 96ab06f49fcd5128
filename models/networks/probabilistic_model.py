"""The pair of encoders of one model type (gcie, gce, gie, vse; pvse's PIE-Nets, models.pvse),
or their heads on pretrained backbones, and its checkpoint file."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from models.networks.feature_heads import FeatureHeads
from models.networks.feature_novelty import load_bank
from models.networks.heads import dropout_masks
from models.networks.image_encoder import ImageEncoder
from models.networks.model_config import CHECKPOINT_FILE, ConfigError, ModelConfig
from models.networks.principal_components import PrincipalComponents
from models.networks.text_encoder import TextEncoder
from models.pvse.network import (
    PvseFeatureHeads,
    PvseImageEncoder,
    PvseOutput,
    PvseTextEncoder,
)

Embedding = tuple[torch.Tensor, torch.Tensor]  # (mu, logvar), each (S * N, D)
INITIAL_MATCH_SCALE = 5.0  # PCME's initial a and b on CUB; learned from there
INITIAL_MATCH_SHIFT = 5.0


class ProbabilisticModel(nn.Module):
    """Image and caption encoders sharing one embedding space.

    gcie: both modalities Gaussian; gce: Gaussian captions, point images; gie: Gaussian
    images, point captions; vse: points for both (cosine). A point modality still returns a
    logvar, the constant config.point_logvar.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.image_encoder = ImageEncoder(config)
        self.text_encoder = TextEncoder(config)
        # a > 0 and b of the match probability sigmoid(-a * d + b) (PCME and PCME++ objectives)
        self.match_log_scale = nn.Parameter(torch.tensor(math.log(INITIAL_MATCH_SCALE)))
        self.match_shift = nn.Parameter(torch.tensor(INITIAL_MATCH_SHIFT))

    @property
    def match_scale(self) -> torch.Tensor:
        return self.match_log_scale.exp()

    def image_mask_shape(self, num_draws: int, batch: int) -> tuple[int, int, int]:
        """Shape (S, N, W) of the image dropout masks (trunk channels and features)."""
        return num_draws, batch, self.config.image_mask_width

    def text_mask_shapes(
        self, num_draws: int, batch: int, steps: int
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shapes (S, N, T, E) of the word masks and (S, N, H) of the text head masks."""
        return (
            (num_draws, batch, steps, self.text_encoder.word_dim),
            (num_draws, batch, self.text_encoder.feature_dim),
        )

    def encode_images(
        self,
        images: torch.Tensor,
        generator: torch.Generator | None = None,
        stochastic: bool = False,
    ) -> Embedding:
        """images (N, 3, H, W) -> (mu, logvar) (N, D); one dropout draw if `stochastic`."""
        return self.image_encoder(images, self.image_masks(images, generator, stochastic))

    def encode_images_with_features(
        self,
        images: torch.Tensor,
        generator: torch.Generator | None = None,
        stochastic: bool = False,
    ) -> tuple[Embedding, torch.Tensor]:
        """encode_images, plus the trunk features (N, F) the heads read (for training aids
        that supervise the trunk, models.objectives.labels)."""
        encoder = self.image_encoder
        features = encoder.features(images, self.image_masks(images, generator, stochastic))
        return encoder.heads(features), features

    def encode_texts(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        generator: torch.Generator | None = None,
        stochastic: bool = False,
    ) -> Embedding:
        """ids (N, T), lengths (N,) -> (mu, logvar) (N, D); one dropout draw if `stochastic`."""
        return self.text_encoder(ids, lengths, *self.text_masks(ids, generator, stochastic))

    def image_masks(
        self, images: torch.Tensor, generator: torch.Generator | None, stochastic: bool
    ) -> torch.Tensor:
        """One draw of the image encoder's dropout masks (all ones unless `stochastic`)."""
        shape = self.image_mask_shape(1, images.shape[0])
        p = self.config.dropout if stochastic else 0.0
        return dropout_masks(shape, p, generator, images.device)

    def text_masks(
        self, ids: torch.Tensor, generator: torch.Generator | None, stochastic: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draw of the text encoder's (word, head) dropout masks."""
        word_shape, head_shape = self.text_mask_shapes(1, ids.shape[0], ids.shape[1])
        p = self.config.dropout if stochastic else 0.0
        word_masks = dropout_masks(word_shape, p, generator, ids.device)
        return word_masks, dropout_masks(head_shape, p, generator, ids.device)


class PvseSummary:
    """encode_* of a pvse model: the Gaussian summary (mu, logvar) of embed_*'s K embeddings."""

    def encode_images(
        self,
        images: torch.Tensor,
        generator: torch.Generator | None = None,
        stochastic: bool = False,
    ) -> Embedding:
        out = self.embed_images(images, generator, stochastic)  # type: ignore[attr-defined]
        return out.mu, out.logvar

    def encode_texts(
        self,
        inputs: torch.Tensor,
        lengths: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        stochastic: bool = False,
    ) -> Embedding:
        out = self.embed_texts(inputs, lengths, generator, stochastic)  # type: ignore[attr-defined]
        return out.mu, out.logvar


class PvseModel(PvseSummary, ProbabilisticModel):
    """Image and caption PIE-Nets (no shared weights). encode_* return the Gaussian summary
    (mean of the K embeddings, spread as a spherical variance); embed_* the full output."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.image_encoder = PvseImageEncoder(config)
        self.text_encoder = PvseTextEncoder(config)

    def embed_images(
        self,
        images: torch.Tensor,
        generator: torch.Generator | None = None,
        stochastic: bool = False,
    ) -> PvseOutput:
        """images (N, 3, H, W) -> PvseOutput of N rows; one dropout draw if `stochastic`."""
        return self.image_encoder.embed(images, self.image_masks(images, generator, stochastic))

    def embed_texts(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        generator: torch.Generator | None = None,
        stochastic: bool = False,
    ) -> PvseOutput:
        """ids (N, T), lengths (N,) -> PvseOutput of N rows; one dropout draw if `stochastic`."""
        return self.text_encoder.embed(ids, lengths, *self.text_masks(ids, generator, stochastic))


class HeadsModel(ProbabilisticModel):
    """Heads on the feature vectors of two frozen pretrained backbones (models.backbones).

    The backbones are not part of this module: training reads their cached features, and the
    exported graphs put them in front of the heads (models.onnx.export). encode_images takes
    image features (N, F_img), encode_texts caption features (N, F_txt); the lengths a small
    text encoder needs are accepted and ignored, so the training loop serves both kinds.
    With image_components, `image_projection` turns backbone vectors into the coordinates the
    image heads read: training projects its splits once, the exported graphs every input.
    """

    heads_class: type[FeatureHeads] = FeatureHeads  # PvseHeadsModel: pvse's K heads

    def __init__(self, config: ModelConfig) -> None:
        nn.Module.__init__(self)
        self.config = config
        self.image_projection = (
            PrincipalComponents(config.image_backbone_dim, config.image_components)
            if config.image_components
            else None
        )
        self.image_encoder = self.heads_class(
            config.heads_input_dim("image"), config, config.gaussian_images,
            config.novelty_bank, config.image_backbone_dim,
        )  # fmt: skip
        self.text_encoder = self.heads_class(
            config.text_backbone_dim, config, gaussian=config.gaussian_captions
        )
        self.match_log_scale = nn.Parameter(torch.tensor(math.log(INITIAL_MATCH_SCALE)))
        self.match_shift = nn.Parameter(torch.tensor(INITIAL_MATCH_SHIFT))

    def mask_shape(self, modality: str, num_draws: int, batch: int) -> tuple[int, int, int]:
        """Shape (S, N, F + H) of one modality's dropout masks."""
        return num_draws, batch, self.config.head_mask_width(modality)

    def encode_images_with_features(
        self,
        features: torch.Tensor,
        generator: torch.Generator | None = None,
        stochastic: bool = False,
    ) -> tuple[Embedding, torch.Tensor]:
        """Image features (N, F_img) -> (mu, logvar) and the heads' hidden units (N, H)."""
        masks = self.image_masks(features, generator, stochastic)
        return self.image_encoder.with_hidden(features, masks)

    def encode_texts(
        self,
        features: torch.Tensor,
        lengths: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        stochastic: bool = False,
    ) -> Embedding:
        """Caption features (N, F_txt) -> (mu, logvar) (N, D); one dropout draw if
        `stochastic`."""
        return self.text_encoder(features, self.feature_masks(features, generator, stochastic))

    def feature_masks(
        self, features: torch.Tensor, generator: torch.Generator | None, stochastic: bool
    ) -> torch.Tensor:
        """One draw of the caption heads' dropout masks (all ones unless `stochastic`)."""
        shape = self.mask_shape("text", 1, features.shape[0])
        p = self.config.dropout if stochastic else 0.0
        return dropout_masks(shape, p, generator, features.device)


class PvseHeadsModel(PvseSummary, HeadsModel):
    """PVSE on two pretrained backbones: K heads on each pooled vector (models.pvse.network.
    PvseFeatureHeads), with PvseModel's interface (embed_* the K embeddings, encode_* their
    Gaussian summary) on backbone features, as HeadsModel takes them."""

    heads_class = PvseFeatureHeads

    def embed_images(
        self,
        features: torch.Tensor,
        generator: torch.Generator | None = None,
        stochastic: bool = False,
    ) -> PvseOutput:
        """Image features (N, F_img) -> PvseOutput of N rows; one dropout draw if
        `stochastic`."""
        encoder: PvseFeatureHeads = self.image_encoder  # type: ignore[assignment]
        return encoder.embed(features, self.image_masks(features, generator, stochastic))

    def embed_texts(
        self,
        features: torch.Tensor,
        lengths: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        stochastic: bool = False,
    ) -> PvseOutput:
        """Caption features (N, F_txt) -> PvseOutput of N rows (lengths ignored)."""
        encoder: PvseFeatureHeads = self.text_encoder  # type: ignore[assignment]
        return encoder.embed(features, self.feature_masks(features, generator, stochastic))


def build_model(config: ModelConfig) -> ProbabilisticModel:
    """The model of config.model_type (pvse has its own encoders) or, with backbones named,
    heads on their features (pvse: K heads on each vector)."""
    if config.pretrained:
        if not (config.image_backbone_dim and config.text_backbone_dim):
            raise ConfigError("a model on pretrained backbones needs their feature widths")
        return PvseHeadsModel(config) if config.model_type == "pvse" else HeadsModel(config)
    if config.model_type == "pvse":
        return PvseModel(config)
    return ProbabilisticModel(config)


def save_checkpoint(model: ProbabilisticModel, path: Path | str, epoch: int) -> None:
    """Write the weights and config (the file `probsearch export` rebuilds the encoders from)."""
    state = {"config": model.config.to_dict(), "state_dict": model.state_dict(), "epoch": epoch}
    torch.save(state, path)


def load_model(model_dir: Path | str, map_location: str = "cpu") -> ProbabilisticModel:
    """Rebuild the model of a model dir from model.json and checkpoint.pt (eval mode)."""
    config = ModelConfig.load(model_dir)
    path = Path(model_dir) / CHECKPOINT_FILE
    if not path.is_file():
        raise ConfigError(f"{path} not found: train a model into {model_dir} first")
    state = torch.load(path, map_location=map_location, weights_only=True)
    model = build_model(config)
    try:
        model.load_state_dict(state["state_dict"])
        novelty = getattr(model.image_encoder, "novelty", None)
        if novelty is not None:
            load_bank(novelty, Path(model_dir))
    except (KeyError, RuntimeError, ValueError) as e:
        raise ConfigError(f"{path} does not match {model_dir}/model.json: {e}") from e
    return model.eval()
