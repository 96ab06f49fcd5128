"""Augmented index forms through real FAISS flat indexes against the direct distances."""

import faiss
import numpy as np
import pytest
import torch

from models.distance.augmented import (
    FAMILIES,
    INDEX_FAMILIES,
    IndexForm,
    UnknownFamilyError,
    augmented_dim,
    candidate_families,
    gallery_vectors,
    index_form,
    query_vectors,
    scores_to_distances,
)
from models.distance.gaussian import METRICS, UnknownMetricError, pairwise_distance

K = 10


@pytest.fixture(scope="module")
def data():
    """Gallery (2000, 16) and queries (25, 16): mu ~ N(0, 1), logvar ~ U(-1.5, 1.5)."""
    rng = np.random.default_rng(0)
    gallery = (rng.normal(size=(2000, 16)), rng.uniform(-1.5, 1.5, size=(2000, 16)))
    queries = (rng.normal(size=(25, 16)), rng.uniform(-1.5, 1.5, size=(25, 16)))
    return gallery, queries


def search(family: str, gallery, queries, k: int = K):
    """Flat FAISS search of `family`; returns (exact distances from the scores, rows)."""
    form = index_form(family)
    vectors = gallery_vectors(family, *gallery)
    index_type = faiss.IndexFlatL2 if form.faiss_metric == "l2" else faiss.IndexFlatIP
    index = index_type(vectors.shape[1])
    index.add(vectors)
    query, const = query_vectors(family, *queries)
    scores, rows = index.search(query, k)
    return scores_to_distances(family, scores, const), rows


def direct(metric: str, gallery, queries) -> np.ndarray:
    """(Q, N) distances of the direct formula, float64."""
    as_torch = [torch.from_numpy(a) for a in (*queries, *gallery)]
    return pairwise_distance(metric, *as_torch).numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_value_after_constant_matches_the_direct_distance(family, data):
    gallery, queries = data
    distances, rows = search(family, gallery, queries)
    exact = direct(family, gallery, queries)
    expected = np.take_along_axis(exact, rows, axis=1)
    np.testing.assert_allclose(distances, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("family", FAMILIES)
def test_top_k_ranking_equals_the_direct_top_k(family, data):
    gallery, queries = data
    _, rows = search(family, gallery, queries)
    exact = direct(family, gallery, queries)
    expected_rows = np.argsort(exact, axis=1, kind="stable")[:, :K]
    np.testing.assert_array_equal(rows, expected_rows)


def test_min_kl_top_k_is_inside_the_union_of_kl_shortlists(data):
    gallery, queries = data
    assert candidate_families("min_kl") == ("kl", "kl_reverse")
    _, rows_kl = search("kl", gallery, queries)
    _, rows_reverse = search("kl_reverse", gallery, queries)
    exact = direct("min_kl", gallery, queries)
    expected_rows = np.argsort(exact, axis=1)[:, :K]
    for q in range(expected_rows.shape[0]):
        union = set(rows_kl[q]) | set(rows_reverse[q])
        assert set(expected_rows[q]) <= union
    # and the other way round: one of the two alone misses some (the union is needed)
    missed = [set(expected_rows[q]) - set(rows_kl[q]) for q in range(expected_rows.shape[0])]
    assert any(missed)


def test_mahalanobis_query_ignores_logvar(data):
    _, (mu_q, logvar_q) = data
    with_logvar = query_vectors("mahalanobis", mu_q, logvar_q)
    without = query_vectors("mahalanobis", mu_q, None)
    np.testing.assert_array_equal(with_logvar[0], without[0])
    np.testing.assert_array_equal(with_logvar[1], without[1])
    with pytest.raises(ValueError, match="needs the query logvar"):
        query_vectors("kl", mu_q, None)


@pytest.mark.parametrize("family", FAMILIES)
def test_vectors_are_faiss_ready_and_have_the_announced_dim(family, data):
    (mu_g, logvar_g), (mu_q, logvar_q) = data
    gallery = gallery_vectors(family, torch.from_numpy(mu_g), torch.from_numpy(logvar_g))
    query, const = query_vectors(family, mu_q, logvar_q)
    for vectors, count in ((gallery, mu_g.shape[0]), (query, mu_q.shape[0])):
        assert vectors.dtype == np.float32 and vectors.flags.c_contiguous
        assert vectors.shape == (count, augmented_dim(family, mu_g.shape[1]))
    assert const.shape == (mu_q.shape[0],)


@pytest.mark.parametrize("family", FAMILIES)
def test_padded_results_become_infinite(family, data):
    (mu_g, logvar_g), queries = data
    distances, rows = search(family, (mu_g[:3], logvar_g[:3]), queries, k=5)
    assert (rows[:, 3:] == -1).all()
    assert np.isinf(distances[:, 3:]).all() and np.isfinite(distances[:, :3]).all()


def test_index_families_and_forms_are_consistent():
    assert set(INDEX_FAMILIES) <= set(METRICS)
    for family in FAMILIES:
        assert index_form(family) == IndexForm(family, index_form(family).faiss_metric)
    assert index_form("w2").faiss_metric == "l2" and index_form("csd").faiss_metric == "l2"
    assert {index_form(f).faiss_metric for f in ("kl", "kl_reverse", "js", "mahalanobis")} == {"ip"}


def test_candidate_families():
    for family in FAMILIES:
        assert candidate_families(family) == (family,)
    for metric in ("bhattacharyya", "elk", "match_prob"):
        assert candidate_families(metric) == ("w2",)
        assert candidate_families(metric, fallback="kl") == ("kl",)
    with pytest.raises(UnknownMetricError, match="unknown metric"):
        candidate_families("cosine")
    with pytest.raises(UnknownFamilyError, match="unknown index family 'elk'"):
        candidate_families("bhattacharyya", fallback="elk")


def test_bad_inputs_are_rejected(data):
    (mu, logvar), _ = data
    with pytest.raises(UnknownFamilyError, match="choose one of"):
        gallery_vectors("min_kl", mu, logvar)
    with pytest.raises(ValueError, match="shapes differ"):
        gallery_vectors("w2", mu, logvar[:, :3])
    with pytest.raises(ValueError, match="2-D"):
        query_vectors("w2", mu[0], logvar[0])
    with pytest.raises(ValueError, match="scores must be"):
        scores_to_distances("w2", np.zeros((2, 3)), np.zeros(3))
