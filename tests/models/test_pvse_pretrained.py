"""PVSE on the pretrained backbones: K residual heads of the pooled vector in place of PIE-Net's
attention (models.pvse.network.PvseFeatureHeads) against the formula written out by hand, a
training run on backbone features whose loss falls, and the exported graphs (heads alone and
whole path, image and text) against the torch heads, embeddings and MC draws included."""

import numpy as np
import onnx
import pytest
import torch
from PIL import Image

from models.backbones.registry import load_backbone
from models.datasets.records import load_dataset
from models.networks.heads import dropout_masks
from models.networks.model_config import (
    IMAGE_HEADS_ONNX_FILE,
    IMAGE_ONNX_FILE,
    TEXT_HEADS_ONNX_FILE,
    TEXT_ONNX_FILE,
    ModelConfig,
    TrainConfig,
)
from models.networks.preprocess import load_image
from models.networks.probabilistic_model import PvseHeadsModel, build_model, load_model
from models.onnx.encoder_runtime import OnnxEncoder
from models.pvse.network import PvseFeatureHeads
from models.training.train import train

torch.set_num_threads(1)
PVSE = ModelConfig(
    model_type="pvse",
    embed_dim=16,
    head_hidden=32,
    num_embeds=3,
    dropout=0.2,
    image_backbone="efficientnet-lite0",
    text_backbone="all-minilm-l6-v2",
)
CAPTIONS = ["a red circle", "two blue squares and a green star", "asdf qwerty"]
EPOCHS = 8


@pytest.fixture(scope="module")
def trained(tmp_path_factory, small_data):
    out = tmp_path_factory.mktemp("models") / "pvse-pretrained"
    config = TrainConfig(epochs=EPOCHS, patience=0, batch_size=16, lr=2e-3, seed=0)
    result = train(small_data, out, PVSE, config, progress=False, log=lambda line: None)
    return result, out


def test_k_heads_are_pie_net_fusion_of_the_global_branch_and_residual_heads() -> None:
    """Against the same network written out by hand with torch.nn.functional: dropout on the
    vector and the hidden units, phi = mu_head(relu(W x) * m), upsilon_k = sigmoid(W_k x + b_k),
    z_k = normalize(LayerNorm(phi + upsilon_k)), mu = mean_k z_k, logvar the spread per dim."""
    config = PVSE.replace(image_backbone_dim=6, text_backbone_dim=6, head_hidden=5, embed_dim=4)
    heads = PvseFeatureHeads(6, config).eval()
    with torch.no_grad():  # a LayerNorm other than the identity at init
        heads.norm.weight.uniform_(0.5, 1.5)
        heads.norm.bias.uniform_(-0.5, 0.5)
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(2, 6, generator=generator)
    masks = dropout_masks((2, 2, 11), 0.5, generator)
    mu, logvar, embeddings = heads(features, masks)
    assert mu.shape == logvar.shape == (4, 4) and embeddings.shape == (4, 3, 4)
    functional = torch.nn.functional
    for draw in range(2):
        x = features * masks[draw, :, :6]
        hidden = functional.relu(functional.linear(x, *_weights(heads.hidden[0])))
        phi = functional.linear(hidden * masks[draw, :, 6:], *_weights(heads.heads.mu_head))
        for k in range(3):
            rows = slice(4 * k, 4 * k + 4)
            upsilon = torch.sigmoid(x @ heads.residual.weight[rows].T + heads.residual.bias[rows])
            fused = functional.layer_norm(phi + upsilon, (4,), *_weights(heads.norm))
            want = functional.normalize(fused, dim=-1)
            torch.testing.assert_close(embeddings[draw * 2 : draw * 2 + 2, k], want)
        z = embeddings[draw * 2 : draw * 2 + 2]
        torch.testing.assert_close(mu[draw * 2 : draw * 2 + 2], z.mean(dim=1))
        spread = (z - z.mean(dim=1, keepdim=True)).square().sum(-1).mean(-1)
        torch.testing.assert_close(logvar[draw * 2 : draw * 2 + 2, 0], (spread / 4).log())


