"""The batched exact re-rank and scores against plain per-query loops (hypothesis)."""

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models.distance.gaussian import METRICS, elementwise_distance
from models.scoring.query_scores import gated, score_shortlists, shortlist_scores, unfamiliar
from models.scoring.rerank import (
    candidate_distances,
    distance_params,
    draw_distances,
    exact_rerank,
    rerank_batch,
    unique_rows,
)

CPU = torch.device("cpu")
D = 32  # a whole number of SIMD blocks per row, as the service's embeddings


def loop_rerank(metric, mu_q, logvar_q, gallery_mu, gallery_logvar, candidates, keep):
    """One query: each distinct row's distance by its own call, sorted by (distance, row)."""
    rows = sorted({int(r) for r in candidates if r >= 0})
    distance = {
        r: elementwise_distance(
            metric,
            torch.from_numpy(mu_q[None]),
            torch.from_numpy(logvar_q[None]),
            torch.from_numpy(gallery_mu[r : r + 1]),
            torch.from_numpy(gallery_logvar[r : r + 1]),
            **distance_params(metric),
        ).item()
        for r in rows
    }
    ranked = sorted(rows, key=lambda r: (distance[r], r))[:keep]
    return ranked, [distance[r] for r in ranked]


@st.composite
def rerank_cases(draw):
    """A small gallery with repeated items (exact ties), Q queries, candidate rows with
    repeats and -1 padding, and a keep that may exceed a query's distinct candidates."""
    size = draw(st.integers(1, 40))
    queries = draw(st.integers(1, 6))
    width = draw(st.integers(1, 30))
    candidates = draw(
        st.lists(
            st.lists(st.integers(-1, size - 1), min_size=width, max_size=width),
            min_size=queries,
            max_size=queries,
        )
    )
    keep = draw(st.integers(1, 35))
    seed = draw(st.integers(0, 2**16))
    metric = draw(st.sampled_from(METRICS))
    return size, np.array(candidates, dtype=np.int64), keep, seed, metric


