"""Encoders and heads: shapes, variance bounds, covariance shapes, point modalities, and the
MC-dropout mask contract (ones = deterministic, draw-major blocks, no hidden randomness)."""

import math
from dataclasses import replace

import pytest
import torch

from models.networks.heads import GaussianHeads, dropout_masks
from models.networks.image_encoder import ObjectDetectors, trunk_blocks
from models.networks.model_config import COVARIANCES, MODEL_TYPES, ConfigError, ModelConfig
from models.networks.probabilistic_model import ProbabilisticModel

VOCAB = 40


def make_model(model_type: str = "gcie", **fields) -> ProbabilisticModel:
    torch.manual_seed(0)
    config = ModelConfig(model_type=model_type, vocab_size=VOCAB, embed_dim=8, **fields)
    return ProbabilisticModel(config).eval()


def image_inputs(model: ProbabilisticModel, batch: int, draws: int, p: float = 0.5):
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(batch, 3, 64, 64, generator=generator)
    return images, dropout_masks(model.image_mask_shape(draws, batch), p, generator)


def text_inputs(model: ProbabilisticModel, batch: int, draws: int, p: float = 0.5):
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(2, VOCAB, (batch, 6), generator=generator)
    lengths = torch.tensor([6, 1, 3, 6, 2][:batch])
    word_shape, head_shape = model.text_mask_shapes(draws, batch, 6)
    return (
        ids,
        lengths,
        dropout_masks(word_shape, p, generator),
        dropout_masks(head_shape, p, generator),
    )


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_output_shapes_and_point_modalities(model_type: str) -> None:
    model = make_model(model_type)
    images, image_masks = image_inputs(model, batch=4, draws=3)
    ids, lengths, word_masks, head_masks = text_inputs(model, batch=5, draws=2)
    with torch.no_grad():
        image_mu, image_logvar = model.image_encoder(images, image_masks)
        text_mu, text_logvar = model.text_encoder(ids, lengths, word_masks, head_masks)
    assert image_mu.shape == image_logvar.shape == (12, 8)
    assert text_mu.shape == text_logvar.shape == (10, 8)
    torch.testing.assert_close(image_mu.norm(dim=1), torch.ones(12))
    constant = model.config.point_logvar
    assert torch.all(image_logvar == constant).item() is not model.config.gaussian_images
    assert torch.all(text_logvar == constant).item() is not model.config.gaussian_captions


def test_variance_stays_within_bounds_for_extreme_features() -> None:
    config = ModelConfig(embed_dim=6, var_min=0.5, var_max=2.0)
    heads = GaussianHeads(4, config, gaussian=True)
    features = torch.tensor([[1e4] * 4, [-1e4] * 4, [0.0] * 4])
    _, logvar = heads(features)
    assert logvar.min() >= math.log(0.5) - 1e-6
    assert logvar.max() <= math.log(2.0) + 1e-6
    assert logvar.max() - logvar.min() > 0.5 * (math.log(2.0) - math.log(0.5))


@pytest.mark.parametrize("covariance", COVARIANCES)
def test_covariance_shapes(covariance: str) -> None:
    config = ModelConfig(embed_dim=6, covariance=covariance)
    heads = GaussianHeads(5, config, gaussian=True)
    _, logvar = heads(torch.randn(3, 5))
    assert logvar.shape == (3, 6)
    equal_dims = bool(torch.all(logvar == logvar[:, :1]))
    assert equal_dims is (covariance != "ellipsoidal")
    width = 1 if covariance == "spherical-one-value" else 6
    assert heads.logvar_head is not None and heads.logvar_head.out_features == width


def test_avgpool_is_the_soft_clamped_mean_of_the_raw_outputs() -> None:
    config = ModelConfig(embed_dim=4, covariance="spherical-avgpool", var_min=0.1, var_max=10.0)
    heads = GaussianHeads(3, config, gaussian=True)
    features = torch.randn(2, 3)
    x = heads.logvar_head(features).mean(dim=1, keepdim=True) + config.logvar_init
    low, high = math.log(0.1), math.log(10.0)
    # softplus written out: ln(1 + e^z)
    expected = low + torch.log1p(torch.exp(x - low)) - torch.log1p(torch.exp(x - high))
    torch.testing.assert_close(heads(features)[1], expected.expand(2, 4))


