"""The clip-art demo's build runs its pools on every CPU, but calibrates on the batch budget's,
with the metrics at once (benchmarks/results/calibrate_metrics.md), and gives the build's pools
back after; a budget the user set is kept."""

from pathlib import Path

import faiss
import pytest
import torch

from models.threads import ThreadBudget, available_cpus, thread_budget
from probsearch import demo
from probsearch.demo import CLIPART_PLAN, DemoPaths


def calibrated_with(monkeypatch: pytest.MonkeyPatch, threads: ThreadBudget) -> list:
    seen = []

    def record(paths, plan, done, say, budget) -> None:
        seen.append((budget, torch.get_num_threads(), faiss.omp_get_max_threads()))

    monkeypatch.setattr(demo, "_calibrate_galleries", record)
    torch.set_num_threads(threads.intra_op)
    faiss.omp_set_num_threads(threads.intra_op)
    assert demo._calibrate(DemoPaths(Path("unused")), CLIPART_PLAN, {}, print, threads)
    return seen


def test_a_build_on_every_cpu_calibrates_on_the_batch_budget_then_gets_its_pools_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = torch.get_num_threads(), faiss.omp_get_max_threads()
    try:
        every = ThreadBudget(available_cpus())
        batch = thread_budget("batch")
        assert calibrated_with(monkeypatch, every) == [(batch, batch.intra_op, batch.intra_op)]
        assert torch.get_num_threads() == faiss.omp_get_max_threads() == every.intra_op
    finally:
        torch.set_num_threads(before[0])
        faiss.omp_set_num_threads(before[1])


def test_a_budget_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads(), faiss.omp_get_max_threads()
    try:
        mine = ThreadBudget(available_cpus() + 1)
        assert calibrated_with(monkeypatch, mine) == [(mine, mine.intra_op, mine.intra_op)]
    finally:
        torch.set_num_threads(before[0])
        faiss.omp_set_num_threads(before[1])
