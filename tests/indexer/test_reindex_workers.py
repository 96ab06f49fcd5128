"""A local reindex hands the encoder concurrent_batches batches a call, which it runs at once
(benchmarks/results/reindex_workers.md), and embeds what one batch a call embeds."""

import threading
from pathlib import Path

import numpy as np
import pytest

import indexer.publish as publish
import models.onnx.encoder_runtime as runtime
from indexer.embed import load_chunk
from indexer.publish import ReindexJob, embed_source
from indexer.sources import open_source
from models.threads import ThreadBudget


class MeetingEncoder(runtime.OnnxEncoder):
    """An OnnxEncoder whose first two graph calls must run at once: each waits at a barrier
    for the other (one call at a time breaks it after its timeout)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.barrier, self.calls, self.lock = threading.Barrier(2, timeout=20), 0, threading.Lock()
        run = self.session.run

        def meeting_run(outputs, feeds):
            with self.lock:
                self.calls += 1
                meet = self.calls <= 2
            if meet:
                self.barrier.wait()
            return run(outputs, feeds)

        self.session = type("Session", (), {"run": staticmethod(meeting_run)})()


def embedded(job: ReindexJob, work_dir: Path) -> np.ndarray:
    summary = embed_source(job, open_source(job.source, job.modality), work_dir)
    return np.concatenate([load_chunk(path).mu for path in summary.chunk_paths])


def test_a_local_reindex_embeds_two_batches_at_once_as_one_at_a_time_does(
    small_shapes: Path, random_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = ReindexJob(
        modality="image", source=small_shapes, model_dir=random_model,
        index_root=tmp_path / "indexes", batch_size=16, threads=ThreadBudget(1), device="cpu",
        progress=False,
    )  # fmt: skip
    monkeypatch.setattr(publish, "concurrent_batches", lambda threads: 1)
    alone = embedded(job, tmp_path / "alone")
    monkeypatch.setattr(publish, "concurrent_batches", lambda threads: 2)
    monkeypatch.setattr(runtime, "OnnxEncoder", MeetingEncoder)
    together = embedded(job, tmp_path / "together")
    np.testing.assert_allclose(together, alone, rtol=0, atol=1e-6)
    assert len(together) > 2 * job.batch_size
