"""FAISS indexes against brute force: flat is exact for every metric with an index form; IVF
and HNSW at their tuned default parameters reach recall@10 >= 0.95, IVF-SQ8 after the exact
re-rank of its shortlist; the auto plan."""

from pathlib import Path

import faiss
import numpy as np
import pytest
import torch

from indexer.build import (
    FLAT_MAX_ITEMS,
    IndexBuildError,
    duplicate_representatives,
    ivf_nlist,
    plan_index,
)
from indexer.publish import verify_version
from indexer.store import IndexVersion, open_version
from models.distance.augmented import INDEX_FAMILIES, candidate_families
from models.distance.gaussian import pairwise_distance
from models.scoring.rerank import exact_rerank
from tests.indexer.synthetic import (
    clustered_gaussians,
    exact_top,
    nearby_queries,
    write_synthetic_version,
)

N, D, Q, K = 20_000, 32, 100, 10
NATIVE_METRICS = tuple(INDEX_FAMILIES)  # every metric with an exact index form


@pytest.fixture(scope="module")
def gallery() -> tuple[np.ndarray, np.ndarray]:
    return clustered_gaussians(N, D, seed=0)


@pytest.fixture(scope="module")
def queries(gallery) -> tuple[np.ndarray, np.ndarray]:
    return nearby_queries(*gallery, num=Q, seed=1)


@pytest.fixture(scope="module")
def exact(gallery, queries) -> dict[str, np.ndarray]:
    """Brute-force distances (Q, N) in float64 from models.distance.gaussian, per metric."""
    as64 = [torch.from_numpy(a).double() for a in (*queries, *gallery)]
    return {m: pairwise_distance(m, *as64).numpy() for m in NATIVE_METRICS}


def build(tmp_path_factory, gallery, metrics, index_type) -> IndexVersion:
    path = Path(tmp_path_factory.mktemp(index_type)) / "v1"
    write_synthetic_version(path, *gallery, metrics=metrics, index_type=index_type)
    return open_version(path, verify=True)


@pytest.fixture(scope="module")
def flat(tmp_path_factory, gallery) -> IndexVersion:
    return build(tmp_path_factory, gallery, NATIVE_METRICS, "flat")


def recall(rows: np.ndarray, exact_distances: np.ndarray) -> float:
    truth = np.argsort(exact_distances, axis=1)[:, :K]
    return float(np.mean([len(set(r) & set(t)) / K for r, t in zip(rows, truth, strict=True)]))


@pytest.mark.parametrize("metric", NATIVE_METRICS)
def test_flat_returns_the_brute_force_top10(flat, queries, exact, metric) -> None:
    distances, rows = exact_top(flat, metric, *queries, K)
    want = exact[metric]
    truth = np.argsort(want, axis=1)[:, :K]  # (Q, K)
    for q in range(Q):
        assert set(rows[q]) == set(truth[q]), f"query {q}"
    np.testing.assert_allclose(distances, np.take_along_axis(want, rows, 1), rtol=1e-3, atol=2e-3)
    for family in candidate_families(metric):
        # the distances a flat index reports are its metric's own, exact up to float32
        reported, found = flat.search_family(family, *queries, K)
        np.testing.assert_allclose(
            reported, np.take_along_axis(exact[family], found, 1), rtol=1e-3, atol=2e-3
        )
        assert np.all(np.diff(reported, axis=1) >= -1e-3)  # sorted, smallest first


def test_flat_is_chosen_for_small_galleries() -> None:
    plan = plan_index("auto", FLAT_MAX_ITEMS - 1, D, ("w2", "kl"), 10**12)
    assert plan.index_type == "flat"
    assert plan_index("auto", FLAT_MAX_ITEMS, D, ("w2",), 10**12).index_type == "ivf"
    fits = plan_index("auto", 10**7, D, ("w2",), memory_budget=3 * 10**9)  # 2.6 GB of vectors
    assert fits.index_type == "ivf"
    big = plan_index("auto", 10**7, D, ("w2",), memory_budget=10**9)  # 0.72 GB as SQ8 codes
    assert big.index_type == "ivfsq" and big.params["w2"]["sq"] == "SQ8"
    assert big.params["w2"]["nlist"] == ivf_nlist(10**7) == 2 ** round(np.log2(4 * np.sqrt(1e7)))
    # auto never falls back to IVF-PQ (it loses the kl top-10): too big for SQ8 is an error
    with pytest.raises(IndexBuildError, match="IVF-SQ8 codes, over the index memory budget"):
        plan_index("auto", 10**7, D, ("w2", "kl"), memory_budget=10**9)
    assert plan_index("ivfpq", 10**7, D, ("w2", "kl"), memory_budget=10**9).index_type == "ivfpq"
    with pytest.raises(IndexBuildError, match="unknown index type"):
        plan_index("annoy", 1000, D, ("w2",), 10**12)
    with pytest.raises(IndexBuildError, match="at least 78 items"):
        plan_index("ivf", 50, D, ("w2",), 10**12)