def test_logvar_follows_the_head_inside_the_bounds_and_never_freezes() -> None:
    """Well inside the safety bounds the log-variance is the head's output (gradient ~1), so a
    loss can move it; only near a bound does the gradient fade."""
    config = ModelConfig(embed_dim=3)
    heads = GaussianHeads(2, config, gaussian=True)
    features = torch.randn(5, 2)
    raw = heads.logvar_head(features) + config.logvar_init
    _, logvar = heads(features)
    torch.testing.assert_close(logvar, raw, atol=1e-3, rtol=0)
    logvar.sum().backward()
    assert heads.logvar_head.bias.grad is not None
    torch.testing.assert_close(
        heads.logvar_head.bias.grad, torch.full((3,), 5.0), atol=1e-2, rtol=0
    )


def test_mean_and_logvar_heads_share_no_parameters() -> None:
    heads = GaussianHeads(5, ModelConfig(embed_dim=6), gaussian=True)
    mu_params = {id(p) for p in heads.mu_head.parameters()}
    logvar_params = {id(p) for p in heads.logvar_head.parameters()}
    assert mu_params and logvar_params and not mu_params & logvar_params
    assert heads.mu_head.weight.shape == heads.logvar_head.weight.shape  # duplicated


def test_draw_blocks_equal_single_draw_calls() -> None:
    model = make_model()
    images, image_masks = image_inputs(model, batch=4, draws=3)
    ids, lengths, word_masks, head_masks = text_inputs(model, batch=5, draws=3)
    with torch.no_grad():
        image_mu, _ = model.image_encoder(images, image_masks)
        text_mu, text_logvar = model.text_encoder(ids, lengths, word_masks, head_masks)
        for s in range(3):
            one_mu, _ = model.image_encoder(images, image_masks[s : s + 1])
            torch.testing.assert_close(image_mu[s * 4 : (s + 1) * 4], one_mu)
            one = model.text_encoder(ids, lengths, word_masks[s : s + 1], head_masks[s : s + 1])
            torch.testing.assert_close(text_mu[s * 5 : (s + 1) * 5], one[0])
            torch.testing.assert_close(text_logvar[s * 5 : (s + 1) * 5], one[1])


def test_ones_mask_is_the_deterministic_pass_and_masks_change_outputs() -> None:
    model = make_model()
    images, image_masks = image_inputs(model, batch=4, draws=2)
    with torch.no_grad():
        deterministic = model.encode_images(images)
        again = model.image_encoder(images, torch.ones_like(image_masks))
        masked = model.image_encoder(images, image_masks)
    torch.testing.assert_close(again[0][:4], deterministic[0])
    torch.testing.assert_close(again[0][4:], deterministic[0])
    assert not torch.allclose(masked[0][:4], deterministic[0])


def test_padding_after_a_caption_does_not_change_its_embedding() -> None:
    model = make_model()
    ids = torch.tensor([[5, 9, 7]])
    padded = torch.tensor([[5, 9, 7, 0, 0, 0]])
    with torch.no_grad():
        short = model.encode_texts(ids, torch.tensor([3]))
        long = model.encode_texts(padded, torch.tensor([3]))
        shorter = model.encode_texts(ids, torch.tensor([2]))
    torch.testing.assert_close(short[0], long[0])
    assert not torch.allclose(short[0], shorter[0])


def test_forward_is_deterministic_in_train_mode_given_masks() -> None:
    model = make_model()
    model.train()  # no nn.Dropout inside: all randomness comes from the masks
    images, image_masks = image_inputs(model, batch=3, draws=2)
    with torch.no_grad():
        first = model.image_encoder(images, image_masks)[0]
        second = model.image_encoder(images, image_masks)[0]
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_dropout_masks_values_and_rate() -> None:
    masks = dropout_masks((200, 500), 0.2, torch.Generator().manual_seed(0))
    values = set(masks.unique().tolist())
    assert values == {0.0, 1.25}
    assert abs(float((masks == 0).float().mean()) - 0.2) < 0.01
    assert torch.all(dropout_masks((3, 4), 0.0) == 1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model_type": "gcx"}, "unknown model type"),
        ({"model_type": "vse", "metric": "w2"}, "cannot train a vse model"),
        ({"covariance": "full"}, "unknown covariance"),
        ({"var_min": 5.0, "var_max": 1.0}, "var_min < var_max"),
        ({"dropout": 1.0}, "dropout"),
        ({"image_pooling": "mean"}, "unknown image pooling"),
        ({"cnn_downsample": "avg"}, "unknown cnn downsample"),
        ({"image_query_metric": "cosine"}, "unknown image query metric"),
        ({"search_with": "cosine"}, "unknown search metric"),
    ],
)
def test_config_rejects_bad_values_with_a_clear_message(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**fields)