def gaussians(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    mu = rng.standard_normal((count, D)).astype(np.float32)
    logvar = (0.5 * rng.standard_normal((count, D))).astype(np.float32)
    return mu, logvar


@settings(max_examples=60, deadline=None)
@given(rerank_cases())
def test_rerank_batch_matches_a_loop_over_queries_and_rows(case) -> None:
    size, candidates, keep, seed, metric = case
    rng = np.random.default_rng(seed)
    gallery_mu, gallery_logvar = gaussians(size, rng)
    gallery_mu[size // 2 :] = gallery_mu[: size - size // 2]  # duplicated items tie exactly
    gallery_logvar[size // 2 :] = gallery_logvar[: size - size // 2]
    mu_q, logvar_q = gaussians(len(candidates), rng)
    batch = rerank_batch(metric, mu_q, logvar_q, gallery_mu, gallery_logvar, candidates, keep, CPU)
    for q, rows in enumerate(candidates):
        want_rows, want_distances = loop_rerank(
            metric, mu_q[q], logvar_q[q], gallery_mu, gallery_logvar, rows, keep
        )
        got = batch.query(q)
        assert got.rows.tolist() == want_rows
        assert got.distances.tolist() == pytest.approx(want_distances, rel=1e-6, abs=1e-6)
        assert torch.equal(got.mu, torch.from_numpy(gallery_mu[want_rows]))
        assert torch.equal(got.logvar, torch.from_numpy(gallery_logvar[want_rows]))
        alone = exact_rerank(
            metric, mu_q[q], logvar_q[q], gallery_mu, gallery_logvar, rows, keep, CPU
        )
        assert alone.rows.tolist() == want_rows
        assert torch.equal(alone.distances, got.distances)
    assert batch.rows.shape == (len(candidates), int(batch.counts.max(initial=0)))
    assert (batch.rows[np.arange(batch.rows.shape[1])[None] >= batch.counts[:, None]] == -1).all()


def test_unique_rows_drops_padding_and_repeats_per_query() -> None:
    rows, counts = unique_rows(np.array([[5, -1, 5, 2], [-1, -1, -1, -1], [7, 0, 7, 7]]))
    assert rows.tolist() == [2, 5, 0, 7]
    assert counts.tolist() == [2, 0, 2]


def test_a_query_without_candidates_gets_an_empty_shortlist() -> None:
    rng = np.random.default_rng(0)
    gallery = gaussians(10, rng)
    batch = rerank_batch("kl", *gaussians(2, rng), *gallery, np.array([[-1, -1], [-1, -1]]), 5, CPU)
    assert batch.counts.tolist() == [0, 0]
    assert batch.mu.shape == (2, 0, D)
    assert len(batch.query(1).rows) == 0


def queries_and_shortlists(queries: int, m: int, rng: np.random.Generator) -> tuple:
    """Q random query Gaussians (Q, D) and a shortlist of m random candidates each (Q, m, D)."""
    query = tuple(torch.from_numpy(a) for a in gaussians(queries, rng))
    candidates = tuple(
        torch.from_numpy(a.reshape(queries, m, D)) for a in gaussians(queries * m, rng)
    )
    return query, candidates


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(0, 8),
    st.integers(1, 130),
    st.sampled_from(METRICS),
    st.integers(0, 2**16),
)
def test_shortlist_scores_of_a_batch_are_each_querys_own(queries, draws, m, metric, seed) -> None:
    """Q queries scored together get the very scores each gets alone (query_scores pads the
    candidates to whole SIMD blocks)."""
    rng = np.random.default_rng(seed)
    (mu, logvar), candidates = queries_and_shortlists(queries, m, rng)
    mc_mu, mc_logvar = (
        torch.from_numpy(a.reshape(draws, queries, D)) for a in gaussians(queries * draws, rng)
    )  # (L, Q, D) each
    together = shortlist_scores(
        metric, (mu, logvar), (mc_mu, mc_logvar) if draws else None, tuple(candidates), 0.7,
        caption_query=True,
    )  # fmt: skip
    for q in range(queries):
        alone = shortlist_scores(
            metric,
            (mu[q : q + 1], logvar[q : q + 1]),
            (mc_mu[:, q : q + 1], mc_logvar[:, q : q + 1]) if draws else None,
            (candidates[0][q : q + 1], candidates[1][q : q + 1]),
            0.7,
            caption_query=True,
        )
        assert "top_mahalanobis" in alone.available()
        for name, values in alone.available().items():
            assert together.get(name)[q] == values[0], name
        assert together.posterior[q].tolist() == alone.posterior[0].tolist()


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(0, 6), st.sampled_from(METRICS), st.integers(0, 2**16))
def test_score_shortlists_scores_what_a_lone_rerank_then_shortlist_scores_give(
    queries, draws, metric, seed
) -> None:
    """The pipeline's scores, which reuse the re-rank's distances, against each query re-ranked
    alone (exact_rerank) and scored from scratch on its kept rows (shortlist_scores)."""
    rng = np.random.default_rng(seed)
    gallery = gaussians(60, rng)
    mu, logvar = gaussians(queries, rng)
    mc = [a.reshape(draws, queries, D) for a in gaussians(queries * draws, rng)]
    rows = rng.integers(-1, 60, size=(queries, 25))
    encoded = SimpleNamespace(
        mu=mu, logvar=logvar, mc_mu=mc[0] if draws else None, mc_logvar=mc[1] if draws else None,
        identical_draws=False, novelty=None,
    )  # fmt: skip
    scored = score_shortlists(metric, encoded, gallery, rows, 10, [0.7], True, CPU)
    values = scored.values(0.7)
    for q in range(queries):
        kept = exact_rerank(metric, mu[q], logvar[q], *gallery, rows[q], 10, CPU).rows
        if len(kept) == 0:
            continue
        candidates = tuple(torch.from_numpy(g[kept][None]) for g in gallery)  # (1, M, D)
        alone = shortlist_scores(
            metric, tuple(torch.from_numpy(a[q : q + 1]) for a in (mu, logvar)),
            tuple(torch.from_numpy(a[:, q : q + 1]) for a in mc) if draws else None,
            candidates, 0.7, caption_query=True,
        )  # fmt: skip
        for name, value in alone.available().items():
            if name != "out_of_range":
                assert values[name][q] == value[0], (name, q)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 8),
    st.integers(1, 70),
    st.sampled_from(METRICS),
    st.floats(0.05, 20.0),
    st.integers(0, 2**16),
)
def test_agreeing_draws_are_the_scores_of_repeated_draws(
    queries, draws, m, metric, temperature, seed
) -> None:
    """L draws that all equal the query, flagged identical, score as when computed (the
    agreeing_draws path), to the float32 round-off by which the draws' distances (a matmul
    expansion) differ from the query's own (the elementwise forms), which a small temperature
    magnifies in the posterior entropy (1.1e-5 relative seen); a wrong shortcut (an MI or a
    feature uncertainty that is not 0) differs by far more."""
    (mu, logvar), candidates = queries_and_shortlists(queries, m, np.random.default_rng(seed))
    repeated = (mu.expand(draws, -1, -1), logvar.expand(draws, -1, -1))  # (L, Q, D)
    full = shortlist_scores(metric, (mu, logvar), repeated, candidates, temperature, False, True)
    short = shortlist_scores(metric, (mu, logvar), repeated, candidates, temperature, True, True)
    assert set(short.available()) == set(full.available()) >= {"top_mahalanobis"}
    for name, values in full.available().items():
        np.testing.assert_allclose(short.get(name), values, rtol=1e-3, atol=1e-6, err_msg=name)
    np.testing.assert_array_equal(short.posterior, full.posterior)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(1, 40),
    st.sampled_from(METRICS),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_top_mahalanobis_measures_the_first_result_under_the_captions_gaussian(
    queries, m, metric, caption_query, seed
) -> None:
    """A loop: each query's nearest candidate by elementwise_distance, then the image mean's
    sum of squared standardised differences under the caption's variances, written out."""
    (mu, logvar), (cand_mu, cand_logvar) = queries_and_shortlists(
        queries, m, np.random.default_rng(seed)
    )
    scores = shortlist_scores(metric, (mu, logvar), None, (cand_mu, cand_logvar), 1.0,
                              caption_query=caption_query)  # fmt: skip
    for q in range(queries):
        distances = [
            float(elementwise_distance(metric, mu[q, None], logvar[q, None],
                                       cand_mu[q, j, None], cand_logvar[q, j, None],
                                       **distance_params(metric))[0])
            for j in range(m)
        ]  # fmt: skip
        first = int(np.argmin(distances))
        image, caption = (cand_mu[q, first], (mu[q], logvar[q])) if caption_query else (
            mu[q], (cand_mu[q, first], cand_logvar[q, first]))  # fmt: skip
        expected = sum(
            (float(image[d]) - float(caption[0][d])) ** 2 / math.exp(float(caption[1][d]))
            for d in range(D)
        )
        assert scores.top_mahalanobis[q] == pytest.approx(expected, rel=1e-9)
    assert (
        shortlist_scores(metric, (mu, logvar), None, (cand_mu, cand_logvar), 1.0).get(
            "top_mahalanobis"
        )
        is None
    )


