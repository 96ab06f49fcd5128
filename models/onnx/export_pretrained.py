"""ONNX export of a model on pretrained backbones: per modality the heads alone and the whole
path (backbone, then heads), each checked against torch.

The whole path is the backbone's graph joined to the heads' graph with onnx.compose: the
shipped backbones are exported first (models.backbones.onnx_backbone), a user's ONNX
backbone is used as it is, so both take the same road. With `text_backbone_int8` the text
backbone's graph gets int8 weights before the join (models.onnx.quantize), and the whole text
graph is checked against the torch heads fed that graph's features.

Graph inputs (model.json "onnx_io"):

image_encoder.onnx  pixels uint8 (N, 3, S, S) (or the user's graph's own pixel type),
                    dropout_masks float32 (S, N, F + H)
text_encoder.onnx   input_ids, attention_mask int64 (N, T) of tokenizer.json, dropout_masks
image_heads.onnx,
text_heads.onnx     features float32 (N, F), dropout_masks
-> mu, logvar float32 (S * N, D), draw-major as for the small encoders (models.onnx.export);
   pvse adds embeddings float32 (S * N, K, D) (models.pvse.network.PvseFeatureHeads); the
   image graphs of a model with a novelty bank add novelty float32 (N,)
   (models.networks.feature_novelty).
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx.compose
import torch
from PIL import Image

from models.backbones.onnx_backbone import OnnxBackbone, export_backbone
from models.backbones.registry import Backbone, load_backbone
from models.networks.backbone_tokenizer import caption_tokens, load_tokenizer
from models.networks.feature_heads import FeatureHeads
from models.networks.heads import dropout_masks
from models.networks.model_config import (
    IMAGE_HEADS_ONNX_FILE,
    IMAGE_ONNX_FILE,
    OPSET,
    TEXT_HEADS_ONNX_FILE,
    TEXT_ONNX_FILE,
    TOKENIZER_FILE,
    ModelConfig,
)
from models.networks.preprocess import backbone_pixels
from models.networks.principal_components import PrincipalComponents
from models.networks.probabilistic_model import HeadsModel
from models.onnx.encoder_runtime import pixel_dtype
from models.onnx.parity import PARITY_ATOL, ExportError
from models.onnx.quantize import quantize_text_backbone
from models.pvse.network import PvseFeatureHeads

logger = logging.getLogger(__name__)

FILES = {
    "image": (IMAGE_ONNX_FILE, IMAGE_HEADS_ONNX_FILE),
    "text": (TEXT_ONNX_FILE, TEXT_HEADS_ONNX_FILE),
}
CAPTIONS = ("a red apple on a white plate", "tux", "a drawing of a cat sitting on a fence " * 3)


def export_pretrained(model: HeadsModel, model_dir: Path) -> dict[str, float]:
    """Write the four graphs into `model_dir`; the worst torch-vs-ORT difference per file."""
    model.eval()
    differences: dict[str, float] = {}
    for modality, spec in (("image", model.config.image_backbone),
                           ("text", model.config.text_backbone)):  # fmt: skip
        whole, heads_file = (model_dir / name for name in FILES[modality])
        heads = model.image_encoder if modality == "image" else model.text_encoder
        projection = model.image_projection if modality == "image" else None
        backbone = load_backbone(spec, modality)
        with tempfile.TemporaryDirectory() as tmp:
            graph, features_of = _served_backbone(backbone, model.config, Path(tmp))
            opset = _default_opset(onnx.load(str(graph)))
            export_heads(heads, heads_file, opset, projection)
            differences[heads_file.name] = _heads_parity(heads, heads_file, projection)
            _join(graph, heads_file, whole)
            differences[whole.name] = _whole_parity(
                model, backbone, features_of, _GraphHeads(heads, projection), whole, model_dir
            )
    return differences


def _served_backbone(
    backbone: Backbone, config: ModelConfig, folder: Path
) -> tuple[Path, Callable[[list], np.ndarray]]:
    """The backbone graph the whole path starts with, and the features it computes: the
    backbone as it is, or its text graph with int8 weights (`text_backbone_int8`)."""
    graph = backbone.graph or _exported(backbone, folder)
    if backbone.modality != "text" or not config.text_backbone_int8:
        return graph, backbone.encode
    int8 = folder / "text_backbone.int8.onnx"
    cosine = quantize_text_backbone(graph, int8, backbone.tokenizer_file, CAPTIONS)
    logger.info("int8 text backbone: min cosine %.4f with the float one", cosine)
    return int8, OnnxBackbone(int8, backbone.tokenizer_file).encode


class _GraphHeads(torch.nn.Module):
    """What a heads graph computes from a backbone vector: its principal components when the
    model projects it (image_components), then mu and logvar (pvse: and the K embeddings), then
    the novelty of the vector itself when the heads hold a bank."""

    def __init__(self, heads: FeatureHeads, projection: PrincipalComponents | None) -> None:
        super().__init__()
        self.heads, self.projection = heads, projection

    def forward(self, features: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, ...]:
        read = features if self.projection is None else self.projection(features)
        outputs = tuple(self.heads(read, masks))
        if self.heads.novelty is None:
            return outputs
        return (*outputs, self.heads.novelty(features))


def graph_outputs(heads: FeatureHeads) -> list[str]:
    """The output names of the graphs around these heads."""
    pvse = ["embeddings"] if isinstance(heads, PvseFeatureHeads) else []
    return ["mu", "logvar", *pvse] + (["novelty"] if heads.novelty is not None else [])


def export_heads(
    heads: FeatureHeads,
    path: Path,
    opset: int = OPSET,
    projection: PrincipalComponents | None = None,
) -> None:
    """The heads alone: features (N, F) and dropout_masks (S, N, F' + H) -> mu, logvar (pvse:
    and embeddings; and novelty). F' is F, or the number of principal components the
    `projection` in front of the heads keeps."""
    features, masks = _example(heads, batch=3, draws=2, seed=0, projection=projection)
    outputs = graph_outputs(heads)
    axes = {"mu": {0: "rows"}, "logvar": {0: "rows"}, "embeddings": {0: "rows"},
            "novelty": {0: "N"}}  # fmt: skip
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporter's deprecation notice
        torch.onnx.export(
            _GraphHeads(heads, projection), (features, masks), str(path),
            input_names=["features", "dropout_masks"], output_names=outputs,
            opset_version=opset, dynamo=False,
            dynamic_axes={"features": {0: "N"}, "dropout_masks": {0: "S", 1: "N"},
                          **{name: axes[name] for name in outputs}},
        )  # fmt: skip


def _exported(backbone: Backbone, folder: Path) -> Path:
    """A shipped backbone exported to `folder` (parity-checked by export_backbone)."""
    example = _raw_examples(backbone.modality, backbone.image_size)
    return export_backbone(backbone.module, folder / f"{backbone.modality}_backbone.onnx", example)


def _join(backbone_graph: Path, heads_graph: Path, out: Path) -> None:
    """The backbone's graph with its one output fed to the heads' `features` input."""
    first = onnx.load(str(backbone_graph))
    second = onnx.load(str(heads_graph))
    second.ir_version = first.ir_version
    (feature_output,) = [o.name for o in first.graph.output]
    first = onnx.compose.add_prefix(first, "backbone/", rename_inputs=False, rename_outputs=False)
    second = onnx.compose.add_prefix(second, "heads/", rename_inputs=False, rename_outputs=False)
    try:
        joined = onnx.compose.merge_models(first, second, io_map=[(feature_output, "features")])
    except ValueError as error:
        raise ExportError(f"cannot join {backbone_graph.name} to the heads: {error}") from error
    onnx.save(joined, str(out))


def _default_opset(graph: onnx.ModelProto) -> int:
    """The graph's opset of the default ONNX domain (the heads are exported at it too)."""
    return next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx"))


