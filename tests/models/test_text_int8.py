"""The text backbone served with int8 weights (ModelConfig.text_backbone_int8): ONNX Runtime's
dynamic quantization of MiniLM's MatMuls, bounded against the float graph, joined to the float
heads and checked against them."""

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from models.backbones.onnx_backbone import OnnxBackbone, export_backbone
from models.backbones.text_backbone import MiniLM
from models.networks.model_config import (
    IMAGE_ONNX_FILE,
    TEXT_ONNX_FILE,
    ConfigError,
    ModelConfig,
    TrainConfig,
)
from models.networks.probabilistic_model import load_model
from models.onnx import quantize
from models.onnx.encoder_runtime import OnnxEncoder
from models.onnx.export import export_model_dir
from models.onnx.parity import ExportError
from models.onnx.quantize import quantize_text_backbone, row_cosines
from models.training.train import train

CAPTIONS = ["a red apple", "cartoon cat sitting on a fence", "flag of france", "tux penguin"]


@pytest.fixture(scope="module")
def minilm_graph(tmp_path_factory) -> tuple[Path, Path]:
    """MiniLM's float graph and its tokenizer.json."""
    backbone = MiniLM()
    folder = tmp_path_factory.mktemp("minilm")
    return export_backbone(backbone, folder / "text.onnx", CAPTIONS), backbone.tokenizer_file


@pytest.fixture(scope="module")
def pretrained_dir(tmp_path_factory, small_data) -> Path:
    """Small float heads on the shipped backbones, trained for two epochs."""
    config = ModelConfig(
        model_type="gcie", embed_dim=16, head_hidden=32, dropout=0.2,
        image_backbone="efficientnet-lite0", text_backbone="all-minilm-l6-v2",
    )  # fmt: skip
    out = tmp_path_factory.mktemp("models") / "float"
    train(small_data, out, config, TrainConfig(epochs=2, patience=0, seed=0), progress=False,
          log=lambda line: None)  # fmt: skip
    return out


def _op_types(path: Path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path)).graph.node}


def test_row_cosines_are_each_rows_cosine() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
    by_hand = [
        float(np.dot(x, y) / np.sqrt(np.dot(x, x) * np.dot(y, y)))
        for x, y in zip(a, b, strict=True)
    ]
    np.testing.assert_allclose(row_cosines(a, b), by_hand, rtol=1e-12)


def test_int8_minilm_has_integer_matmuls_and_keeps_its_features(minilm_graph, tmp_path) -> None:
    graph, tokenizer = minilm_graph
    out = tmp_path / "text.int8.onnx"
    cosine = quantize_text_backbone(graph, out, tokenizer, CAPTIONS)
    assert "MatMulInteger" in _op_types(out) and "MatMulInteger" not in _op_types(graph)
    float_features = OnnxBackbone(graph, tokenizer).encode(CAPTIONS)
    int8_features = OnnxBackbone(out, tokenizer).encode(CAPTIONS)
    assert cosine == pytest.approx(row_cosines(float_features, int8_features).min())
    assert quantize.MIN_COSINE <= cosine < 1.0 - 1e-6  # changed, but little
    assert out.stat().st_size < 0.8 * graph.stat().st_size


def test_a_quantization_that_loses_the_features_is_refused(
    minilm_graph, tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(quantize, "MIN_COSINE", 1.0)
    graph, tokenizer = minilm_graph
    with pytest.raises(ExportError, match="export without int8 weights"):
        quantize_text_backbone(graph, tmp_path / "text.int8.onnx", tokenizer, CAPTIONS)


def test_int8_needs_pretrained_backbones() -> None:
    with pytest.raises(ConfigError, match="text_backbone_int8 needs pretrained backbones"):
        ModelConfig(text_backbone_int8=True)


def test_an_int8_export_serves_close_to_the_float_one(pretrained_dir, tmp_path) -> None:
    """The same heads exported again with int8 backbone weights: the whole graph holds integer
    MatMuls, passes its parity check against the torch heads (export_model_dir raises
    otherwise), and its caption means stay within a few degrees of the float graph's."""
    int8_dir = tmp_path / "int8"
    shutil.copytree(pretrained_dir, int8_dir)
    ModelConfig.load(int8_dir).replace(text_backbone_int8=True).save(int8_dir)
    differences = export_model_dir(int8_dir)
    assert max(differences.values()) < 1e-4
    assert "MatMulInteger" in _op_types(int8_dir / TEXT_ONNX_FILE)
    assert "MatMulInteger" not in _op_types(pretrained_dir / TEXT_ONNX_FILE)
    served = {
        name: OnnxEncoder(folder, "text").encode_texts(CAPTIONS, mc_samples=3, seed=1)
        for name, folder in (("float", pretrained_dir), ("int8", int8_dir))
    }
    assert not np.array_equal(served["float"].mu, served["int8"].mu)
    assert row_cosines(served["float"].mu, served["int8"].mu).min() > 0.9
    assert load_model(int8_dir).config.text_backbone_int8
    assert "MatMulInteger" not in _op_types(int8_dir / IMAGE_ONNX_FILE)  # images stay float


def test_a_graph_onnx_runtime_cannot_quantize_is_an_export_error(tmp_path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx graph")
    with pytest.raises(ExportError, match=r"cannot give broken\.onnx int8 weights"):
        quantize_text_backbone(broken, tmp_path / "out.onnx", None, CAPTIONS)