@pytest.mark.parametrize("index_type", ["ivf", "hnsw"])
def test_approximate_indexes_reach_recall_095(
    tmp_path_factory, gallery, queries, exact, index_type
) -> None:
    version = build(tmp_path_factory, gallery, ("w2", "min_kl"), index_type)
    assert version.manifest.index_type == index_type
    for metric in ("w2", "kl", "kl_reverse", "min_kl"):
        rows = version.shortlist(metric, *queries, K)
        assert recall(rows, exact[metric]) >= 0.95, metric
    # search parameters live in the manifest and are passed per call, never set on the index
    params = version.manifest.search_params["kl"]
    key = "nprobe" if index_type == "ivf" else "efSearch"
    assert params[key] > 0
    index = faiss.downcast_index(version._indexes["kl"].index)
    shared = index.nprobe if index_type == "ivf" else index.hnsw.efSearch
    version.shortlist("kl", *queries, K)
    assert (index.nprobe if index_type == "ivf" else index.hnsw.efSearch) == shared


def test_ivfsq_reranked_shortlist_reaches_recall_095_for_every_metric(
    tmp_path_factory, gallery, queries, exact
) -> None:
    """What the service returns from an IVF-SQ8 version: the exact re-rank of a 100 shortlist."""
    version = build(tmp_path_factory, gallery, NATIVE_METRICS, "ivfsq")
    assert version.manifest.index_type == "ivfsq"
    verify_version(version.path)  # publishing's self-search accepts it
    assert isinstance(
        faiss.downcast_index(version._indexes["kl"].index), faiss.IndexIVFScalarQuantizer
    )
    cpu = torch.device("cpu")
    for metric in NATIVE_METRICS:
        candidates = version.shortlist(metric, *queries, 100)
        rows = np.stack(
            [
                exact_rerank(metric, mu_q, logvar_q, *gallery, c, K, cpu).rows
                for mu_q, logvar_q, c in zip(*queries, candidates, strict=True)
            ]
        )
        assert recall(rows, exact[metric]) >= 0.95, metric


def test_ivfpq_shortlist_holds_the_exact_top10(tmp_path_factory) -> None:
    mu, logvar = clustered_gaussians(4000, 8, seed=3, clusters=40)
    mu_q, logvar_q = nearby_queries(mu, logvar, 50, seed=4)
    path = Path(tmp_path_factory.mktemp("pq")) / "v1"
    write_synthetic_version(path, mu, logvar, ("w2", "kl"), "ivfpq")
    version = open_version(path)
    as64 = [torch.from_numpy(a).double() for a in (mu_q, logvar_q, mu, logvar)]
    for metric in ("w2", "kl"):
        rows = version.shortlist(metric, mu_q, logvar_q, 100)
        assert recall(rows, pairwise_distance(metric, *as64).numpy()) >= 0.9, metric


def test_duplicate_embeddings_are_indexed_once_and_returned_together(tmp_path) -> None:
    base_mu, base_logvar = clustered_gaussians(2000, 8, seed=5, clusters=50)
    picks = np.random.default_rng(0).integers(0, 2000, 6000)  # each embedding ~3 times
    mu, logvar = base_mu[picks], base_logvar[picks]
    write_synthetic_version(tmp_path / "v1", mu, logvar, ("w2", "min_kl"), "hnsw")
    version = open_version(tmp_path / "v1", verify=True)
    assert version._indexes["w2"].index.ntotal == len(np.unique(picks))
    mu_q, logvar_q = nearby_queries(mu, logvar, 50, seed=6)
    as64 = [torch.from_numpy(a).double() for a in (mu_q, logvar_q, mu, logvar)]
    for metric in ("w2", "kl", "min_kl"):
        exact = pairwise_distance(metric, *as64).numpy()
        _, rows = exact_top(version, metric, mu_q, logvar_q, K)
        assert np.all(rows >= 0) and all(len(set(r)) == K for r in rows)
        # tie-aware recall: duplicates make the exact top-10 set ambiguous, its distances not
        tenth = np.sort(exact, axis=1)[:, K - 1 : K]
        found = np.take_along_axis(exact, rows, axis=1)
        assert np.mean(found <= tenth + 1e-6 * np.abs(tenth)) >= 0.95, metric
    twins = np.flatnonzero(picks == picks[0])  # rows holding item 0's embedding
    rows = version.shortlist("w2", mu[:1], logvar[:1], len(twins) + 2)
    assert sorted(rows[0, : len(twins)]) == twins.tolist()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_duplicate_representatives_is_the_first_equal_row(dtype) -> None:
    rng = np.random.default_rng(0)
    base_mu, base_logvar = (rng.standard_normal((500, 7)).astype(dtype) for _ in range(2))
    picks = rng.integers(0, 500, 3000)
    first: dict[int, int] = {}
    want = [first.setdefault(int(p), i) for i, p in enumerate(picks)]
    got = duplicate_representatives(base_mu[picks], base_logvar[picks])
    assert got is not None and got.tolist() == want
    assert duplicate_representatives(base_mu, base_logvar) is None
    same_mu = base_mu[[0, 0]], base_logvar[[0, 1]]  # equal means, different variances
    assert duplicate_representatives(*same_mu) is None
