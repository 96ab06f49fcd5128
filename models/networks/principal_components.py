"""The image backbone vector projected onto its leading principal components, before the heads.

The style backbone (models.backbones.style_backbone) gives 7,032 features, and the heads' first
layer reading them made most of the cost of an epoch of the demo's recipe. On clip art the first
1,024 principal components of the train split's vectors hold 98% of their variance, and heads
reading them were no worse on val, ahead on both R-Precisions (3 seeds;
benchmarks/results/image_components_val.md), while an epoch took a median of 2.1 s instead of
5.2 s.

The fit runs in float32: on the demo's 5,889 x 7,032 training matrix the float64 fit took twice
as long for the same captured variance (benchmarks/results/pca_fit.md).

The projection is fitted once when training starts, on the train split only, and then frozen:
the training vectors are projected once, and the exported graphs (models.onnx.export_pretrained)
put it in front of the heads, so a served graph still reads the backbone's own vector.
"""

from __future__ import annotations

import torch
from torch import nn

# torch.pca_lowrank is randomised: the same seed gives the same basis on every run.
FIT_SEED = 0
OVERSAMPLING = 16  # extra directions of the randomised range finder, for accuracy
POWER_ITERATIONS = 4


class PrincipalComponents(nn.Module):
    """x (N, F) -> (x - centre) @ basis (N, K): the coordinates of x on the K leading
    principal components of the vectors `fit` saw. Buffers, so the checkpoint and the exported
    graphs carry them; `sd` holds each component's standard deviation on those vectors."""

    def __init__(self, in_features: int, components: int) -> None:
        super().__init__()
        self.in_features, self.components = in_features, components
        self.register_buffer("centre", torch.zeros(in_features))
        self.register_buffer("basis", torch.eye(in_features, components))
        self.register_buffer("sd", torch.ones(components))

    def fit(self, features: torch.Tensor) -> None:
        """Set the centre, basis and sd from the rows of features (N, F), N > K."""
        if features.shape[0] <= self.components:
            raise ValueError(
                f"{self.components} principal components need more than that many training "
                f"vectors; got {features.shape[0]}"
            )
        centre = features.double().mean(dim=0)
        centred = (features.double() - centre).float()
        rank = min(self.components + OVERSAMPLING, *centred.shape)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(FIT_SEED)
            _, singular, v = torch.pca_lowrank(
                centred, q=rank, center=False, niter=POWER_ITERATIONS
            )
        k = self.components
        self.centre.copy_(centre)
        self.basis.copy_(v[:, :k])
        self.sd.copy_(singular[:k] / (features.shape[0] - 1) ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.centre) @ self.basis

    def lift(self, coordinates: torch.Tensor) -> torch.Tensor:
        """Vectors (N, F) in the components' span whose projection is `coordinates` (N, K)."""
        return self.centre + coordinates @ self.basis.T
