"""Session fixtures other test packages reuse: a generated shapes dataset (`shapes_dir`) and a
small gcie model trained on it (`tiny_model_dir`). Both are read-only: copy before changing.
And `split_and_model`: the shapes train split with an untrained cosine model, for the
variance objectives' whole-split targets. `small_data`: 60 shapes images for the tests of heads
on the pretrained backbones, one per test module (each caches its backbone features in it)."""

from pathlib import Path

import pytest
import torch

from models.datasets.shapes import generate_shapes
from models.networks.model_config import ModelConfig, TrainConfig
from models.networks.probabilistic_model import build_model
from models.training.train import train
from models.training.training_data import load_splits

SHAPES_IMAGES = 1000  # 800 train / 100 val / 100 test images, 5 captions each
TINY_MODEL = ModelConfig(model_type="gcie", metric="w2", covariance="ellipsoidal", embed_dim=16)
# Heads on two backbones' vectors, small enough to train or check by hand (vectors of 6 and 4
# features stand in for the backbones'; the names only say which backbone a graph would load).
TINY_HEADS = ModelConfig(
    model_type="gcie",
    embed_dim=3,
    head_hidden=5,
    image_backbone="efficientnet-lite0",
    text_backbone="all-minilm-l6-v2",
    image_backbone_dim=6,
    text_backbone_dim=4,
    novelty_bank=0,
)
# Heads trained on the shipped backbones' real features of a small dataset (`small_data`).
SMALL_HEADS = ModelConfig(
    model_type="gcie",
    embed_dim=16,
    head_hidden=32,
    dropout=0.2,
    image_backbone="efficientnet-lite0",
    text_backbone="all-minilm-l6-v2",
)
# The default optimiser settings, a fixed number of epochs (no early stop).
TINY_TRAINING = TrainConfig(epochs=16, patience=0, seed=0)


@pytest.fixture(scope="session")
def shapes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shapes dataset dir (generate_shapes, seed 0, SHAPES_IMAGES images, splits train/val/test)."""
    return generate_shapes(
        tmp_path_factory.mktemp("data") / "shapes", SHAPES_IMAGES, seed=0, progress=False, workers=1
    )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, shapes_dir: Path) -> Path:
    """Model dir of a gcie / w2 / ellipsoidal model (D = 16) trained briefly on `shapes_dir`:
    model.json (with its validation recalls), checkpoint.pt, vocab.json, image_encoder.onnx,
    text_encoder.onnx. Its retrieval is well above chance but far from good."""
    out = tmp_path_factory.mktemp("models") / "tiny-gcie"
    train(shapes_dir, out, TINY_MODEL, TINY_TRAINING, progress=False, log=lambda line: None)
    return out


@pytest.fixture(scope="module")
def split_and_model(shapes_dir: Path):
    """The shapes train split and an untrained gcie (cosine, D = 8) model, seeded."""
    config = ModelConfig(embed_dim=8, metric="cosine", variance_reads_only=True)
    train_split, _, tokenizer = load_splits(shapes_dir, config)
    torch.manual_seed(0)
    return train_split, build_model(config.replace(vocab_size=len(tokenizer)))


@pytest.fixture(scope="module")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shapes dataset of 60 images (seed 2), small enough to run the backbones over."""
    return generate_shapes(
        tmp_path_factory.mktemp("small") / "shapes", 60, seed=2, progress=False, workers=1
    )
