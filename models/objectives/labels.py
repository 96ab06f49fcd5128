"""Supervision from the dataset's annotations: linear probes that read what an image holds
off the image side, as training aids (not part of the exported encoders).

Two probes, each with its own weight:
- labels (`label_weight`): the dataset's image labels (COCO's 80 categories, the shapes
  data's 30 colour-shape pairs) off the image *mean*. Measured (recipe_sweep_cpu.md, one seed)
  it did not put shape into the image means (probe AUROC 0.58-0.63 with it).
- attributes (`attribute_weight`): which object attribute values the image holds (each shape,
  colour and size, models.datasets.records.image_attributes) off the trunk *features* the
  heads read. The retrieval losses alone leave the trunk reading colour and barely shape:
  on held-out one-object images a linear probe on the demo model's trunk features finds the
  shape 75% of the time, while the same trunk trained 6 epochs on shape presence alone finds
  it 96-100%, and on the 30 colour-shape pair labels about 77% after 10 epochs: one target
  per attribute value is a far denser signal than one per combination.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional


class LabelProbe(nn.Module):
    """A linear map from image vectors (N, D) to one logit per label (N, L)."""

    def __init__(self, in_features: int, num_labels: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, num_labels)

    def forward(self, image_vectors: torch.Tensor) -> torch.Tensor:
        return self.linear(image_vectors)


def label_loss(probe: LabelProbe, vectors: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of the probe's logits against multi-hot labels (N, L)."""
    return functional.binary_cross_entropy_with_logits(probe(vectors), labels)


class ImageProbes(nn.Module):
    """The label probe on the image means and the attribute probe on the trunk features;
    either is None when its weight is 0."""

    def __init__(
        self,
        embed_dim: int,
        num_labels: int,
        feature_dim: int,
        num_attributes: int,
        weights: tuple[float, float],
    ) -> None:
        super().__init__()
        self.label_weight, self.attribute_weight = weights
        self.labels = LabelProbe(embed_dim, num_labels) if self.label_weight else None
        self.attributes = LabelProbe(feature_dim, num_attributes) if self.attribute_weight else None

    def loss(
        self,
        image_mu: torch.Tensor,
        features: torch.Tensor,
        labels: torch.Tensor,
        attributes: torch.Tensor,
    ) -> torch.Tensor:
        """The weighted sum of both probes' losses on one batch of images."""
        total = image_mu.new_zeros(())
        if self.labels is not None:
            total = total + self.label_weight * label_loss(self.labels, image_mu, labels)
        if self.attributes is not None:
            total = total + self.attribute_weight * label_loss(
                self.attributes, features, attributes
            )
        return total
