"""Retrieval metrics against brute-force loops over explicitly sorted rankings."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models.evaluation.retrieval_metrics import (
    GroupRelevance,
    LabelRelevance,
    count_top_hits,
    median_rank,
    per_distinct_query,
    pmrp_relevances,
    rank_queries,
    recall_at_k,
    summarize_ranking,
)


def chunks_of(distances: np.ndarray, size: int):
    for start in range(0, distances.shape[0], size):
        yield start, torch.from_numpy(distances[start : start + size])


def pessimistic_order(distances: np.ndarray, relevant: np.ndarray) -> list[int]:
    """Gallery rows by distance; on a tie, irrelevant rows come first."""
    return sorted(range(distances.size), key=lambda g: (distances[g], bool(relevant[g])))


def brute_first_rank(distances: np.ndarray, positive: np.ndarray) -> int:
    order = pessimistic_order(distances, positive)
    return next(position for position, g in enumerate(order) if positive[g])


def brute_r_precision(distances: np.ndarray, relevant: np.ndarray) -> float:
    num_relevant = int(relevant.sum())
    if num_relevant == 0:
        return float("nan")
    top = pessimistic_order(distances, relevant)[:num_relevant]
    return sum(bool(relevant[g]) for g in top) / num_relevant


def brute_label_l1(a: np.ndarray, b: np.ndarray) -> int:
    return sum(abs(int(x) - int(y)) for x, y in zip(a, b, strict=True))


def random_case(seed: int, num_images: int = 12, captions_per_image: int = 3, labels: int = 5):
    """Images as queries (i2t); captions carry their image's labels; rounding makes ties."""
    rng = np.random.default_rng(seed)
    caption_image = np.repeat(np.arange(num_images), captions_per_image)
    image_labels = (rng.random((num_images, labels)) < 0.4).astype(np.int64)
    distances = rng.random((num_images, caption_image.size)).round(1)  # many ties
    return distances, caption_image, image_labels


def test_hand_written_ranking() -> None:
    # 2 queries, 4 gallery items; query 0's match is gallery 2, query 1's is gallery 0 and 3.
    distances = np.array([[0.5, 0.1, 0.3, 0.9], [0.4, 0.2, 0.8, 0.45]])
    positives = GroupRelevance(np.array([7, 8]), np.array([8, 6, 7, 8]))
    result = rank_queries(chunks_of(distances, 1), 2, positives, {}, shortlist_size=2)
    # Query 0: gallery 1 (0.1) is closer than its match (0.3): rank 1.
    # Query 1: gallery 1 (0.2) is closer than its best match, gallery 0 (0.4): rank 1.
    assert result.first_positive_rank.tolist() == [1, 1]
    assert result.shortlist.tolist() == [[1, 2], [1, 0]]
    summary = summarize_ranking(result)
    assert summary["R@1"] == 0.0
    assert summary["R@5"] == 100.0
    assert summary["rsum"] == 200.0
    assert summary["median_rank"] == 2.0


def test_ties_count_against_the_model() -> None:
    distances = np.zeros((3, 4))  # a collapsed model: every item at the same distance
    positives = GroupRelevance(np.arange(3), np.array([0, 1, 2, 9]))
    result = rank_queries(chunks_of(distances, 2), 3, positives, {"exact": positives})
    assert result.first_positive_rank.tolist() == [3, 3, 3]
    assert result.r_precision["exact"].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("chunk", [1, 5, 100])
def test_ranks_and_r_precision_match_brute_force(seed: int, chunk: int) -> None:
    distances, caption_image, image_labels = random_case(seed)
    num_images = image_labels.shape[0]
    positives = GroupRelevance(np.arange(num_images), caption_image)
    sets = pmrp_relevances(image_labels, image_labels[caption_image])
    result = rank_queries(chunks_of(distances, chunk), num_images, positives, sets, 4)

    for q in range(num_images):
        positive = caption_image == q
        assert result.first_positive_rank[q] == brute_first_rank(distances[q], positive)
        for zeta in (0, 1, 2):
            plausible = np.array(
                [brute_label_l1(image_labels[q], image_labels[i]) <= zeta for i in caption_image]
            )
            expected = brute_r_precision(distances[q], plausible)
            assert result.r_precision[f"pmrp_zeta{zeta}"][q] == pytest.approx(expected)
        assert set(result.shortlist[q]) <= set(np.argsort(distances[q], kind="stable")[:12])
        assert np.all(np.diff(distances[q, result.shortlist[q]]) >= 0)


