"""encode_split_means (FeatureHeads.means over a split): the deterministic means alone, which
the training's whole-gallery variance targets read each epoch, must be exactly the means of
the full encode (dropout off, both heads run) that they replace, or the targets and every
model trained on them would change."""

import pytest
import torch

from models.networks.probabilistic_model import HeadsModel
from models.training.train import encode_split, encode_split_means
from models.training.training_data import SplitTensors
from tests.models.conftest import TINY_HEADS


@pytest.mark.parametrize("reads_backbone", [False, True])
@pytest.mark.parametrize("normalize_mu", [True, False])
def test_the_means_alone_equal_the_full_encodes_means(reads_backbone, normalize_mu) -> None:
    generator = torch.Generator().manual_seed(3)
    config = TINY_HEADS.replace(
        dropout=0.5, variance_reads_backbone=reads_backbone, normalize_mu=normalize_mu
    )
    model = HeadsModel(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    split = SplitTensors(
        pixels=3.0 * torch.randn(700, 6, generator=generator),  # more than one block of 512
        ids=torch.randn(900, 4, generator=generator),
        lengths=torch.ones(900, dtype=torch.int64),
        caption_image=torch.arange(900) % 700,
    )
    image_mu, _, caption_mu, _ = encode_split(model, split, torch.device("cpu"))
    image_means, caption_means = encode_split_means(model, split, torch.device("cpu"))
    assert torch.equal(image_means, image_mu)
    assert torch.equal(caption_means, caption_mu)
