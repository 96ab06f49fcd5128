"""The novelty score of image queries (models.networks.feature_novelty): the cosine distance to
the nearest training vector, checked against a brute-force loop, stored in the checkpoint and
served by the exported graphs."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image

from models.backbones.registry import load_backbone
from models.datasets.records import load_dataset
from models.datasets.shapes import generate_shapes
from models.networks.feature_novelty import NOVELTY_BANK_FILE, FeatureNovelty
from models.networks.model_config import (
    IMAGE_HEADS_ONNX_FILE,
    ConfigError,
    ModelConfig,
    TrainConfig,
)
from models.networks.preprocess import load_image
from models.networks.probabilistic_model import load_model
from models.onnx.encoder_runtime import OnnxEncoder
from models.training.train import train


def brute_force_novelty(query: np.ndarray, bank: np.ndarray) -> float:
    """1 - max over the bank's rows of cos(query, row), one row at a time."""
    best = -math.inf
    for row in bank:
        cosine = float(np.dot(query, row) / (np.linalg.norm(query) * np.linalg.norm(row)))
        best = max(best, cosine)
    return 1.0 - best


# Away from zero by construction, not by a filter: filtering 45 elements an example made
# Hypothesis discard most examples and fail its filter_too_much health check at random.
_SMALLEST = 2.0**-10
finite = st.one_of(st.floats(_SMALLEST, 10, width=32), st.floats(-10, -_SMALLEST, width=32))


@settings(max_examples=40, deadline=None)
@given(
    training=arrays(np.float32, (9, 5), elements=finite),
    queries=arrays(np.float32, (3, 5), elements=finite),
    rows=st.integers(1, 9),
    seed=st.integers(0, 1000),
)
def test_novelty_is_one_minus_the_best_cosine_over_a_sample_of_training_rows(
    training, queries, rows, seed
) -> None:
    novelty = FeatureNovelty(rows, 5)
    novelty.fit(torch.from_numpy(training), seed)
    bank = novelty.bank.numpy()
    for row in bank:  # each bank row is one training row, normalised
        distances = [brute_force_novelty(row, training[i : i + 1]) for i in range(9)]
        assert min(distances) < 1e-5
    got = novelty(torch.from_numpy(queries)).numpy()
    expected = [brute_force_novelty(q, bank) for q in queries]
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert novelty(torch.from_numpy(bank[:1] * 3.0)).item() == pytest.approx(0.0, abs=1e-5)


def test_a_bank_larger_than_the_training_vectors_is_refused() -> None:
    with pytest.raises(ValueError, match="holds 4 vectors; 3 given"):
        FeatureNovelty(4, 2).fit(torch.ones(3, 2), 0)


PRETRAINED = ModelConfig(
    model_type="gcie", embed_dim=8, head_hidden=16, dropout=0.1,
    image_backbone="efficientnet-lite0", text_backbone="all-minilm-l6-v2", novelty_bank=10,
)  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    data = generate_shapes(
        tmp_path_factory.mktemp("novelty") / "shapes", 30, seed=3, progress=False, workers=1
    )
    out = tmp_path_factory.mktemp("models") / "novelty"
    quick = TrainConfig(epochs=1, patience=0, seed=0)
    train(data, out, PRETRAINED, quick, progress=False, log=lambda line: None)
    return data, out


def test_the_bank_holds_training_vectors_and_the_graphs_serve_the_score(trained) -> None:
    """The checkpoint's bank is 10 of the train split's backbone vectors; the whole image path
    and the image heads alone give each image's novelty as the brute-force loop does, a
    training image in the bank scores 0, and the text graphs have no novelty."""
    data, model_dir = trained
    bank = load_model(model_dir).image_encoder.novelty.bank.numpy()
    assert bank.shape == (10, 1280)
    np.testing.assert_array_equal(np.load(model_dir / NOVELTY_BANK_FILE), bank)
    weights = torch.load(model_dir / "checkpoint.pt", weights_only=True)["state_dict"]
    assert not [key for key in weights if "novelty" in key]  # saved once, not every epoch
    train_images = [load_image(r.path) for r in load_dataset(data).split("train").images]
    backbone = load_backbone("efficientnet-lite0", "image")
    train_vectors = backbone.encode(train_images)
    for row in bank:
        assert min(brute_force_novelty(row, v[None]) for v in train_vectors) < 1e-4
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 256, (224, 224, 3), np.uint8))
    queries = [*train_images, noise]
    vectors = backbone.encode(queries)
    expected = [brute_force_novelty(v, bank) for v in vectors]
    whole = OnnxEncoder(model_dir, "image").encode_images(queries, mc_samples=2, seed=1)
    heads = OnnxEncoder(model_dir, "image", heads_only=True).encode_features(vectors)
    np.testing.assert_allclose(whole.novelty, expected, atol=1e-4)
    np.testing.assert_allclose(heads.novelty, expected, atol=1e-4)
    assert sum(value < 1e-4 for value in whole.novelty) >= 10  # the bank's own images
    assert OnnxEncoder(model_dir, "text").encode_texts(["a red circle"]).novelty is None
    saved = json.loads((model_dir / "model.json").read_text())
    assert saved["novelty_bank"] == 10
    assert "novelty" in saved["onnx_io"][IMAGE_HEADS_ONNX_FILE]["outputs"]


def test_the_bank_is_cut_to_the_train_split_and_an_older_model_json_has_none(
    trained, tmp_path
) -> None:
    data, model_dir = trained
    out = tmp_path / "big-bank"
    config = PRETRAINED.replace(novelty_bank=4096)
    train(data, out, config, TrainConfig(epochs=1, patience=0), progress=False, log=print)
    images = len(load_dataset(data).split("train").images)
    assert ModelConfig.load(out).novelty_bank == images
    saved = json.loads((model_dir / "model.json").read_text())
    del saved["novelty_bank"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "model.json").write_text(json.dumps(saved))
    assert ModelConfig.load(tmp_path / "old").novelty_bank == 0


def test_a_model_whose_bank_file_is_missing_is_refused(trained, tmp_path) -> None:
    _, model_dir = trained
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("model.json", "checkpoint.pt"):
        (copy / name).write_bytes((model_dir / name).read_bytes())
    with pytest.raises(ConfigError, match="novelty bank was not saved"):
        load_model(copy)


def test_heads_train_on_one_thread_and_the_command_keeps_its_own(
    trained, tmp_path, monkeypatch
) -> None:
    """The heads' epochs run on one torch thread whatever the command set; afterwards the
    command's count is back."""
    import models.training.train as training

    data, _ = trained
    seen = []
    real_epoch = training.train_epoch

    def recording_epoch(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real_epoch(*args, **kwargs)

    monkeypatch.setattr(training, "train_epoch", recording_epoch)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        train(data, tmp_path / "m", PRETRAINED, TrainConfig(epochs=2, patience=0),
              progress=False, log=lambda line: None, export=False)  # fmt: skip
        assert seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
