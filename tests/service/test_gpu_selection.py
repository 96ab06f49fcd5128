"""The GPU paths are chosen automatically when a GPU is present (simulated: none is here)."""

from pathlib import Path

import faiss
import numpy as np
import onnxruntime
import pytest
import torch

from indexer import read_index
from indexer.build import build_family_index, duplicate_representatives, plan_index
from models.distance.gaussian import pairwise_distance
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
    read_index.place_family("w2", read_index.read_family_index(flat), "auto", {}, {})
    assert len(moved) == 1
    hnsw_index = read_index.read_family_index(hnsw)
    read_index.place_family("w2", hnsw_index, "auto", {}, {})  # no GPU HNSW: stays on CPU
    read_index.place_family("w2", read_index.read_family_index(flat), "cpu", {}, {})
    assert len(moved) == 1


class GpuCopyAsSeen:
    """A GPU copy as FAISS's cuVS IVF-Flat behaved on an H100: it answers unfiltered searches
    like the CPU index it was copied from, and fails every search with an ID selector."""

    def __init__(self, index: faiss.Index) -> None:
        self.inner, self.ntotal, self.searches = index, index.ntotal, 0

    def search(self, x: np.ndarray, k: int, params=None):
        if params is not None and params.sel is not None:
            raise RuntimeError("CUDA error: cudaErrorInvalidValue: invalid argument")
        self.searches += 1
        return self.inner.search(x, k)


@pytest.mark.parametrize("with_duplicates", [False, True])
def test_searches_among_selected_rows_run_on_the_cpu_original(
    monkeypatch, with_duplicates: bool
) -> None:
    """Unfiltered shortlists use the GPU copy; a filter's (or a live gallery's) row selection
    runs on the CPU index the copy was made from, and gives the brute-force top k (with
    duplicate embeddings too, whose index is an IndexIDMap over the representatives)."""
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", GpuCopyAsSeen)
    rng = np.random.default_rng(3)
    mu, logvar = rng.standard_normal((300, 8), np.float32), rng.uniform(-2, 0, (300, 8))
    logvar = logvar.astype(np.float32)
    if with_duplicates:
        mu[250:], logvar[250:] = mu[:50], logvar[:50]
    representatives = duplicate_representatives(mu, logvar)
    groups = read_index.DuplicateGroups(representatives) if with_duplicates else None
    plan = plan_index("flat", len(mu), 8, ("w2",), 2**30)
    index, params = build_family_index("w2", mu, logvar, plan, duplicates=groups)
    family = read_index.place_family("w2", index, "auto", params, {}, groups)
    mu_q, logvar_q = mu[:5] + 0.1, logvar[:5]
    family.search(mu_q, logvar_q, 10)
    assert family.index.searches == 1
    allowed = read_index.RowSelection(rng.random(len(mu)) < 0.3)
    distances, rows = family.search(mu_q, logvar_q, 10, allowed=allowed)
    brute = pairwise_distance(
        "w2", *(torch.from_numpy(a).double() for a in (mu_q, logvar_q, mu, logvar))
    ).numpy()
    brute[:, ~allowed.allowed] = np.inf
    np.testing.assert_array_equal(rows, np.argsort(brute, axis=1, kind="stable")[:, :10])
    np.testing.assert_allclose(distances, np.sort(brute, axis=1)[:, :10], rtol=1e-4, atol=1e-4)
    assert family.index.searches == 1
