"""Backbones as ONNX graphs: the shipped ones exported, and any image or text encoder that
outputs one vector per input run from its .onnx file (a user's own CLIP export, say).

Graph inputs and output (N and T dynamic):

  image: pixels          uint8 or float32 (N, 3, H, W), H and W fixed by the graph
                         (0..255 values: the graph does its own scaling)
  text:  input_ids       int64 (N, T)      ids of the tokenizer.json that comes with the graph
         attention_mask  int64 (N, T)      1 for a token, 0 for padding
  -> the graph's one output, float32 (N, F)

The TorchScript-based exporter is used, as for the encoders (models.onnx.export).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models.networks.backbone_tokenizer import caption_tokens, load_tokenizer
from models.networks.model_config import OPSET
from models.networks.preprocess import backbone_pixels
from models.onnx.encoder_runtime import (
    EncoderRuntimeError,
    open_session,
    pixel_dtype,
    session_options,
)
from models.threads import ThreadBudget

# |ORT - torch| / (1 + |torch|): EfficientNet's features reach 40 or more (a black image), where
# float32 kernels that sum in another order differ by a few 1e-4 in absolute terms.
PARITY_ATOL = 1e-4
IMAGE_INPUTS = ("pixels",)
TEXT_INPUTS = ("input_ids", "attention_mask")
MAX_TOKENS = 256  # where a text graph's tokenizer.json cuts captions (all-MiniLM-L6-v2's own)


class BackboneGraphError(ValueError):
    """An ONNX file that is not a backbone this module can run, or an export that does not
    reproduce its torch module."""


def export_backbone(backbone: nn.Module, path: Path, example: Sequence) -> Path:
    """Export a backbone of models.backbones (image or text) to `path` and check that ONNX
    Runtime reproduces it on `example` (a few images or captions) to PARITY_ATOL, relative to
    1 + the feature's size."""
    text = hasattr(backbone, "tokens")
    inputs = backbone.tokens(example) if text else (backbone.pixels(example),)
    names = TEXT_INPUTS if text else IMAGE_INPUTS
    axes = {name: {0: "batch", 1: "tokens"} if text else {0: "batch"} for name in names}
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporter's notes on traced control flow
        torch.onnx.export(
            backbone, inputs, str(path), input_names=list(names), output_names=["features"],
            dynamic_axes={**axes, "features": {0: "batch"}}, opset_version=OPSET, dynamo=False,
        )  # fmt: skip
        expected = backbone(*inputs).numpy()
    got = OnnxBackbone(path, tokenizer=getattr(backbone, "tokenizer", None)).run(
        [x.numpy() for x in inputs]
    )
    error = float((np.abs(got - expected) / (1.0 + np.abs(expected))).max())
    if error > PARITY_ATOL:
        raise BackboneGraphError(f"{path}: ONNX Runtime differs from torch by {error:.2e}")
    return path


class OnnxBackbone:
    """A backbone graph run by ONNX Runtime. Text graphs need the tokenizer (a `tokenizers`
    Tokenizer, or the path of its tokenizer.json) whose ids they read."""

    def __init__(
        self,
        path: Path,
        tokenizer=None,
        device: str = "auto",
        threads: ThreadBudget | None = None,
    ) -> None:

        if not Path(path).is_file():
            raise BackboneGraphError(f"no ONNX file at {path}")
        try:
            self.session = open_session(path, session_options(threads or ThreadBudget(1)), device)
        except EncoderRuntimeError:
            raise
        except Exception as error:  # ORT raises its own types for unreadable graphs
            raise BackboneGraphError(f"{path} is not a readable ONNX graph: {error}") from error
        inputs = self.session.get_inputs()
        names = tuple(i.name for i in inputs)
        outputs = self.session.get_outputs()
        if names not in (IMAGE_INPUTS, TEXT_INPUTS) or len(outputs) != 1:
            raise BackboneGraphError(
                f"{path} takes {list(names)} and gives {len(outputs)} outputs; a backbone takes "
                f"{list(IMAGE_INPUTS)} or {list(TEXT_INPUTS)} and gives one (N, F) output"
            )
        self.modality = "image" if names == IMAGE_INPUTS else "text"
        self.dim = outputs[0].shape[-1]
        self.tokenizer = None
        if self.modality == "image":
            self.image_size = int(inputs[0].shape[-1])
            self.pixel_type = pixel_dtype(inputs[0].type)
        else:
            self.tokenizer = _tokenizer(tokenizer, path)

    def encode(self, batch: Sequence) -> np.ndarray:
        """Features (N, F) float32 of a batch of PIL images or captions."""
        if self.modality == "image":
            return self.run([backbone_pixels(batch, self.image_size, self.pixel_type)])
        return self.run(list(caption_tokens(self.tokenizer, batch)))

    def run(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """The graph's output for its inputs, in the order of IMAGE_INPUTS or TEXT_INPUTS."""
        names = IMAGE_INPUTS if self.modality == "image" else TEXT_INPUTS
        (features,) = self.session.run(None, dict(zip(names, arrays, strict=True)))
        return np.asarray(features, dtype=np.float32)


def _tokenizer(tokenizer, path: Path):
    """A tokenizers.Tokenizer, padding its batches, from an instance or a tokenizer.json."""
    from tokenizers import Tokenizer

    if tokenizer is None:
        raise BackboneGraphError(f"{path} is a text graph: give the tokenizer.json it reads ids of")
    if not isinstance(tokenizer, Tokenizer):
        return load_tokenizer(tokenizer, MAX_TOKENS)
    if tokenizer.padding is None:
        tokenizer.enable_padding()
    return tokenizer