def test_config_defaults_per_model_type_and_round_trip(tmp_path) -> None:
    assert ModelConfig(model_type="vse").metric == "cosine"
    assert ModelConfig(model_type="vse").search_metric == "w2"
    assert ModelConfig(model_type="gce").metric == "mahalanobis"
    config = ModelConfig(model_type="gie", embed_dim=12, training={"epochs": 3})
    config.save(tmp_path)
    assert ModelConfig.load(tmp_path) == config


def test_image_queries_may_default_to_a_metric_of_their_own(tmp_path) -> None:
    plain = ModelConfig()
    assert plain.default_metric("image") == plain.default_metric("text") == "w2"
    point = ModelConfig(model_type="vse", image_query_metric="kl")
    assert (point.default_metric("image"), point.default_metric("text")) == ("w2", "kl")
    point.save(tmp_path)
    assert ModelConfig.load(tmp_path).default_metric("text") == "kl"
    with pytest.raises(ConfigError, match="not found"):
        ModelConfig.load(tmp_path / "nowhere")


def test_search_with_sets_the_services_default_in_both_directions(tmp_path) -> None:
    trained_cosine = ModelConfig(metric="cosine", search_with="query_mahalanobis")
    assert trained_cosine.metric == "cosine"
    defaults = {g: trained_cosine.default_metric(g) for g in ("image", "text")}
    assert defaults == {"image": "query_mahalanobis", "text": "query_mahalanobis"}
    own_image_metric = replace(trained_cosine, image_query_metric="kl")
    assert own_image_metric.default_metric("text") == "kl"
    trained_cosine.save(tmp_path)
    assert ModelConfig.load(tmp_path).search_metric == "query_mahalanobis"


def test_object_detectors_are_a_per_cell_mlp_maxed_over_the_map() -> None:
    torch.manual_seed(0)
    detectors = ObjectDetectors(in_channels=6, features=5)
    feature_map = torch.randn(3, 6, 4, 4)
    with torch.no_grad():
        got = detectors(feature_map)
        cells = [
            detectors.mlp(feature_map[:, :, i : i + 1, j : j + 1]).flatten(1)
            for i in range(4)
            for j in range(4)
        ]
    torch.testing.assert_close(got, torch.stack(cells).max(dim=0).values)
    shuffled = feature_map.flatten(2)[:, :, torch.randperm(16)].reshape(3, 6, 4, 4)
    torch.testing.assert_close(detectors(shuffled), got)


@pytest.mark.parametrize("stem_stride", [1, 2])
def test_maxpool_trunk_halves_the_map_like_the_strided_one(stem_stride: int) -> None:
    """Both trunks end on the same map size, so the grid projection fits either."""
    maps = {}
    for downsample in ("stride", "maxpool"):
        config = ModelConfig(cnn_downsample=downsample, stem_stride=stem_stride)
        x = torch.randn(2, 3, config.image_size, config.image_size)
        for block in trunk_blocks(config):
            x = block(x)
        maps[downsample] = x.shape
    assert maps["stride"] == maps["maxpool"]
    assert maps["maxpool"][-1] == 64 // 2 ** (3 + (stem_stride == 2))


def test_objects_pooling_model_runs_with_masks_per_block() -> None:
    config = ModelConfig(image_pooling="objects", cnn_downsample="maxpool", embed_dim=8)
    model = ProbabilisticModel(config).eval()
    images = torch.randn(3, 3, 64, 64)
    masks = dropout_masks(model.image_mask_shape(4, 3), 0.3, torch.Generator().manual_seed(1))
    mu, logvar = model.image_encoder(images, masks)
    assert mu.shape == logvar.shape == (12, 8)
    ones = torch.ones(model.image_mask_shape(1, 3))
    torch.testing.assert_close(model.image_encoder(images, ones)[0], model.encode_images(images)[0])
