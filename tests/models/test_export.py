"""ONNX export: ONNX Runtime reproduces torch (deterministic pass and given masks) for every
model type and covariance, with dynamic batch, draw and token dimensions; the CLI command."""

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from typer.testing import CliRunner

from models.cli import app
from models.networks.heads import dropout_masks
from models.networks.model_config import IMAGE_ONNX_FILE, TEXT_ONNX_FILE, ModelConfig
from models.networks.probabilistic_model import ProbabilisticModel
from models.onnx.export import OPSET, export_encoders

VOCAB = 30
MAXPOOL_TRUNK = {"image_pooling": "objects", "cnn_downsample": "maxpool", "stem_stride": 1}
VARIANTS = {  # name: ModelConfig fields
    "gcie-ellipsoidal": {"model_type": "gcie", "covariance": "ellipsoidal"},
    "gcie-spherical-avgpool": {"model_type": "gcie", "covariance": "spherical-avgpool"},
    "gcie-spherical-one-value": {"model_type": "gcie", "covariance": "spherical-one-value"},
    "gcie-maxpool-objects": {"model_type": "gcie", **MAXPOOL_TRUNK},
    "gce-ellipsoidal": {"model_type": "gce", "covariance": "ellipsoidal"},
    "gie-ellipsoidal": {"model_type": "gie", "covariance": "ellipsoidal"},
    "vse-ellipsoidal": {"model_type": "vse", "covariance": "ellipsoidal"},
}


def run_session(path, feeds: dict[str, torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    mu, logvar = session.run(["mu", "logvar"], {k: v.numpy() for k, v in feeds.items()})
    return mu, logvar


def assert_parity(torch_out, onnx_out) -> None:
    for want, have in zip(torch_out, onnx_out, strict=True):
        assert have.shape == tuple(want.shape)
        np.testing.assert_allclose(have, want.numpy(), rtol=0, atol=1e-4)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each variant with random (seeded) weights, exported once; BatchNorm statistics are
    perturbed so that the exported graph must carry them."""
    models = {}
    for name, fields in VARIANTS.items():
        torch.manual_seed(len(models))
        config = ModelConfig(vocab_size=VOCAB, embed_dim=16, **fields)
        model = ProbabilisticModel(config).eval()
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
        out = tmp_path_factory.mktemp(name)
        export_encoders(model, out, verify=False)
        models[name] = (model, out)
    return models


@pytest.mark.parametrize("variant", VARIANTS)
def test_onnx_matches_torch_deterministic_and_masked(exported, variant) -> None:
    model, out = exported[variant]
    generator = torch.Generator().manual_seed(7)
    batch, draws, steps = 5, 4, 8
    images = torch.randn(batch, 3, 64, 64, generator=generator)
    ids = torch.randint(0, VOCAB, (batch, steps), generator=generator)
    lengths = torch.tensor([8, 1, 5, 3, 8])
    word_shape, head_shape = model.text_mask_shapes(draws, batch, steps)
    for p, num_draws in ((0.0, 1), (0.3, draws)):  # all-ones masks, then random draws
        image_masks = dropout_masks(model.image_mask_shape(num_draws, batch), p, generator)
        word_masks = dropout_masks((num_draws, *word_shape[1:]), p, generator)
        head_masks = dropout_masks((num_draws, *head_shape[1:]), p, generator)
        with torch.no_grad():
            torch_image = model.image_encoder(images, image_masks)
            torch_text = model.text_encoder(ids, lengths, word_masks, head_masks)
        onnx_image = run_session(
            out / IMAGE_ONNX_FILE, {"images": images, "dropout_masks": image_masks}
        )
        onnx_text = run_session(
            out / TEXT_ONNX_FILE,
            {
                "token_ids": ids,
                "lengths": lengths,
                "word_masks": word_masks,
                "head_masks": head_masks,
            },
        )
        assert_parity(torch_image, onnx_image)
        assert_parity(torch_text, onnx_text)


def test_graphs_declare_opset_and_dynamic_dimensions(exported) -> None:
    _, out = exported["gcie-ellipsoidal"]
    for name in (IMAGE_ONNX_FILE, TEXT_ONNX_FILE):
        graph = onnx.load(str(out / name))
        assert max(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")) >= OPSET
        dims = {
            i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in graph.graph.input
        }
        masks = "dropout_masks" if name == IMAGE_ONNX_FILE else "head_masks"
        assert dims[masks][:2] == ["S", "N"]
    text_inputs = {i.name for i in onnx.load(str(out / TEXT_ONNX_FILE)).graph.input}
    assert text_inputs == {"token_ids", "lengths", "word_masks", "head_masks"}


def test_graph_has_no_random_ops(exported) -> None:
    _, out = exported["gcie-ellipsoidal"]
    for name in (IMAGE_ONNX_FILE, TEXT_ONNX_FILE):
        ops = {node.op_type for node in onnx.load(str(out / name)).graph.node}
        assert not ops & {
            "Dropout",
            "RandomUniform",
            "RandomNormal",
            "RandomUniformLike",
            "RandomNormalLike",
            "Bernoulli",
            "Multinomial",
        }


def test_export_command_rebuilds_from_checkpoint(tiny_model_dir, tmp_path) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / IMAGE_ONNX_FILE).unlink()
    (model_dir / TEXT_ONNX_FILE).unlink()
    result = CliRunner().invoke(app, ["export", str(model_dir)])
    assert result.exit_code == 0, result.output
    assert "max |torch - onnxruntime|" in result.output
    assert (model_dir / IMAGE_ONNX_FILE).is_file() and (model_dir / TEXT_ONNX_FILE).is_file()
    description = json.loads((model_dir / "model.json").read_text())["onnx_io"]
    assert description[TEXT_ONNX_FILE]["inputs"]["word_masks"][1][0] == "S"


def test_export_command_without_a_model_is_a_one_line_error(tmp_path, monkeypatch) -> None:
    result = CliRunner().invoke(app, ["export", str(tmp_path)])
    assert result.exit_code == 2
    assert "model.json" in result.output and "Traceback" not in result.output
    monkeypatch.delenv("PROBSEARCH_MODEL", raising=False)
    result = CliRunner().invoke(app, ["export"])
    assert result.exit_code == 2 and "PROBSEARCH_MODEL" in result.output
    monkeypatch.setenv("PROBSEARCH_MODEL", str(tmp_path / "from-env"))
    result = CliRunner().invoke(app, ["export"])
    assert result.exit_code == 2 and "from-env" in result.output
