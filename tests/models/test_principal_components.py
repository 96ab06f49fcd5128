"""The image heads' principal-component projection: its math against numpy's SVD, and a model
trained with it exported so that the served graphs still read the backbone's own vector."""

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from models.backbones.registry import load_backbone
from models.datasets.records import load_dataset
from models.networks.model_config import ConfigError, ModelConfig, TrainConfig
from models.networks.preprocess import load_image
from models.networks.principal_components import PrincipalComponents
from models.networks.probabilistic_model import load_model
from models.onnx.encoder_runtime import OnnxEncoder
from models.training.train import train
from tests.models.conftest import SMALL_HEADS


def low_rank_data(rows: int = 200, features: int = 30, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scales = np.geomspace(10.0, 0.01, features)
    return (rng.normal(size=(rows, features)) * scales) @ np.linalg.qr(
        rng.normal(size=(features, features))
    )[0] + rng.normal(size=features)


def test_the_fit_matches_numpys_svd_of_the_centred_data() -> None:
    x = low_rank_data()
    pca = PrincipalComponents(30, 5)
    pca.fit(torch.from_numpy(x).float())
    centred = x - x.mean(axis=0)
    _, singular, vt = np.linalg.svd(centred, full_matrices=False)
    basis = pca.basis.double().numpy()
    np.testing.assert_allclose(basis @ basis.T, vt[:5].T @ vt[:5], atol=1e-5)
    np.testing.assert_allclose(pca.sd.numpy(), singular[:5] / np.sqrt(len(x) - 1), rtol=1e-4)
    projected = pca(torch.from_numpy(x).float()).double().numpy()
    np.testing.assert_allclose(projected @ basis.T, centred @ vt[:5].T @ vt[:5], atol=1e-3)


def test_the_fit_is_the_same_every_time_and_leaves_the_global_generator_alone() -> None:
    x = torch.from_numpy(low_rank_data(seed=1)).float()
    first, second = PrincipalComponents(30, 4), PrincipalComponents(30, 4)
    torch.manual_seed(123)
    first.fit(x)
    after_fit = torch.rand(1)
    torch.manual_seed(123)
    second.fit(x)
    assert torch.equal(first.basis, second.basis) and torch.equal(first.sd, second.sd)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(1), after_fit)


@settings(max_examples=25, deadline=None)
@given(arrays(np.float32, (3, 4), elements=st.floats(-100, 100, width=32)))
def test_a_lifted_vector_projects_back_to_its_coordinates(coordinates: np.ndarray) -> None:
    pca = PrincipalComponents(30, 4)
    pca.fit(torch.from_numpy(low_rank_data(seed=2)).float())
    c = torch.from_numpy(coordinates)
    torch.testing.assert_close(pca(pca.lift(c)), c, atol=1e-3, rtol=1e-4)


def test_more_components_than_training_vectors_are_refused() -> None:
    with pytest.raises(ValueError, match="more than that many"):
        PrincipalComponents(30, 10).fit(torch.zeros(10, 30))


def test_the_config_refuses_components_without_backbones_or_beyond_the_vector() -> None:
    with pytest.raises(ConfigError, match="needs pretrained backbones"):
        ModelConfig(image_components=8)
    backbones = {"image_backbone": "efficientnet-lite0", "text_backbone": "all-minilm-l6-v2"}
    with pytest.raises(ConfigError, match="cannot exceed"):
        ModelConfig(**backbones, image_backbone_dim=6, text_backbone_dim=4, image_components=7)
    with pytest.raises(ConfigError, match=">= 0"):
        ModelConfig(**backbones, image_components=-1)
    config = ModelConfig(**backbones, image_backbone_dim=6, text_backbone_dim=4, head_hidden=5)
    assert config.replace(image_components=3).head_mask_width("image") == 3 + 5
    assert config.replace(image_components=3).head_mask_width("text") == 4 + 5


PROJECTED = SMALL_HEADS.replace(variance_reads_backbone=True, image_components=6)


@pytest.fixture(scope="module")
def projected_dir(tmp_path_factory, small_data) -> Path:
    out = tmp_path_factory.mktemp("models") / "projected"
    quick = TrainConfig(epochs=2, patience=0, seed=0)
    train(small_data, out, PROJECTED, quick, progress=False, log=lambda line: None)
    return out


def test_training_fits_the_projection_on_the_train_split(projected_dir, small_data) -> None:
    model = load_model(projected_dir)
    backbone = load_backbone("efficientnet-lite0", "image")
    train_images = load_dataset(small_data).split("train").images
    features = backbone.encode([load_image(r.path) for r in train_images])
    torch.testing.assert_close(
        model.image_projection.centre, torch.from_numpy(features.mean(axis=0)), atol=1e-4, rtol=0
    )
    assert model.image_encoder.in_features == 6


def test_the_served_graphs_read_the_backbone_vector_and_project_it(projected_dir, small_data):
    """The whole image path and the heads alone (fed the backbone's 1,280 values) give the
    torch heads' embedding of the projected vector, draws included."""
    model = load_model(projected_dir)
    images = [load_image(r.path) for r in load_dataset(small_data).split("test").images[:3]]
    features = torch.from_numpy(load_backbone("efficientnet-lite0", "image").encode(images))
    with torch.no_grad():
        ones = torch.ones(1, 3, PROJECTED.head_mask_width("image"))
        mu, logvar = model.image_encoder(model.image_projection(features), ones)
    whole = OnnxEncoder(projected_dir, "image").encode_images(images, mc_samples=3, seed=4)
    heads = OnnxEncoder(projected_dir, "image", heads_only=True)
    alone = heads.encode_features(features.numpy(), mc_samples=3, seed=4)
    assert heads.feature_dim == 1280
    for got in (whole, alone):
        np.testing.assert_allclose(got.mu, mu.numpy(), atol=1e-4)
        np.testing.assert_allclose(got.logvar, logvar.numpy(), atol=1e-4)
    np.testing.assert_allclose(alone.mc_mu, whole.mc_mu, atol=1e-4)
    assert np.abs(whole.mc_mu - whole.mu).max() > 1e-3


def test_novelty_reads_the_whole_backbone_vector_not_the_components(projected_dir, small_data):
    """Unfamiliar pictures differ most where the projection drops: the bank holds the train
    drawings' whole vectors and the served novelty is theirs."""
    model = load_model(projected_dir)
    novelty = model.image_encoder.novelty
    assert novelty.bank.shape[1] == 1280
    images = [load_image(r.path) for r in load_dataset(small_data).split("test").images[:3]]
    features = torch.from_numpy(load_backbone("efficientnet-lite0", "image").encode(images))
    served = OnnxEncoder(projected_dir, "image").encode_images(images)
    with torch.no_grad():
        np.testing.assert_allclose(served.novelty, novelty(features).numpy(), atol=1e-5)


def test_more_components_than_training_drawings_is_a_clear_error(small_data, tmp_path) -> None:
    quick = TrainConfig(epochs=1, patience=0, seed=0)
    config = PROJECTED.replace(image_components=500)
    with pytest.raises(ConfigError, match="image_components: 500 principal components"):
        train(small_data, tmp_path / "m", config, quick, progress=False, export=False)
    assert not (tmp_path / "m" / "checkpoint.pt").exists()
    assert not (tmp_path / "m" / "novelty_bank.npy").exists()