@pytest.mark.parametrize("metric", METRICS)
def test_candidate_distances_are_the_rerank_bits(metric: str) -> None:
    """The same bits as elementwise_distance (and so as the re-rank) for every query and
    candidate, across blocks of queries."""
    rng = np.random.default_rng(5)
    queries, m = 7, 11
    mu, logvar = (torch.from_numpy(a) for a in gaussians(queries, rng))
    cand_mu, cand_logvar = (torch.from_numpy(a.reshape(queries, m, D)) for a in gaussians(77, rng))
    got = candidate_distances(metric, mu, logvar, cand_mu, cand_logvar)  # (Q, M)
    for q in range(queries):
        want = elementwise_distance(
            metric, mu[q].expand(m, -1), logvar[q].expand(m, -1), cand_mu[q], cand_logvar[q],
            **distance_params(metric),
        )  # fmt: skip
        assert torch.equal(got[q], want), q


@pytest.mark.parametrize("metric", METRICS)
def test_draw_distances_are_the_elementwise_distances_of_each_pair(metric: str) -> None:
    """Every draw's distance to each of its query's candidates, against elementwise_distance
    pair by pair: to float32 round-off of the distances' scale (the matmul expansion), and bit
    for bit for match_prob (elementwise, it samples)."""
    rng = np.random.default_rng(5)
    draws, queries, m = 3, 7, 11
    mc_mu, mc_logvar = (torch.from_numpy(a.reshape(draws, queries, D)) for a in gaussians(21, rng))
    cand_mu, cand_logvar = (torch.from_numpy(a.reshape(queries, m, D)) for a in gaussians(77, rng))
    got = draw_distances(metric, mc_mu, mc_logvar, cand_mu, cand_logvar)  # (L, Q, M)
    assert got.shape == (draws, queries, m) and got.dtype == torch.float32
    dtype = torch.float32 if metric == "match_prob" else torch.float64
    for l_, q in itertools.product(range(draws), range(queries)):
        pair = (
            mc_mu[l_, q].expand(m, -1),
            mc_logvar[l_, q].expand(m, -1),
            cand_mu[q],
            cand_logvar[q],
        )
        want = elementwise_distance(metric, *(t.to(dtype) for t in pair), **distance_params(metric))
        if metric == "match_prob":
            assert torch.equal(got[l_, q], want), (l_, q)
        else:
            scale = float(want.abs().max()) + 1.0
            torch.testing.assert_close(got[l_, q].double(), want, rtol=0, atol=1e-5 * scale)


