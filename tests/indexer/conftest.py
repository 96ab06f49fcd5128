"""Fixtures of the indexer tests: a small shapes dataset and an untrained (random-weight)
model exported to ONNX; the indexer only needs real encoders, not good ones."""

from pathlib import Path

import pytest
import torch

from models.datasets.records import load_dataset
from models.datasets.shapes import generate_shapes
from models.networks.model_config import VOCAB_FILE, ModelConfig
from models.networks.probabilistic_model import ProbabilisticModel
from models.networks.tokenizer import Tokenizer
from models.onnx.export import export_encoders

SHAPES_IMAGES = 120


@pytest.fixture(scope="session")
def small_shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shapes dataset dir of SHAPES_IMAGES images (5 captions each)."""
    out = tmp_path_factory.mktemp("indexer-data") / "shapes"
    return generate_shapes(out, SHAPES_IMAGES, seed=0, workers=1, progress=False)


@pytest.fixture(scope="session")
def random_model(tmp_path_factory: pytest.TempPathFactory, small_shapes: Path) -> Path:
    """A gcie model dir (D = 8, seeded random weights) with both ONNX encoders."""
    out = tmp_path_factory.mktemp("indexer-model") / "random-gcie"
    out.mkdir()
    tokenizer = Tokenizer.build(c.text for c in load_dataset(small_shapes).captions)
    config = ModelConfig(
        model_type="gcie", embed_dim=8, vocab_size=len(tokenizer), name="random-gcie"
    )
    torch.manual_seed(0)
    model = ProbabilisticModel(config).eval()
    config.save(out)
    tokenizer.save(out / VOCAB_FILE)
    export_encoders(model, out, verify=False)
    return out
