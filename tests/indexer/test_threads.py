"""The budget reaches FAISS's OpenMP pool and torch's pools."""

import faiss
import torch

from indexer.threads import apply_thread_budget
from models.threads import ThreadBudget


def test_apply_sizes_faiss_and_torch() -> None:
    before = faiss.omp_get_max_threads(), torch.get_num_threads()
    try:
        for n in (1, 2):
            apply_thread_budget(ThreadBudget(n))
            assert faiss.omp_get_max_threads() == n
            assert torch.get_num_threads() == n
    finally:
        faiss.omp_set_num_threads(before[0])
        torch.set_num_threads(before[1])
