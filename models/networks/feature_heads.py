"""Probabilistic heads on a frozen backbone's feature vector, with MC dropout inside them.

The backbone runs once per input; the heads are a small MLP (backbone vector -> hidden ->
GaussianHeads), so the L Monte-Carlo draws cost L passes of the heads only. Dropout acts on
the backbone vector and on the hidden units: a mask row holds one multiplier per backbone
feature, then one per hidden unit (ModelConfig.head_mask_width), as the small encoders'
masks do, so no randomness lives inside a forward pass or an exported graph.

The image heads also hold the novelty bank (models.networks.feature_novelty): the score reads
the backbone vector, not the heads, and is exported beside mu and logvar.
"""

from __future__ import annotations

import torch
from torch import nn

from models.networks.feature_novelty import FeatureNovelty
from models.networks.heads import GaussianHeads, init_linear
from models.networks.model_config import ModelConfig


class FeatureHeads(nn.Module):
    """features (N, F) + dropout masks (S, N, F + H) -> mu, logvar (S * N, D), draw-major."""

    def __init__(
        self, in_features: int, config: ModelConfig, gaussian: bool, novelty_rows: int = 0
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.hidden = nn.Sequential(nn.Linear(in_features, config.head_hidden), nn.ReLU())
        self.heads = GaussianHeads(config.head_hidden, config, gaussian=gaussian)
        self.mask_widths = (in_features, config.head_hidden)
        self.novelty = FeatureNovelty(novelty_rows, in_features) if novelty_rows else None
        init_linear(self)

    def forward(
        self, features: torch.Tensor, masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.heads(self.features(features, masks))

    def features(self, features: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """The hidden units (S * N, H) that the Gaussian heads read, draw-major."""
        x, hidden_mask = self.masked_inputs(features, masks)
        return self.hidden(x) * hidden_mask

    def masked_inputs(
        self, features: torch.Tensor, masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The backbone vector of each draw with its dropout applied (S * N, F), and the
        hidden units' masks (S * N, H), draw-major."""
        num_draws = masks.shape[0]
        x = features.unsqueeze(0).expand(num_draws, *features.shape).flatten(0, 1)  # (S*N, F)
        input_mask, hidden_mask = masks.flatten(0, 1).split(self.mask_widths, dim=1)
        return x * input_mask, hidden_mask
