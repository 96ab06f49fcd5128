"""Small CNN image encoder (64x64 input) with MC-dropout masks before the Gaussian heads."""

from __future__ import annotations

import itertools

import torch
from torch import nn

from models.heads import GaussianHeads, apply_head_masks, init_linear
from models.model_config import ModelConfig

POOLED_GRID = 4  # the last feature map is average-pooled to 4x4 (keeps coarse layout)


def conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    """3x3 conv with stride 2 (halves H and W), batch norm, ReLU."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class ImageEncoder(nn.Module):
    """images (N, 3, H, W) + head masks (S, N, F) -> mu, logvar (S * N, D), draw-major.

    The CNN trunk runs once per image; only the masked features and the heads run S times,
    so L Monte-Carlo draws cost little more than the deterministic pass.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        channels = (3, *config.cnn_channels)
        self.trunk = nn.Sequential(
            *(conv_block(c_in, c_out) for c_in, c_out in itertools.pairwise(channels)),
            nn.AdaptiveAvgPool2d(POOLED_GRID),
            nn.Flatten(),
            nn.Linear(channels[-1] * POOLED_GRID * POOLED_GRID, config.image_features),
            nn.ReLU(inplace=True),
        )
        self.heads = GaussianHeads(config.image_features, config, gaussian=config.gaussian_images)
        self.feature_dim = config.image_features
        init_linear(self)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """images (N, 3, H, W) -> trunk features (N, F)."""
        return self.trunk(images)

    def forward(
        self, images: torch.Tensor, head_masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.features(images)  # (N, F)
        return self.heads(apply_head_masks(features, head_masks))  # (S * N, D) each
