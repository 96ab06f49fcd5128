"""Int8 weights for a text backbone's graph, for serving on CPUs.

ONNX Runtime's dynamic quantization stores each MatMul weight as int8 with one scale per
output channel and quantizes the activations per call; the word embeddings (a Gather) and the
heads stay float32. The heads are trained on the float features. On the clip-art demo's model
the whole text graph (all-MiniLM-L6-v2, then the heads with 16 draws) runs 1.79x (one caption)
to 1.88x (eight) faster on one AMD EPYC core. Over 3 training seeds it is no worse on any
retrieval, rejection or ambiguity figure, on val or test, and ahead on test i2t P@1 (46.0 ±
2.0 against 43.8 ± 1.2) (benchmarks/results/text_int8.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from models.backbones.onnx_backbone import OnnxBackbone
from models.onnx.parity import ExportError

# The quantized graph's features must keep at least this cosine with the float graph's on the
# export's example captions. A graph that int8 weights bend this far is refused; MiniLM's
# int8 caption means keep the cosine in benchmarks/results/text_int8.md with the float ones.
MIN_COSINE = 0.95


def quantize_text_backbone(
    graph: Path, out: Path, tokenizer: Path | None, examples: Sequence[str]
) -> float:
    """Write `graph` with int8 MatMul weights to `out`; return the smallest cosine between the
    two graphs' features of `examples`, and refuse (ExportError) below MIN_COSINE."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    hint = _WithoutPreprocessingHint()
    logging.getLogger().addFilter(hint)
    try:
        quantize_dynamic(
            str(graph), str(out), weight_type=QuantType.QInt8, per_channel=True,
            op_types_to_quantize=["MatMul"],
        )  # fmt: skip
    except Exception as error:  # ONNX Runtime raises its own types for graphs it cannot handle
        raise ExportError(f"cannot give {graph.name} int8 weights: {error}") from error
    finally:
        logging.getLogger().removeFilter(hint)
    reference = OnnxBackbone(graph, tokenizer=tokenizer).encode(list(examples))
    quantized = OnnxBackbone(out, tokenizer=tokenizer).encode(list(examples))
    worst = float(row_cosines(reference, quantized).min())
    if worst < MIN_COSINE:
        raise ExportError(
            f"{graph.name} with int8 weights keeps a cosine of only {worst:.3f} with its float "
            f"features (at least {MIN_COSINE} needed): export without int8 weights"
        )
    return worst


class _WithoutPreprocessingHint(logging.Filter):
    """Drops ONNX Runtime's advice, logged on the root logger at every quantization, to
    pre-process the graph first (shape inference, graph optimisation): the export checks the
    int8 graph's features against the float graph's instead, and a user exporting a model
    would only be puzzled by the advice."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The cosine between each row of a and the same row of b, (N, F) x (N, F) -> (N,)."""
    dots = (a * b).sum(axis=1)
    return dots / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
