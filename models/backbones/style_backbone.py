"""EfficientNet-Lite0 read at every stage: what a drawing shows and how it is drawn.

The plain backbone (models.backbones.image_backbone) keeps only the last convolution's
channels averaged over the image: what ImageNet taught the network to name. Clip art is
grouped by how it is drawn as much as by what it shows (an icon theme, a flag set, a map
series), and that lives in the earlier stages. This backbone also returns, for the last block
of each of six stages, every channel's mean and standard deviation over the image, and for the
three finest of them (56 x 56, 28 x 28 and 14 x 14) the correlations between their channels:
the texture statistics of Gatys et al. (2015), upper triangle only. On the clip-art val split
(3 seeds) they lift vse-nce's P@1 from 48.6 to 55.8 (i2t) and from 52.9 to 57.5 (t2i) over the
plain vector, and the demo's Gaussian heads' from 47.7 to 54.0 and from 52.5 to 55.7
(benchmarks/results/style_features_val.md; the trials that chose the parts:
style_features_trials_val.md).

Each part is multiplied by a fixed constant that brings its values to the size of the head's
features on clip-art drawings (root mean square over 64 drawings), so that no part swamps the
heads' first layer. The constants are part of the backbone, not fitted per dataset: the
features of an image never depend on which gallery it is in.
"""

from __future__ import annotations

import hashlib

import torch

from models.backbones.image_backbone import EfficientNetLite0

# The last block of each stage from the second on: (block index, its output channels).
STAGE_ENDS = ((2, 24), (4, 40), (7, 80), (10, 112), (14, 192), (15, 320))
CORRELATED = (2, 4, 7)  # stages whose channel correlations are kept
STAGE_SCALE = {2: 0.101, 4: 0.0947, 7: 0.133, 10: 0.102, 14: 0.117, 15: 0.276}
CORRELATION_SCALE = 8.45
HEAD_DIM = 1280
# In the feature cache's key: features cached under other stages or scales are not reused.
READOUT = hashlib.sha256(
    repr((STAGE_ENDS, CORRELATED, STAGE_SCALE, CORRELATION_SCALE)).encode()
).hexdigest()[:8]


def _pairs(channels: int) -> int:
    return channels * (channels - 1) // 2


class EfficientNetLite0Style(EfficientNetLite0):
    """uint8 pixels (N, 3, 224, 224) -> features (N, 7032) float32: per stage the channels'
    means and sds, then the head's 1280 features (the plain backbone's vector), then the
    channel correlations of the CORRELATED stages."""

    name = "efficientnet-lite0-style"
    readout = f"-{READOUT}"
    dim = (
        sum(2 * c for _, c in STAGE_ENDS)
        + HEAD_DIM
        + sum(_pairs(c) for i, c in STAGE_ENDS if i in CORRELATED)
    )

    def __init__(self) -> None:
        super().__init__()
        for index, channels in STAGE_ENDS:
            if index in CORRELATED:
                rows, cols = torch.triu_indices(channels, channels, offset=1)
                self.register_buffer(f"pairs_{index}", rows * channels + cols)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        network = self.network
        x = (pixels.float() - self.mean) / self.std
        x = network._swish(network._bn0(network._conv_stem(x)))
        moments, correlations = [], []
        for index, block in enumerate(network._blocks):
            x = block(x, drop_connect_rate=0.0)
            if index in STAGE_SCALE:
                scale = STAGE_SCALE[index]
                moments += [x.mean(dim=(2, 3)) * scale, x.std(dim=(2, 3)) * scale]
            if index in CORRELATED:
                correlations.append(self._correlations(x, getattr(self, f"pairs_{index}")))
        head = network._swish(network._bn1(network._conv_head(x))).mean(dim=(2, 3))
        return torch.cat([*moments, head, *correlations], dim=1)

    @staticmethod
    def _correlations(x: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
        """Pearson correlations over positions between each pair of channels of x (N, C, H,
        W), the pairs given as flat indices into the C x C matrix, scaled."""
        centred = x.flatten(2) - x.flatten(2).mean(dim=2, keepdim=True)
        covariance = centred @ centred.transpose(1, 2) / centred.shape[2]
        sd = torch.diagonal(covariance, dim1=1, dim2=2).clamp_min(1e-6).sqrt()
        correlation = covariance / (sd.unsqueeze(2) * sd.unsqueeze(1))
        return correlation.flatten(1)[:, pairs] * CORRELATION_SCALE
