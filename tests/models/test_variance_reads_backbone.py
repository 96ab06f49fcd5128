"""ModelConfig.variance_reads_backbone: the heads' log-variance read from the backbone vector
(models.networks.feature_heads), against the same map written out by hand; training encodes
images as serving does; and a trained model's exported graphs agree with torch."""

from pathlib import Path

import numpy as np
import pytest
import torch

from models.backbones.registry import load_backbone
from models.networks.feature_heads import FeatureHeads
from models.networks.heads import dropout_masks
from models.networks.model_config import ConfigError, ModelConfig, TrainConfig
from models.networks.probabilistic_model import HeadsModel, load_model
from models.onnx.encoder_runtime import OnnxEncoder
from models.onnx.export_pretrained import _heads_parity, export_heads
from models.onnx.parity import PARITY_ATOL
from models.training.train import train
from tests.models.conftest import SMALL_HEADS, TINY_HEADS

READS_BACKBONE = TINY_HEADS.replace(dropout=0.5, variance_reads_backbone=True)


def by_hand(heads: FeatureHeads, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logvar_init + W z + b for z the standardised vector x times its dropout mask, softly
    clamped to the bounds, from the head's parameters and buffers."""
    layer, low, high = heads.heads.logvar_head, heads.heads.logvar_min, heads.heads.logvar_max
    z = (x - heads.standardize.shift) / heads.standardize.scale * mask
    raw = z @ layer.weight.T + layer.bias + heads.heads.logvar_init
    return low + torch.nn.functional.softplus(raw - low) - torch.nn.functional.softplus(raw - high)


def test_refused_without_backbones_and_for_pvse() -> None:
    with pytest.raises(ConfigError, match="variance_reads_backbone needs pretrained"):
        ModelConfig(variance_reads_backbone=True)
    with pytest.raises(ConfigError, match="pvse's variance is the spread"):
        READS_BACKBONE.replace(model_type="pvse", metric="max_pair")


def test_a_new_head_starts_every_item_at_logvar_init() -> None:
    heads = FeatureHeads(6, READS_BACKBONE, gaussian=True)
    _, logvar = heads(torch.randn(7, 6) * 3.0, torch.ones(1, 7, 11))
    torch.testing.assert_close(logvar, logvar[:1].expand(7, 3))  # the same for every item
    assert (logvar - READS_BACKBONE.logvar_init).abs().max() < 1e-3  # soft_clamp's offset


def test_the_log_variance_is_a_map_of_the_dropped_out_backbone_vector() -> None:
    torch.manual_seed(0)
    heads = FeatureHeads(6, READS_BACKBONE, gaussian=True).eval()
    torch.nn.init.normal_(heads.heads.logvar_head.weight)
    generator = torch.Generator().manual_seed(1)
    heads.standardize.fit(torch.randn(50, 6, generator=generator) * 3.0 + 2.0)
    features = torch.randn(4, 6, generator=generator)
    masks = dropout_masks((2, 4, 11), 0.5, generator)
    _, logvar = heads(features, masks)
    for draw in range(2):
        expected = by_hand(heads, features, masks[draw, :, :6])
        torch.testing.assert_close(logvar[draw * 4 : draw * 4 + 4], expected)
    with torch.no_grad():
        heads.hidden[0].weight.mul_(-3.0)  # the hidden units do not reach the variance
    torch.testing.assert_close(heads(features, masks)[1], logvar)


def test_standardize_fits_the_mean_and_sd_of_each_feature() -> None:
    generator = torch.Generator().manual_seed(2)
    rows = torch.randn(200, 6, generator=generator) * torch.arange(1.0, 7.0) + 5.0
    heads = FeatureHeads(6, READS_BACKBONE, gaussian=True)
    heads.standardize.fit(rows)
    z = heads.standardize(rows).double().numpy()
    np.testing.assert_allclose(z.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(z.std(axis=0, ddof=1), 1.0, atol=1e-5)


def test_training_encodes_images_as_serving_does() -> None:
    """The training loop's encode_images_with_features gives the same embedding as
    encode_images under the same dropout draw, and the hidden units the mean head reads."""
    torch.manual_seed(0)
    model = HeadsModel(READS_BACKBONE)
    torch.nn.init.normal_(model.image_encoder.heads.logvar_head.weight)
    features = torch.randn(5, 6)
    (mu, logvar), hidden = model.encode_images_with_features(
        features, torch.Generator().manual_seed(3), stochastic=True
    )
    served = model.encode_images(features, torch.Generator().manual_seed(3), stochastic=True)
    torch.testing.assert_close((mu, logvar), served)
    assert hidden.shape == (5, 5)
    assert logvar.std() > 0.1  # the map was not left at its zero start


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory, small_data) -> Path:
    config = SMALL_HEADS.replace(variance_reads_backbone=True)
    out = tmp_path_factory.mktemp("models") / "reads-backbone"
    quick = TrainConfig(epochs=3, patience=0, seed=0, lr=0.01)
    train(small_data, out, config, quick, progress=False)
    return out


def test_a_trained_model_serves_the_variance_it_learned(trained_dir, small_data) -> None:
    """The exported text graph (backbone + heads) against the torch heads on the torch
    backbone's vectors: the learned caption log-variances differ from one another, and the
    checkpoint carries the train split's feature means."""
    model = load_model(trained_dir)
    captions = ["a red circle", "two blue squares and a green star", "a shape"]
    served = OnnxEncoder(trained_dir, "text").encode_texts(captions, mc_samples=0)
    features = torch.from_numpy(load_backbone("all-minilm-l6-v2", "text").encode(captions))
    with torch.no_grad():
        mu, logvar = model.text_encoder(features, torch.ones(1, 3, 384 + 32))
    np.testing.assert_allclose(served.logvar, logvar.numpy(), atol=1e-4)
    np.testing.assert_allclose(served.mu, mu.numpy(), atol=1e-4)
    assert np.ptp(served.logvar.sum(axis=1)) > 1e-3
    cached = next(small_data.glob("features/all-minilm-l6-v2-*/train-text.npz"))
    train_vectors = np.load(cached)["features"]
    np.testing.assert_allclose(
        model.text_encoder.standardize.shift.numpy(), train_vectors.mean(axis=0), atol=1e-6
    )


def test_the_heads_parity_check_feeds_vectors_like_the_training_ones(tmp_path: Path) -> None:
    """Heads fitted to MiniLM-like vectors (sd 0.04 per feature) pass the export's parity
    check: with standard normal inputs, 25 sd out, the log-variance sat in its clamp and
    float32 rounding alone failed the check (3.3e-4)."""
    config = READS_BACKBONE.replace(text_backbone_dim=384, embed_dim=16, head_hidden=32)
    heads = FeatureHeads(384, config, gaussian=True).eval()
    generator = torch.Generator().manual_seed(0)
    heads.standardize.fit(torch.randn(500, 384, generator=generator) * 0.04)
    with torch.no_grad():
        heads.heads.logvar_head.weight.normal_(0.0, 1.0, generator=generator)
    path = tmp_path / "text_heads.onnx"
    export_heads(heads, path)
    assert _heads_parity(heads, path) <= PARITY_ATOL
