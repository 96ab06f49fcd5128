"""Probabilistic heads on a frozen backbone's feature vector, with MC dropout inside them.

The backbone runs once per input; the heads are a small MLP (backbone vector -> hidden ->
GaussianHeads), so the L Monte-Carlo draws cost L passes of the heads only. Dropout acts on
the backbone vector and on the hidden units: a mask row holds one multiplier per backbone
feature, then one per hidden unit (ModelConfig.head_mask_width), as the small encoders'
masks do, so no randomness lives inside a forward pass or an exported graph.

With ModelConfig.variance_reads_backbone, the log-variance head reads the (dropped-out)
backbone vector instead of the hidden units. The hidden units are what the means' objective
shapes: InfoNCE with plausible positives pulls a vague caption's matches together, and a
variance read from there loses how vague the caption was, which the backbone vector still holds
(on clip art a linear map of the text features predicts ln #plausible images at Spearman
+0.79). The variance head reads the vector standardised per feature with the train split's mean
and sd (`Standardize`, fitted when training starts and saved with the weights): MiniLM's unit
vectors vary by a few hundredths per feature, so on the raw vector Adam needed thousands of
steps to fit the count target's ranks (train Spearman 0.55 after 1,500 full-batch steps, 0.84
after 250 standardised). A dropped-out feature is set to its mean. The head's weights start at
zero, so every item starts at logvar_init. Every dimension then starts alike, and an objective
that sees the variances only through sums over the dimensions (PCME++'s csd and the VIB) gives
each the same gradient, so they stay equal: the variance is isotropic, and the sum of the
variances orders items as the log-det does (docs/results-pcme.md, session 46). Objectives that
weigh dimensions differently (the spread and count targets, PCME's sampled distance) part them.

The image heads also hold the novelty bank (models.networks.feature_novelty): the score reads
the backbone vector, not the heads, and is exported beside mu and logvar. Behind a projection
onto principal components (ModelConfig.image_components) it still reads the whole vector: an
unfamiliar picture differs from the drawings most in the directions the projection drops
(the 1/f textures refused fell from 100% to 21.5% when the bank held the 1,024 coordinates;
benchmarks/results/components_novelty_on_coordinates.md).
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
        self,
        in_features: int,
        config: ModelConfig,
        gaussian: bool,
        novelty_rows: int = 0,
        novelty_features: int = 0,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.hidden = nn.Sequential(nn.Linear(in_features, config.head_hidden), nn.ReLU())
        self.reads_backbone = config.variance_reads_backbone
        variance_in = in_features if self.reads_backbone else None
        self.heads = GaussianHeads(config.head_hidden, config, gaussian, variance_in)
        self.mask_widths = (in_features, config.head_hidden)
        novelty_in = novelty_features or in_features  # the backbone's width behind a projection
        self.novelty = FeatureNovelty(novelty_rows, novelty_in) if novelty_rows else None
        self.standardize = Standardize(in_features) if self.reads_backbone else None
        init_linear(self)
        if self.reads_backbone and self.heads.logvar_head is not None:
            nn.init.zeros_(self.heads.logvar_head.weight)

    def forward(
        self, features: torch.Tensor, masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.with_hidden(features, masks)[0]

    def with_hidden(
        self, features: torch.Tensor, masks: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        """(mu, logvar) as forward, and the hidden units (S * N, H) the mean head reads."""
        x, input_mask, hidden_mask = self._per_draw(features, masks)
        hidden = self.hidden(x * input_mask) * hidden_mask
        if self.standardize is None:
            return self.heads(hidden), hidden
        z = self.standardize(features).repeat(masks.shape[0], 1)  # (S*N, F), once per item
        return self.heads(hidden, z * input_mask), hidden

    def means(self, features: torch.Tensor) -> torch.Tensor:
        """features (N, F) -> the deterministic mu (N, D) alone: the hidden units and the mean
        head, without dropout or the log-variance head (the same numbers as forward's mu with
        all-ones masks)."""
        return self.heads.mean(self.hidden(features))

    def masked_inputs(
        self, features: torch.Tensor, masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The backbone vector of each draw with its dropout applied (S * N, F), and the
        hidden units' masks (S * N, H), draw-major."""
        x, input_mask, hidden_mask = self._per_draw(features, masks)
        return x * input_mask, hidden_mask

    def _per_draw(
        self, features: torch.Tensor, masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The backbone vectors repeated per draw (S * N, F) and the draws' input and hidden
        masks, draw-major."""
        num_draws = masks.shape[0]
        x = features.unsqueeze(0).expand(num_draws, *features.shape).flatten(0, 1)
        input_mask, hidden_mask = masks.flatten(0, 1).split(self.mask_widths, dim=1)
        return x, input_mask, hidden_mask


class Standardize(nn.Module):
    """x -> (x - shift) / scale per feature; `fit` sets them to the mean and sd of the
    training vectors. Buffers, so the checkpoint and the exported graphs carry them."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("shift", torch.zeros(dim))
        self.register_buffer("scale", torch.ones(dim))

    def fit(self, features: torch.Tensor) -> None:
        """Set shift and scale from the rows of features (N, F)."""
        self.shift.copy_(features.mean(dim=0))
        self.scale.copy_(features.std(dim=0).clamp_min(1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.shift) / self.scale
