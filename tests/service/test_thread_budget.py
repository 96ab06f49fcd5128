"""A server sizes every numeric pool by the serve role's budget, or by PROBSEARCH_THREADS."""

import faiss
import pytest
import torch

from models import threads
from tests.service.conftest import Artifacts, ServerThread, make_settings


@pytest.mark.parametrize(("setting", "expected"), [(None, 2), (3, 3)])
def test_server_pools_follow_the_budget(
    artifacts: Artifacts, monkeypatch: pytest.MonkeyPatch, setting: int | None, expected: int
) -> None:
    monkeypatch.setattr(threads, "available_cpus", lambda: 4)  # serve, 1 worker: 4 // 2
    before = faiss.omp_get_max_threads(), torch.get_num_threads()
    try:
        with ServerThread(make_settings(artifacts, threads=setting)) as server:
            services = server.services
            for encoder in services.encoders.values():
                assert encoder.session.get_session_options().intra_op_num_threads == expected
            # The searches run in the batchers' worker threads, and OpenMP's count (FAISS's,
            # and torch's in its OpenMP build) is per thread.
            for batcher in (services.batcher, services.image_batcher):
                for count in (faiss.omp_get_max_threads, torch.get_num_threads):
                    assert batcher._executor.submit(count).result() == expected
    finally:
        faiss.omp_set_num_threads(before[0])
        torch.set_num_threads(before[1])