def _example(
    heads: FeatureHeads,
    batch: int,
    draws: int,
    seed: int,
    projection: PrincipalComponents | None = None,
):
    """Backbone vectors like those the heads were fitted on, and dropout masks. Heads that
    standardise their input get vectors of the training split's mean and sd: standard normal
    ones, against MiniLM's features of sd 0.04, sat 25 sd out and drove the log-variance
    into its clamp, where float32 rounding alone broke the parity check (1.2e-4 after a
    4-epoch training of the demo's recipe). Behind a projection, those are the vectors'
    coordinates, lifted back to backbone vectors."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn((batch, heads.in_features), generator=generator)
    if heads.standardize is not None:
        features = heads.standardize.shift + heads.standardize.scale * features
    elif projection is not None:
        features = features * projection.sd
    if projection is not None:
        features = projection.lift(features)
    width = sum(heads.mask_widths)
    return features, dropout_masks((draws, batch, width), 0.5, generator)


def _heads_parity(
    heads: FeatureHeads, path: Path, projection: PrincipalComponents | None = None
) -> float:
    """Max |torch - ORT| over the outputs, at batch and draw counts other than the traced."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    features, masks = _example(heads, batch=7, draws=4, seed=1, projection=projection)
    with torch.no_grad():
        expected = [t.numpy() for t in _GraphHeads(heads, projection)(features, masks)]
    feeds = {"features": features.numpy(), "dropout_masks": masks.numpy()}
    got = session.run(graph_outputs(heads), feeds)
    return _checked(path, expected, got)


