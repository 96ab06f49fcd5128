"""`probsearch eval` and the service score a pvse query alike: the same max_pair ranking and
the same uncertainty scores for the same K embeddings and MC draws."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from indexer.multivector import MultiVectorIndex
from models.evaluation.evaluate import EvalConfig, direction_scores, distance_chunks
from models.onnx.encoder_runtime import Embeddings
from service.pvse_search import max_pair_scores, rank_max_pair

K, D, DRAWS, TOP = 3, 8, 4, 12


def unit(rng: np.random.Generator, *shape: int) -> np.ndarray:
    x = rng.standard_normal((*shape, D)).astype(np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def items(rng: np.random.Generator, count: int) -> Embeddings:
    """Random pvse-like embeddings: K unit vectors per item, their mean and a spread logvar."""
    k = unit(rng, count, K)  # (N, K, D)
    mc = unit(rng, DRAWS, count, K)  # (L, N, K, D)
    logvar = np.repeat(rng.normal(-5, 1, (count, 1)), D, axis=1).astype(np.float32)
    return Embeddings(
        mu=k.mean(axis=1),
        logvar=logvar,
        mc_mu=mc.mean(axis=2),
        mc_logvar=np.repeat(logvar[None], DRAWS, axis=0),
        embeddings=k,
        mc_embeddings=mc,
    )


def test_eval_and_service_give_the_same_ranking_and_scores() -> None:
    rng = np.random.default_rng(0)
    queries, gallery = items(rng, 5), items(rng, 60)
    config = EvalConfig(metrics=("max_pair",), mc_samples=DRAWS, shortlist_size=TOP)
    chunks = distance_chunks("max_pair", queries, gallery, 2, torch.device("cpu"))
    distances = np.concatenate([d.numpy() for _, d in chunks])  # (Q, G)
    shortlist = np.argsort(distances, axis=1, kind="stable")[:, :TOP]
    scores = direction_scores("max_pair", queries, gallery, shortlist, config)
    index = SimpleNamespace(
        multivector=MultiVectorIndex(gallery.embeddings), mu=gallery.mu, logvar=gallery.logvar
    )
    for q in range(len(queries.mu)):
        ranked = rank_max_pair(index, queries.embeddings[q], TOP, torch.device("cpu"))
        np.testing.assert_array_equal(ranked.rows, shortlist[q])
        np.testing.assert_allclose(ranked.distances.numpy(), distances[q, shortlist[q]], atol=1e-6)
        for temperature in config.temperatures:
            served = max_pair_scores(
                index,
                queries.logvar[q],
                queries.mc_embeddings[:, q],
                queries.mc_mu[:, q],
                ranked,
                temperature,
            )
            for name in ("mutual_information", "posterior_entropy"):
                want = float(served.get(name)[0])
                got = scores[f"{name}@T{temperature:g}"][q]
                assert got == pytest.approx(want, rel=1e-5, abs=1e-6), (name, temperature)
        assert scores["log_det"][q] == pytest.approx(float(served.log_det[0]))
        assert scores["feature_uncertainty"][q] == pytest.approx(
            float(served.feature_uncertainty[0]), rel=1e-5
        )
