"""Small CNN image encoder (64x64 input) with MC-dropout masks in the trunk and before the heads."""

from __future__ import annotations

import itertools

import torch
from torch import nn

from models.networks.heads import GaussianHeads, init_linear
from models.networks.model_config import ModelConfig

POOLED_GRID = 4  # the last feature map is average-pooled to 4x4 (keeps coarse layout)


def conv_block(in_channels: int, out_channels: int, stride: int = 2) -> nn.Sequential:
    """3x3 conv (stride 2 halves H and W), batch norm, ReLU."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


def _pool_to_grid(image_size: int, halvings: int) -> nn.Module:
    """Average pooling of the last feature map down to POOLED_GRID x POOLED_GRID.

    A fixed kernel rather than adaptive pooling: the exported graph sees dynamic spatial
    sizes (the draws are stacked into the batch), which adaptive pooling cannot export with.
    """
    side = image_size // 2**halvings
    if side < POOLED_GRID or side % POOLED_GRID:
        raise ValueError(
            f"image size {image_size} halved {halvings} times leaves a {side}x{side} map, "
            f"which does not pool evenly to {POOLED_GRID}x{POOLED_GRID}"
        )
    return nn.Identity() if side == POOLED_GRID else nn.AvgPool2d(side // POOLED_GRID)


class ImageEncoder(nn.Module):
    """images (N, 3, H, W) + dropout masks (S, N, W) -> mu, logvar (S * N, D), draw-major.

    A mask row holds one multiplier per channel of each conv block (channel dropout, the
    same for every pixel) and one per trunk feature, in that order (W =
    config.image_mask_width). Dropout in the trunk, not only before the heads, is what lets
    the MC draws disagree on inputs unlike the training images; the price is that the trunk
    runs once per draw.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        channels = (3, *config.cnn_channels)
        strides = (config.stem_stride, *[2] * (len(config.cnn_channels) - 1))
        self.blocks = nn.ModuleList(
            conv_block(c_in, c_out, stride)
            for (c_in, c_out), stride in zip(itertools.pairwise(channels), strides, strict=True)
        )
        halvings = len(config.cnn_channels) - (config.stem_stride == 1)
        self.project = nn.Sequential(
            _pool_to_grid(config.image_size, halvings),
            nn.Flatten(),
            nn.Linear(channels[-1] * POOLED_GRID * POOLED_GRID, config.image_features),
            nn.ReLU(inplace=True),
        )
        self.heads = GaussianHeads(config.image_features, config, gaussian=config.gaussian_images)
        self.mask_widths = (*config.cnn_channels, config.image_features)
        init_linear(self)

    def forward(
        self, images: torch.Tensor, masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        num_draws = masks.shape[0]
        x = images.unsqueeze(0).expand(num_draws, *images.shape).flatten(0, 1)  # (S*N, 3, H, W)
        parts = masks.flatten(0, 1).split(self.mask_widths, dim=1)  # each (S*N, C_k)
        for block, mask in zip(self.blocks, parts[:-1], strict=True):
            x = block(x) * mask[:, :, None, None]
        features = self.project(x) * parts[-1]  # (S*N, F)
        return self.heads(features)  # (S * N, D) each