def _whole_parity(
    model: HeadsModel,
    backbone: Backbone,
    features_of: Callable[[list], np.ndarray],
    graph_heads: _GraphHeads,
    path: Path,
    model_dir: Path,
) -> float:
    """The whole graph against the torch heads fed `features_of` the examples: the backbone's
    own features, or the int8 backbone graph's (whose distance from the float features
    quantize_text_backbone bounds)."""
    import onnxruntime as ort

    raw = _raw_examples(backbone.modality, backbone.image_size)
    masks = dropout_masks(model.mask_shape(backbone.modality, 3, len(raw)), 0.5,
                          torch.Generator().manual_seed(2))  # fmt: skip
    with torch.no_grad():
        features = torch.from_numpy(features_of(list(raw)))
        expected = [t.numpy() for t in graph_heads(features, masks)]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = _feeds(backbone, raw, model_dir / TOKENIZER_FILE, model.config, session)
    outputs = graph_outputs(graph_heads.heads)
    got = session.run(outputs, {**feeds, "dropout_masks": masks.numpy()})
    return _checked(path, expected, got)


def _feeds(
    backbone: Backbone, raw: list, tokenizer: Path, config: ModelConfig, session
) -> dict[str, np.ndarray]:
    """The whole graph's backbone inputs for raw images or captions."""
    if backbone.modality == "image":
        dtype = pixel_dtype(session.get_inputs()[0].type)
        return {"pixels": backbone_pixels(raw, backbone.image_size, dtype)}
    ids, mask = caption_tokens(load_tokenizer(tokenizer, config.max_caption_tokens), raw)
    return {"input_ids": ids, "attention_mask": mask}


def _raw_examples(modality: str, size: int) -> list:
    """A few inputs to check a graph on: noise images, or captions of several lengths."""
    if modality == "text":
        return list(CAPTIONS)
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
            for _ in range(2)]  # fmt: skip


def _checked(path: Path, expected: list[np.ndarray], got: list[np.ndarray]) -> float:
    worst = max(float(np.abs(want - have).max()) for want, have in zip(expected, got, strict=True))
    if worst > PARITY_ATOL:
        raise ExportError(f"{path.name}: ONNX Runtime differs from torch by {worst:.2e}")
    return worst
