"""Apply a thread budget (models.threads) to the pools of an indexing or serving process:
torch's and FAISS's OpenMP pool here; ONNX Runtime's is sized when an encoder is created."""

from __future__ import annotations

import faiss

from models.threads import ThreadBudget, configure_torch_threads


def apply_thread_budget(budget: ThreadBudget) -> ThreadBudget:
    """Size torch's pools and FAISS's OpenMP pool; returns `budget`."""
    configure_torch_threads(budget)
    faiss.omp_set_num_threads(budget.intra_op)
    return budget
