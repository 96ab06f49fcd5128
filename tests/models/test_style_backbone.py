"""The style backbone's features against numpy over the network's own activations: each
stage's channel means and sds, the plain backbone's vector, and the channel correlations
(np.corrcoef); then its ONNX export and its name in the registry."""

import re
from pathlib import Path

import numpy as np
import pytest
import skimage.data
import torch
from PIL import Image

from models.backbones.image_backbone import EfficientNetLite0
from models.backbones.registry import load_backbone
from models.backbones.style_backbone import (
    CORRELATED,
    CORRELATION_SCALE,
    READOUT,
    STAGE_ENDS,
    STAGE_SCALE,
    EfficientNetLite0Style,
)
from models.datasets.clipart_render import RenderLimits, render_png
from models.datasets.records import load_dataset
from models.networks.model_config import ConfigError, ModelConfig, TrainConfig
from models.networks.preprocess import load_image
from models.networks.probabilistic_model import load_model
from models.onnx.encoder_runtime import OnnxEncoder
from models.training.train import train

BANANA = Path("/usr/share/openclipart/svg/food/fruit/banana.svg")


@pytest.fixture(scope="module")
def style() -> EfficientNetLite0Style:
    return EfficientNetLite0Style()


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Image.Image]:
    out = tmp_path_factory.mktemp("style") / "banana.png"
    render_png(BANANA, out, 224, RenderLimits())
    return [Image.open(out).convert("RGB"), Image.fromarray(skimage.data.chelsea())]


def stage_outputs(backbone: EfficientNetLite0, pixels: torch.Tensor) -> dict[int, np.ndarray]:
    """The output of each stage's last block, caught by forward hooks on the plain network."""
    caught: dict[int, np.ndarray] = {}
    hooks = [
        backbone.network._blocks[i].register_forward_hook(
            lambda _m, _in, out, i=i: caught.__setitem__(i, out.double().numpy())
        )
        for i, _ in STAGE_ENDS
    ]
    try:
        with torch.no_grad():
            backbone(pixels)
    finally:
        for hook in hooks:
            hook.remove()
    return caught


def expected_features(backbone: EfficientNetLite0, pixels: torch.Tensor) -> np.ndarray:
    caught = stage_outputs(backbone, pixels)
    with torch.no_grad():
        head = backbone(pixels).double().numpy()
    rows = []
    for n in range(len(pixels)):
        parts = []
        for i, channels in STAGE_ENDS:
            flat = caught[i][n].reshape(channels, -1)
            parts += [flat.mean(axis=1) * STAGE_SCALE[i], flat.std(axis=1, ddof=1) * STAGE_SCALE[i]]
        parts.append(head[n])
        for i, channels in STAGE_ENDS:
            if i in CORRELATED:
                corr = np.corrcoef(caught[i][n].reshape(channels, -1))
                parts.append(corr[np.triu_indices(channels, k=1)] * CORRELATION_SCALE)
        rows.append(np.concatenate(parts))
    return np.stack(rows)


def test_features_are_moments_head_and_correlations(style, images) -> None:
    pixels = style.pixels(images)
    with torch.no_grad():
        got = style(pixels).double().numpy()
    expected = expected_features(EfficientNetLite0(), pixels)
    assert got.shape == expected.shape == (2, EfficientNetLite0Style.dim)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_head_part_is_the_plain_backbone(style, images) -> None:
    pixels = style.pixels(images)
    start = sum(2 * c for _, c in STAGE_ENDS)
    with torch.no_grad():
        head = style(pixels)[:, start : start + 1280]
        plain = EfficientNetLite0()(pixels)
    torch.testing.assert_close(head, plain, rtol=1e-5, atol=1e-5)


def test_registry_loads_it_by_name_and_onnx_reproduces_it(images) -> None:
    backbone = load_backbone("efficientnet-lite0-style", "image")
    assert backbone.dim == EfficientNetLite0Style.dim
    # the stages and scales are in the cache key, so features of another readout are not reused
    assert backbone.key.startswith(f"efficientnet-lite0-style-{READOUT}-")
    plain = load_backbone("efficientnet-lite0", "image").key  # unchanged: its caches stay valid
    assert re.fullmatch(r"efficientnet-lite0-[0-9a-f]{12}", plain), plain
    runner = backbone.onnx_runner(threads=1)  # exports and checks parity against torch
    np.testing.assert_allclose(runner(images), backbone.encode(images), rtol=1e-3, atol=1e-3)


def test_registry_names_every_shipped_image_backbone_in_its_error() -> None:
    with pytest.raises(ConfigError, match="efficientnet-lite0, efficientnet-lite0-style"):
        load_backbone("resnet-50", "image")
    with pytest.raises(ConfigError, match="is an image backbone"):
        load_backbone("efficientnet-lite0-style", "text")


def test_heads_on_the_style_backbone_train_export_and_serve(small_data, tmp_path) -> None:
    """The exported image graph (style backbone, then heads) against the torch heads fed the
    torch backbone's features."""
    config = ModelConfig(
        model_type="gcie", embed_dim=8, head_hidden=16, dropout=0.2,
        image_backbone="efficientnet-lite0-style", text_backbone="all-minilm-l6-v2",
    )  # fmt: skip
    out = tmp_path / "model"
    train(small_data, out, config, TrainConfig(epochs=1, patience=0, seed=0), progress=False,
          log=lambda line: None)  # fmt: skip
    images = [load_image(r.path) for r in load_dataset(small_data).split("test").images[:2]]
    served = OnnxEncoder(out, "image").encode_images(images, mc_samples=2, seed=3)
    heads = load_model(out).image_encoder
    features = torch.from_numpy(load_backbone(config.image_backbone, "image").encode(images))
    with torch.no_grad():
        mu, _ = heads(features, torch.ones(1, len(images), sum(heads.mask_widths)))
    assert heads.in_features == EfficientNetLite0Style.dim
    np.testing.assert_allclose(served.mu, mu.numpy(), atol=1e-4)
