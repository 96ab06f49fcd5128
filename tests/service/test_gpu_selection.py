"""The GPU paths are chosen automatically when a GPU is present (simulated: none is here)."""

from pathlib import Path

import faiss
import numpy as np
import onnxruntime
import torch

from indexer import read_index
from models.onnx.encoder_runtime import choose_providers
from models.scoring.rerank import compute_device

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


def test_onnx_runtime_takes_cuda_only_when_it_is_available(monkeypatch) -> None:
    """CUDA without TF32, which on an H100 moved embeddings by 1e-2 against the CPU."""
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [CUDA, CPU])
    assert choose_providers("auto") == [(CUDA, {"use_tf32": "0"}), CPU]
    assert choose_providers("cuda") == [(CUDA, {"use_tf32": "0"}), CPU]
    assert choose_providers("cpu") == [CPU]
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [CPU])
    assert choose_providers("auto") == [CPU]


def test_rerank_runs_on_cuda_when_torch_sees_a_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert compute_device("auto") == torch.device("cuda")
    assert compute_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert compute_device("auto") == torch.device("cpu")


def _write_index(path: Path, index: faiss.Index) -> Path:
    index.add(np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32))
    faiss.write_index(index, str(path))
    return path


def test_faiss_indexes_move_to_the_gpus_when_faiss_sees_them(monkeypatch, tmp_path: Path) -> None:
    moved = []
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 2)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", lambda index: moved.append(index) or index)
    flat = _write_index(tmp_path / "flat.faiss", faiss.IndexFlatL2(8))
    hnsw = _write_index(tmp_path / "hnsw.faiss", faiss.IndexHNSWFlat(8, 8))
    read_index.load_index(flat, "auto")
    assert len(moved) == 1
    read_index.load_index(hnsw, "auto")  # HNSW has no GPU implementation: stays on CPU
    read_index.load_index(flat, "cpu")
    assert len(moved) == 1
