"""One uncertainty pipeline: the service, `probsearch calibrate` and `probsearch eval` give the
same scores for the same query, draws and gallery, because all three call models.scoring."""

from pathlib import Path

import numpy as np
import pytest
import torch

from indexer.calibration import candidate_name, query_scores_by_candidate
from indexer.store import IndexVersion
from models.evaluation.evaluate import EvalConfig, direction_scores, distance_chunks
from models.onnx.encoder_runtime import Embeddings
from models.scoring.query_scores import SCORE_NAMES
from models.settings import Settings
from service.index_holder import IndexHolder
from service.metrics import ServiceMetrics
from service.searcher import Query, Searcher, SearchParams, _sample_embedding
from tests.service.conftest import Artifacts, copy_index_root

TEMPERATURE = 0.3
SHORTLIST = 20


@pytest.fixture(scope="module")
def queries(artifacts: Artifacts) -> list[Query]:
    """Three caption-like Gaussians: gallery items of the text index, slightly moved."""
    version = IndexVersion(artifacts.index_root / "text" / artifacts.text_v1)
    try:
        rows = (0, 7, 13)
        mu = np.asarray(version.mu[list(rows)], dtype=np.float32) + 0.01
        logvar = np.asarray(version.logvar[list(rows)], dtype=np.float32)
    finally:
        version.close()
    params = SearchParams(
        k=5, metric="w2", shortlist=SHORTLIST, mc_samples=6, temperature=TEMPERATURE,
        reject_threshold=None, return_embedding=False,
    )  # fmt: skip
    return [
        Query(kind="embedding", gallery="image", params=params, seed=100 + i, mu=m, logvar=lv)
        for i, (m, lv) in enumerate(zip(mu, logvar, strict=True))
    ]


def service_scores(artifacts: Artifacts, root: Path, queries: list[Query]) -> list[dict]:
    holder = IndexHolder(root, ["image"], None, ServiceMetrics(), poll_interval_s=60)
    holder.start()
    try:
        searcher = Searcher(
            holder, {}, default_metrics={"image": "w2", "text": "w2"},
            settings=Settings(candidate_metric="w2", max_shortlist=SHORTLIST), model_name="test",
            device=torch.device("cpu"),
        )  # fmt: skip
        outcomes = searcher.search_batch(queries)
    finally:
        holder.stop()
    return [{name: getattr(o.query, name) for name in SCORE_NAMES} for o in outcomes]


def embeddings_of(queries: list[Query]) -> Embeddings:
    """The queries with the very draws the service takes (seeded by each query)."""
    encoded = [_sample_embedding(q) for q in queries]
    return Embeddings(
        mu=np.stack([e.mu for e in encoded]),
        logvar=np.stack([e.logvar for e in encoded]),
        mc_mu=np.stack([e.mc_mu for e in encoded], axis=1),  # (L, Q, D)
        mc_logvar=np.stack([e.mc_logvar for e in encoded], axis=1),
    )


def test_service_calibration_and_eval_give_identical_scores(
    artifacts: Artifacts, queries: list[Query], tmp_path: Path
) -> None:
    root = copy_index_root(artifacts, tmp_path / "indexes")
    served = service_scores(artifacts, root, queries)
    embeddings = embeddings_of(queries)
    version = IndexVersion(root / "image" / artifacts.image_v1)
    try:
        calibrated, _ = query_scores_by_candidate(
            version, "w2", embeddings, lambda q, item: True, [TEMPERATURE], SHORTLIST,
            torch.device("cpu"),
        )  # fmt: skip
        gallery = Embeddings(mu=np.array(version.mu), logvar=np.array(version.logvar))
        config = EvalConfig(temperatures=(TEMPERATURE,), shortlist_size=SHORTLIST, device="cpu")
        chunks = distance_chunks("w2", embeddings, gallery, 256, torch.device("cpu"))
        shortlist = np.concatenate(
            [torch.topk(d, SHORTLIST, dim=1, largest=False).indices.numpy() for _, d in chunks]
        )
        evaluated = direction_scores(
            "w2", embeddings, gallery, shortlist, config, caption_query=True
        )
    finally:
        version.close()
    for q, scores in enumerate(served):
        assert scores["novelty"] is None  # a model without backbones has no novelty
        assert "novelty" not in calibrated and "novelty" not in evaluated
        for name in (n for n in SCORE_NAMES if n != "novelty"):
            key = candidate_name(name, TEMPERATURE)
            assert scores[name] is not None
            assert calibrated[key][q] == pytest.approx(scores[name], rel=1e-9, abs=1e-12), name
            assert evaluated[key][q] == pytest.approx(scores[name], rel=1e-9, abs=1e-12), name
    assert len({round(s["mutual_information"], 9) for s in served}) == len(served)
