"""The PVSE model: ProbabilisticModel's interface (so training, export and evaluation treat it
like the other types) with PIE-Net encoders that also give the K embeddings."""

from __future__ import annotations

import torch

from models.networks.model_config import ModelConfig
from models.networks.probabilistic_model import Embedding, ProbabilisticModel
from models.pvse.network import PvseImageEncoder, PvseOutput, PvseTextEncoder


class PvseModel(ProbabilisticModel):
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

    def encode_images(
        self,
        images: torch.Tensor,
        generator: torch.Generator | None = None,
        stochastic: bool = False,
    ) -> Embedding:
        out = self.embed_images(images, generator, stochastic)
        return out.mu, out.logvar

    def encode_texts(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        generator: torch.Generator | None = None,
        stochastic: bool = False,
    ) -> Embedding:
        out = self.embed_texts(ids, lengths, generator, stochastic)
        return out.mu, out.logvar
