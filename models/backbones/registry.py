"""A backbone named in a model config, loaded: one of the shipped two by name, or any ONNX
graph shaped like a backbone (models.backbones.onnx_backbone) by its path."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from models.backbones.feature_cache import weights_fingerprint
from models.networks.model_config import TOKENIZER_FILE, ConfigError
from models.threads import ThreadBudget

Modality = Literal["image", "text"]
SHIPPED = {
    "image": ("efficientnet-lite0", "efficientnet-lite0-style"),
    "text": ("all-minilm-l6-v2", "all-minilm-l6-v2-layers"),
}


@dataclass
class Backbone:
    """A loaded backbone: `key` names its features in the cache (name and weights hash);
    `module` is the torch module for the shipped ones (exported in front of the heads), None
    for an ONNX graph (`graph` then holds its path); `tokenizer_file` is the tokenizer.json of
    a text backbone; `image_size` the side an image backbone reads."""

    modality: Modality
    key: str
    dim: int
    runner: Any
    module: nn.Module | None = None
    graph: Path | None = None
    tokenizer_file: Path | None = None
    image_size: int = 0
    max_tokens: int = 0

    def encode(self, batch: list) -> np.ndarray:
        """Features (N, dim) float32 of a batch of PIL images or caption strings."""
        with torch.inference_mode():
            out = self.runner.encode(batch)
        return out.float().numpy() if isinstance(out, torch.Tensor) else out

    def onnx_runner(self, threads: int) -> Callable[[list], np.ndarray]:
        """`encode` run by ONNX Runtime on `threads` threads: for many inputs (a split's
        features), where it is about 2x faster than torch on 2 CPU cores. A shipped backbone
        is exported to a temporary file first (a few seconds, parity-checked)."""
        from models.backbones.onnx_backbone import OnnxBackbone, export_backbone

        if self.module is None:
            return self.runner.encode
        with tempfile.TemporaryDirectory(prefix="probsearch-backbone-") as folder:
            example = ["a caption", "another one"] if self.modality == "text" else [_grey()]
            path = export_backbone(self.module, Path(folder) / "backbone.onnx", example)
            tokenizer = getattr(self.module, "tokenizer", None)
            runner = OnnxBackbone(path, tokenizer=tokenizer, threads=ThreadBudget(threads))
        return runner.encode


def _grey():
    from PIL import Image

    return Image.new("RGB", (224, 224), (128, 128, 128))


def load_backbone(spec: str, modality: Modality) -> Backbone:
    """The backbone `spec` names: one of SHIPPED (efficientnet-lite0, efficientnet-lite0-style,
    all-minilm-l6-v2, all-minilm-l6-v2-layers), or an .onnx path (a text graph reads the
    tokenizer.json beside it)."""
    check_spec(spec, modality)
    if spec in SHIPPED[modality]:
        return _shipped(spec, modality)
    return _onnx(Path(spec), modality)


def check_spec(spec: str, modality: Modality) -> None:
    """ConfigError unless `spec` could name a `modality` backbone: a shipped one of that
    modality or an .onnx path (whether the file is a backbone is checked when it is loaded)."""
    if spec in SHIPPED[modality]:
        return
    other = "text" if modality == "image" else "image"
    if spec in SHIPPED[other]:
        raise ConfigError(f"{spec} is a{'n image' if other == 'image' else ' text'} backbone")
    if Path(spec).suffix != ".onnx":
        names = ", ".join(SHIPPED[modality])
        raise ConfigError(f"unknown {modality} backbone {spec!r}: name {names} or an .onnx file")


def _shipped(name: str, modality: Modality) -> Backbone:
    if modality == "image":
        from models.backbones.image_backbone import EfficientNetLite0
        from models.backbones.style_backbone import EfficientNetLite0Style

        style = name == EfficientNetLite0Style.name
        image = EfficientNetLite0Style() if style else EfficientNetLite0()
        key = f"{image.name}{image.readout}-{weights_fingerprint(image.weights_path)}"
        return Backbone(modality, key, image.dim, image, image, image_size=image.image_size)
    from models.backbones.text_backbone import MAX_TOKENS, MiniLM
    from models.backbones.text_layers_backbone import MiniLMLayers

    text = MiniLMLayers() if name == MiniLMLayers.name else MiniLM()
    key = f"{text.name}{text.readout}-{weights_fingerprint(text.weights_path)}"
    return Backbone(
        modality, key, text.dim, text, text, tokenizer_file=text.tokenizer_file,
        max_tokens=MAX_TOKENS,
    )  # fmt: skip


def _onnx(path: Path, modality: Modality) -> Backbone:
    from models.backbones.onnx_backbone import MAX_TOKENS, BackboneGraphError, OnnxBackbone

    tokenizer = path.parent / TOKENIZER_FILE if modality == "text" else None
    if tokenizer is not None and not tokenizer.is_file():
        raise ConfigError(f"{path} is a text backbone: put its {TOKENIZER_FILE} beside it")
    try:
        graph = OnnxBackbone(path, tokenizer=tokenizer)
    except BackboneGraphError as error:
        raise ConfigError(str(error)) from error
    if graph.modality != modality:
        raise ConfigError(f"{path} is an {graph.modality} graph, not a {modality} backbone")
    key = f"onnx-{path.stem}-{weights_fingerprint(path)}"
    size = getattr(graph, "image_size", 0)
    return Backbone(
        modality, key, int(graph.dim), graph, None, path, tokenizer, size,
        MAX_TOKENS if modality == "text" else 0,
    )  # fmt: skip