def _weights(layer: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    return layer.weight, layer.bias


def test_the_k_embeddings_differ_and_the_model_is_built_from_the_config() -> None:
    model = build_model(PVSE.replace(image_backbone_dim=10, text_backbone_dim=7))
    assert isinstance(model, PvseHeadsModel)
    with torch.no_grad():
        out = model.embed_texts(torch.randn(5, 7, generator=torch.Generator().manual_seed(1)))
    assert out.embeddings.shape == (5, 3, 16)
    torch.testing.assert_close(out.embeddings.norm(dim=-1), torch.ones(5, 3))
    gram = out.embeddings @ out.embeddings.transpose(1, 2)  # (5, K, K)
    assert float(gram[:, 0, 1:].max()) < 0.999  # K different vectors, not one repeated


def test_a_pvse_model_on_backbones_trains_and_its_loss_falls(trained) -> None:
    result, out = trained
    losses = [epoch["loss"] for epoch in result.history]
    assert len(losses) == EPOCHS
    assert np.mean(losses[-3:]) < 0.8 * losses[0], losses
    assert isinstance(load_model(out), PvseHeadsModel)


def test_the_four_graphs_output_the_k_embeddings_within_the_parity_tolerance(trained) -> None:
    result, out = trained
    files = (IMAGE_ONNX_FILE, TEXT_ONNX_FILE, IMAGE_HEADS_ONNX_FILE, TEXT_HEADS_ONNX_FILE)
    assert sorted(result.onnx_max_difference) == sorted(files)
    assert max(result.onnx_max_difference.values()) < 1e-4
    for name in files:
        outputs = [o.name for o in onnx.load(str(out / name)).graph.output]
        assert outputs[:3] == ["mu", "logvar", "embeddings"], (name, outputs)


def test_the_served_whole_path_and_heads_are_the_torch_heads_on_the_backbone(
    trained, small_data
) -> None:
    """ONNX Runtime's whole path (images, captions) and heads alone (backbone vectors) against
    the torch K heads fed the torch backbones' features: deterministic block and MC draws."""
    _, out = trained
    model = load_model(out)
    images = [load_image(r.path) for r in load_dataset(small_data).split("test").images[:3]]
    for modality, inputs in (("image", images), ("text", CAPTIONS)):
        backbone = load_backbone(getattr(PVSE, f"{modality}_backbone"), modality)
        features = backbone.encode(inputs)
        whole = OnnxEncoder(out, modality)
        encode = whole.encode_images if modality == "image" else whole.encode_texts
        served = encode(inputs, mc_samples=3, seed=[4] * len(inputs))
        alone = OnnxEncoder(out, modality, heads_only=True)
        heads_out = alone.encode_features(features, mc_samples=3, seed=[4] * len(inputs))
        heads = model.image_encoder if modality == "image" else model.text_encoder
        with torch.no_grad():
            ones = torch.ones(1, len(inputs), sum(heads.mask_widths))
            mu, logvar, embeddings = heads(torch.from_numpy(features), ones)
        for got in (served, heads_out):
            np.testing.assert_allclose(got.embeddings, embeddings.numpy(), atol=1e-4)
            np.testing.assert_allclose(got.mu, mu.numpy(), atol=1e-4)
            np.testing.assert_allclose(got.logvar, logvar.numpy(), rtol=1e-4, atol=1e-4)
            assert got.mc_embeddings.shape == (3, len(inputs), 3, 16)
        np.testing.assert_allclose(heads_out.mc_embeddings, served.mc_embeddings, atol=1e-4)
        assert np.abs(served.mc_embeddings - served.embeddings).max() > 1e-3  # draws differ


def test_an_image_without_a_caption_still_gets_k_unit_vectors(trained) -> None:
    _, out = trained
    got = OnnxEncoder(out, "image").encode_images([Image.new("RGB", (90, 40), "teal")])
    np.testing.assert_allclose(np.linalg.norm(got.embeddings, axis=-1), 1.0, atol=1e-5)
