"""The thread budget: from the CPUs this process may use, not the host's count."""

from pathlib import Path

import pytest
import torch

from models import threads


def test_affinity_mask_limits_the_count(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(threads, "CGROUP_CPU_MAX", tmp_path / "absent")
    assert threads.available_cpus() == 3


QUOTAS = [("150000 100000", 1), ("max 100000", 3), ("400000 100000", 3), ("50000 100000", 1)]


@pytest.mark.parametrize(("cpu_max", "expected"), QUOTAS)
def test_cgroup_quota_caps_the_count(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpu_max: str, expected: int
) -> None:
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    (tmp_path / "cpu.max").write_text(cpu_max + "\n")
    monkeypatch.setattr(threads, "CGROUP_CPU_MAX", tmp_path / "cpu.max")
    assert threads.available_cpus() == expected


def test_configure_sets_torch_intra_op_threads() -> None:
    before = torch.get_num_threads()
    try:
        assert threads.configure_torch_threads(1) == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("role", "workers", "expected"),
    [("batch", 1, 4), ("batch", 4, 4), ("serve", 1, 4), ("serve", 2, 2), ("serve", 8, 1)],
)
def test_budget_rule_per_role(
    monkeypatch: pytest.MonkeyPatch, role: threads.Role, workers: int, expected: int
) -> None:
    monkeypatch.setattr(threads, "available_cpus", lambda: 8)
    assert threads.thread_budget(role, workers=workers) == threads.ThreadBudget(expected, 1)


def test_the_setting_overrides_every_role(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "available_cpus", lambda: 8)
    assert threads.thread_budget("serve", 3, workers=4).intra_op == 3
    assert threads.thread_budget("batch", 3).intra_op == 3


def test_one_cpu_still_gets_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "available_cpus", lambda: 1)
    assert threads.thread_budget("serve", workers=2).intra_op == 1


@pytest.mark.parametrize(
    ("cpus", "workers", "setting", "batches"),
    [(2, 1, None, 2), (2, 2, None, 1), (2, 1, 2, 1), (16, 1, None, 2), (1, 1, None, 1)],
)
def test_concurrent_batches_fill_the_worker_share(
    monkeypatch: pytest.MonkeyPatch, cpus: int, workers: int, setting: int | None, batches: int
) -> None:
    monkeypatch.setattr(threads, "available_cpus", lambda: cpus)
    budget = threads.thread_budget("serve", setting, workers)
    assert threads.concurrent_batches(budget, workers) == batches
