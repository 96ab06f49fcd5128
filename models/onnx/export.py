"""ONNX export of both encoders, with a parity check against ONNX Runtime.

Graph inputs and outputs (every size but D, F, E, H and the image size is dynamic):

image_encoder.onnx
  images      float32 (N, 3, image_size, image_size)  normalised pixels (models.networks.preprocess)
  dropout_masks float32 (S, N, sum(cnn_channels) + image_features)
                                                         channel multipliers of each conv
                                                         block, then feature multipliers
  -> mu, logvar float32 (S * N, D); pvse adds embeddings float32 (S * N, K, D)

text_encoder.onnx
  token_ids   int64 (N, T)                               models.networks.tokenizer ids, 0-padded
  lengths     int64 (N,)                                 tokens per caption, 1 <= length <= T
  word_masks  float32 (S, N, T, word_dim)                dropout multipliers on word embeddings
  head_masks  float32 (S, N, text_hidden)                dropout multipliers before the heads
  -> mu, logvar float32 (S * N, D); pvse adds embeddings float32 (S * N, K, D)

For pvse, mu and logvar summarise the K unit embeddings as a Gaussian (models.pvse.network
.summarize: their mean, and their spread as a spherical variance).

A mask entry is 0 (dropped) or 1 / (1 - p) (kept); a mask of ones is the deterministic pass.
Outputs are draw-major: row s * N + n is draw s of item n. By convention, callers put the
deterministic all-ones block at s = 0 and the L Monte-Carlo draws after it (S = 1 + L), so
one call yields both. The same description is stored in model.json under "onnx_io".

We use the TorchScript-based exporter (dynamo=False): it maps nn.GRU to a single ONNX GRU
op and exports in well under a second, where the torch.export-based one takes several
seconds per encoder; torch is pinned in pyproject.toml, so this path is stable here.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from models.networks.heads import dropout_masks
from models.networks.model_config import IMAGE_ONNX_FILE, OPSET, TEXT_ONNX_FILE
from models.networks.probabilistic_model import HeadsModel, ProbabilisticModel, load_model
from models.onnx.export_pretrained import export_pretrained
from models.onnx.parity import PARITY_ATOL, ExportError


def _example_inputs(
    model: ProbabilisticModel, modality: str, batch: int, draws: int, steps: int, seed: int
) -> dict[str, torch.Tensor]:
    """Named random inputs for one encoder; masks are random dropout draws unless draws == 0
    (then a single all-ones block)."""
    generator = torch.Generator().manual_seed(seed)
    num_draws, p = (1, 0.0) if draws == 0 else (draws, max(model.config.dropout, 0.5))
    if modality == "image":
        size = model.config.image_size
        images = torch.randn((batch, 3, size, size), generator=generator)
        masks = dropout_masks(model.image_mask_shape(num_draws, batch), p, generator)
        return {"images": images, "dropout_masks": masks}
    ids = torch.randint(0, model.config.vocab_size, (batch, steps), generator=generator)
    lengths = torch.randint(1, steps + 1, (batch,), generator=generator)
    lengths[0] = steps  # at least one caption fills the width
    word_shape, head_shape = model.text_mask_shapes(num_draws, batch, steps)
    return {
        "token_ids": ids,
        "lengths": lengths,
        "word_masks": dropout_masks(word_shape, p, generator),
        "head_masks": dropout_masks(head_shape, p, generator),
    }


def output_names(model: ProbabilisticModel) -> list[str]:
    """Graph outputs: mu and logvar, and for pvse the K embeddings (rows, K, D)."""
    return ["mu", "logvar", "embeddings"] if model.config.model_type == "pvse" else ["mu", "logvar"]


def _dynamic_axes(modality: str, outputs_of: list[str]) -> dict[str, dict[int, str]]:
    outputs = {name: {0: "rows"} for name in outputs_of}
    if modality == "image":
        return {"images": {0: "N"}, "dropout_masks": {0: "S", 1: "N"}, **outputs}
    return {
        "token_ids": {0: "N", 1: "T"},
        "lengths": {0: "N"},
        "word_masks": {0: "S", 1: "N", 2: "T"},
        "head_masks": {0: "S", 1: "N"},
        **outputs,
    }


def export_encoder(model: ProbabilisticModel, modality: str, path: Path) -> None:
    """Export model.image_encoder or model.text_encoder (eval mode) to `path`."""
    encoder = model.image_encoder if modality == "image" else model.text_encoder
    inputs = _example_inputs(model, modality, batch=3, draws=2, steps=5, seed=0)
    with warnings.catch_warnings():
        # The TorchScript exporter announces its deprecation and warns about GRU batch sizes,
        # index ops and nn.GRU's own shape checks being traced as constants; check_parity
        # runs other batch, draw and token sizes than the traced ones to test exactly that.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            encoder.eval(),
            tuple(inputs.values()),
            str(path),
            dynamo=False,
            opset_version=OPSET,
            input_names=list(inputs),
            output_names=output_names(model),
            dynamic_axes=_dynamic_axes(modality, output_names(model)),
            do_constant_folding=True,
        )


def check_parity(
    model: ProbabilisticModel, modality: str, path: Path, atol: float = PARITY_ATOL
) -> float:
    """Max |torch - ORT| over mu and logvar for a deterministic and a masked batch whose sizes
    differ from the traced ones; ExportError above `atol`."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    encoder = model.image_encoder if modality == "image" else model.text_encoder
    worst = 0.0
    for draws, seed in ((0, 1), (4, 2)):
        inputs = _example_inputs(model, modality, batch=7, draws=draws, steps=9, seed=seed)
        with torch.no_grad():
            expected = [t.numpy() for t in encoder(*inputs.values())]
        got = session.run(output_names(model), {k: v.numpy() for k, v in inputs.items()})
        for want, have in zip(expected, got, strict=True):
            worst = max(worst, float(np.abs(want - have).max()))
    if worst > atol:
        raise ExportError(
            f"{path.name}: ONNX Runtime differs from torch by {worst:.2e} (tolerance {atol:.0e})"
        )
    return worst


def export_encoders(
    model: ProbabilisticModel, model_dir: Path | str, verify: bool = True
) -> dict[str, float]:
    """Write image_encoder.onnx and text_encoder.onnx into `model_dir`.

    Returns the worst torch-vs-ORT difference per file (empty when verify is False). A model
    on pretrained backbones writes its whole paths and heads (models.onnx.export_pretrained),
    always checked.
    """
    model_dir = Path(model_dir)
    if isinstance(model, HeadsModel):
        return export_pretrained(model, model_dir)
    model.eval()
    differences: dict[str, float] = {}
    for modality, name in (("image", IMAGE_ONNX_FILE), ("text", TEXT_ONNX_FILE)):
        path = model_dir / name
        export_encoder(model, modality, path)
        if verify:
            differences[name] = check_parity(model, modality, path)
    return differences


def export_model_dir(model_dir: Path | str, verify: bool = True) -> dict[str, float]:
    """Rebuild the encoders from MODEL_DIR/checkpoint.pt and export both (see export_encoders)."""
    model = load_model(model_dir)
    model.config.save(model_dir)  # refresh the I/O description in model.json
    return export_encoders(model, model_dir, verify=verify)
