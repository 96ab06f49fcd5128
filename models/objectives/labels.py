"""Label supervision: a linear probe reads the dataset's image labels off the image mean.

Trained on captions alone, the shapes image encoder learns colour and not shape: on held-out
images a linear probe finds colour in the image means (AUROC 0.81) but shape barely (0.60),
while the caption means hold both (0.9997), so "a purple star" is answered with any purple
object. The labels (COCO's 80 categories, the shapes data's 30 colour-shape pairs) say for
every image which kinds it holds and which it does not, a dense signal that the hinge over a
batch of captions gives only weakly. The probe is a training aid: it is not part of the
exported encoders. Measured so far (benchmarks/results/recipe_sweep_cpu.md, one seed) it did
not put shape into the image means either (probe AUROC 0.58-0.63 with it), so no recipe uses it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional


class LabelProbe(nn.Module):
    """A linear map from an image mean (N, D) to one logit per label (N, L)."""

    def __init__(self, embed_dim: int, num_labels: int) -> None:
        super().__init__()
        self.linear = nn.Linear(embed_dim, num_labels)

    def forward(self, image_mu: torch.Tensor) -> torch.Tensor:
        return self.linear(image_mu)


def label_loss(probe: LabelProbe, image_mu: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of the probe's logits against multi-hot labels (N, L)."""
    return functional.binary_cross_entropy_with_logits(probe(image_mu), labels)