def test_a_querys_draw_distances_do_not_depend_on_the_others() -> None:
    """The expansion runs per query: the same query among others or alone, same bits."""
    rng = np.random.default_rng(9)
    mc_mu, mc_logvar = (torch.from_numpy(a.reshape(16, 5, D)) for a in gaussians(80, rng))
    cand_mu, cand_logvar = (torch.from_numpy(a.reshape(5, 100, D)) for a in gaussians(500, rng))
    for metric in ("w2", "csd", "kl", "min_kl"):
        together = draw_distances(metric, mc_mu, mc_logvar, cand_mu, cand_logvar)
        for q in range(5):
            alone = draw_distances(
                metric, mc_mu[:, q : q + 1], mc_logvar[:, q : q + 1],
                cand_mu[q : q + 1], cand_logvar[q : q + 1],
            )  # fmt: skip
            assert torch.equal(together[:, q], alone[:, 0]), (metric, q)


def test_draw_distances_off_the_cpu_take_the_elementwise_forms(monkeypatch) -> None:
    """Off the CPU (a GPU; here torch's shape-only meta device) the draws take the batched
    elementwise forms in one block for a micro-batch, not a loop of per-query matmuls (kernel
    launches per query); on the CPU the matmul expansion."""
    import models.scoring.rerank as rerank

    calls = {"matmul": 0, "elementwise": 0}

    def counted(name, real):
        return lambda *a, **k: calls.__setitem__(name, calls[name] + 1) or real(*a, **k)

    monkeypatch.setattr(
        rerank, "matmul_pairwise_distance", counted("matmul", rerank.matmul_pairwise_distance)
    )
    monkeypatch.setattr(
        rerank, "broadcast_distance", counted("elementwise", rerank.broadcast_distance)
    )
    for device, matmuls, blocks in (("meta", 0, 1), ("cpu", 64, 0)):
        calls.update(matmul=0, elementwise=0)
        mc = torch.zeros(16, 64, 256, device=device)  # 16 draws of 64 queries, D = 256
        cand = torch.zeros(64, 100, 256, device=device)
        got = draw_distances("w2", mc, mc, cand, cand)
        assert got.shape == (16, 64, 100) and got.device.type == device
        assert calls == {"matmul": matmuls, "elementwise": blocks}, device


def test_unfamiliar_is_a_strict_log_det_limit_and_none_without_a_gate() -> None:
    log_dets = np.array([-130.0, -120.0, -110.0])
    np.testing.assert_array_equal(unfamiliar(log_dets, -120.0), [False, False, True])
    np.testing.assert_array_equal(unfamiliar(log_dets, None), [False, False, False])
    assert unfamiliar(-100.0, -120.0) is True
    assert unfamiliar(-100.0, None) is False
    scores = np.array([0.5, 0.1, 0.2])
    np.testing.assert_array_equal(gated(scores, log_dets, -120.0), [0.5, 0.1, np.inf])
    np.testing.assert_array_equal(gated(scores, log_dets, None), scores)