def test_recall_and_median_rank_against_loops() -> None:
    ranks = np.random.default_rng(3).integers(0, 30, size=101)
    for k in (1, 5, 10):
        expected = 100.0 * sum(1 for r in ranks if r + 1 <= k) / ranks.size
        assert recall_at_k(ranks, k) == pytest.approx(expected)
    assert median_rank(ranks) == sorted(ranks)[50] + 1


def test_summary_averages_pmrp_over_zetas_and_skips_empty_queries() -> None:
    distances = np.array([[0.1, 0.2], [0.1, 0.3]])
    positives = GroupRelevance(np.array([0, 1]), np.array([0, 1]))
    # Nothing is relevant to query 0; everything is relevant to query 1.
    all_or_nothing = GroupRelevance(np.array([0, 1]), np.array([1, 1]))
    sets = {"pmrp_zeta0": positives, "pmrp_zeta1": all_or_nothing}
    summary = summarize_ranking(rank_queries(chunks_of(distances, 2), 2, positives, sets))
    assert summary["pmrp_zeta0"] == 50.0  # query 0 right, query 1 wrong at R = 1
    assert summary["pmrp_zeta1"] == 100.0  # query 0 has no relevant item, query 1 has both
    assert summary["pmrp_zeta1_queries"] == 1
    assert summary["pmrp"] == 75.0


def test_label_relevance_matches_l1_loop() -> None:
    rng = np.random.default_rng(4)
    query, gallery = rng.integers(0, 2, (6, 9)), rng.integers(0, 2, (11, 9))
    for zeta in (0, 1, 2, 3):
        mask = LabelRelevance(query, gallery, zeta).mask(np.arange(6))
        expected = [[brute_label_l1(q, g) <= zeta for g in gallery] for q in query]
        assert mask.tolist() == expected


def test_count_top_hits_at_depth_zero_and_full_depth() -> None:
    distances = torch.tensor([[0.3, 0.1, 0.2]])
    relevant = torch.tensor([[True, False, True]])
    assert count_top_hits(distances, relevant, torch.tensor([0])).tolist() == [0]
    assert count_top_hits(distances, relevant, torch.tensor([1])).tolist() == [0]
    assert count_top_hits(distances, relevant, torch.tensor([2])).tolist() == [1]
    assert count_top_hits(distances, relevant, torch.tensor([3])).tolist() == [2]


def test_bad_inputs_are_reported() -> None:
    positives = GroupRelevance(np.array([0]), np.array([1, 2]))
    with pytest.raises(ValueError, match="at least one ground-truth match"):
        rank_queries(chunks_of(np.zeros((1, 2)), 1), 1, positives, {})
    matched = GroupRelevance(np.array([1]), np.array([1, 2]))
    with pytest.raises(ValueError, match="NaN"):
        rank_queries(chunks_of(np.array([[np.nan, 0.0]]), 1), 1, matched, {})
    with pytest.raises(ValueError, match="did not cover"):
        rank_queries(chunks_of(np.zeros((1, 2)), 1), 2, GroupRelevance(np.ones(2), np.ones(2)), {})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcde"), st.booleans()), min_size=1, max_size=40))
def test_per_distinct_query_counts_each_text_once(queries: list[tuple[str, bool]]) -> None:
    groups: dict[str, list[bool]] = {}
    for text, hit in queries:
        groups.setdefault(text, []).append(hit)
    want = 100.0 * sum(sum(h) / len(h) for h in groups.values()) / len(groups)
    texts, hits = zip(*queries, strict=True)
    assert per_distinct_query(np.array(hits), list(texts)) == pytest.approx(want)


def test_a_repeated_text_weighs_as_much_as_any_other() -> None:
    hits = np.array([True] * 9 + [False])
    texts = ["a star"] * 9 + ["a pink hexagon"]
    assert per_distinct_query(hits, texts) == pytest.approx(50.0)
    assert 100 * hits.mean() == pytest.approx(90.0)


def test_per_distinct_query_checks_its_lengths() -> None:
    with pytest.raises(ValueError, match="2 hits but 1 texts"):
        per_distinct_query(np.array([True, False]), ["a"])
    assert np.isnan(per_distinct_query(np.array([], dtype=bool), []))
