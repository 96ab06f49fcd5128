"""A micro-batch of mixed queries gets exactly the answers its queries get one at a time: the
Searcher shortlists, re-ranks and scores a batch together, and must not mix queries up."""

import dataclasses
import json
import shutil
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from indexer.store import IndexVersion
from models.networks.model_config import ModelConfig
from models.onnx.encoder_runtime import OnnxEncoder
from models.onnx.export import export_model_dir
from models.scoring.query_scores import SCORE_NAMES
from models.settings import Settings
from service.errors import InvalidQueryError
from service.index_holder import IndexHolder
from service.metrics import ServiceMetrics
from service.outcome import SearchResponse
from service.searcher import Query, Searcher, SearchParams
from tests.service.conftest import Artifacts

BASE = SearchParams(
    k=5, metric="w2", shortlist=100, mc_samples=0, temperature=None,
    reject_threshold=None, return_embedding=True,
)  # fmt: skip


@pytest.fixture(scope="module")
def searcher(artifacts: Artifacts) -> Iterator[Searcher]:
    """A Searcher on the session's indexes (both galleries) with the real ONNX encoders."""
    holder = IndexHolder(
        artifacts.index_root, ["image", "text"], None, ServiceMetrics(), poll_interval_s=60
    )
    holder.start()
    encoders = {k: OnnxEncoder(artifacts.model, k, device="cpu") for k in ("text", "image")}
    try:
        yield Searcher(
            holder, encoders, default_metrics={"image": "w2", "text": "w2"},
            settings=Settings(candidate_metric="w2", max_shortlist=200), model_name="test",
            device=torch.device("cpu"),
        )  # fmt: skip
    finally:
        holder.stop()


def params(**changes) -> SearchParams:
    return replace(BASE, **changes)


def gallery_gaussians(artifacts: Artifacts, gallery: str, rows: list[int]) -> list[tuple]:
    """Stored Gaussians of a gallery, moved a little: queries with near neighbours."""
    version_name = artifacts.image_v1 if gallery == "image" else artifacts.text_v1
    version = IndexVersion(artifacts.index_root / gallery / version_name)
    try:
        mu = np.asarray(version.mu[rows], dtype=np.float32) + 0.05
        logvar = np.asarray(version.logvar[rows], dtype=np.float32) - 0.1
    finally:
        version.close()
    return list(zip(mu, logvar, strict=True))


def embedding_queries(artifacts: Artifacts) -> list[Query]:
    """Embedding queries of both galleries: metrics with and without an index of their own
    (min_kl's union of two indexes, elk and match_prob re-ranking the w2 shortlist), k,
    shortlist, draw counts and temperatures mixed; some share every group key but the data."""
    image = gallery_gaussians(artifacts, "image", [0, 3, 9, 17, 30, 31, 50, 61])
    text = gallery_gaussians(artifacts, "text", [1, 4, 40])
    options = [
        params(k=5, mc_samples=6),
        params(k=3, metric="kl", mc_samples=0),
        params(k=7, metric="min_kl", shortlist=30, mc_samples=4),
        params(k=10, mc_samples=6, temperature=0.5),
        params(k=4, metric="elk", mc_samples=6),
        params(k=5, metric="match_prob", mc_samples=3, reject_threshold=0.1),
    ]
    options += options[:2]
    queries = [
        Query(kind="embedding", gallery="image", params=p, seed=7 + i, mu=mu, logvar=lv)
        for i, (p, (mu, lv)) in enumerate(zip(options, image, strict=True))
    ]
    queries += [
        Query(kind="embedding", gallery="text", params=p, seed=70 + i, mu=mu, logvar=lv)
        for i, (p, (mu, lv)) in enumerate(zip(options[:3], text, strict=True))
    ]
    return queries


def encoded_queries(artifacts: Artifacts) -> list[Query]:
    """Caption and image queries: two share kind and draw count (one encoder call)."""
    lines = (artifacts.shapes / "captions.jsonl").read_text().splitlines()
    captions = [json.loads(lines[i])["text"] for i in (0, 3, 5)]  # three different ones
    lines = (artifacts.shapes / "images.jsonl").read_text().splitlines()
    files = [json.loads(line)["file"] for line in lines[:2]]
    images = [Image.open(artifacts.shapes / f).convert("RGB") for f in files]
    text = [
        Query(kind="text", gallery="image", params=params(k=5, mc_samples=4), seed=1, text=t)
        for t in captions[:2]
    ] + [Query("text", "image", params(k=8, metric="kl", mc_samples=0), 3, text=captions[2])]
    image = [
        Query("image", "text", params(k=6, mc_samples=4), 4, image=images[0]),
        Query("image", "text", params(k=4, metric="min_kl", mc_samples=0), 5, image=images[1]),
    ]
    return text + image


def answer(outcome: SearchResponse | Exception) -> dict:
    """Everything a response carries but the timings (the query's embedding included)."""
    assert not isinstance(outcome, Exception), outcome
    fields = dataclasses.asdict(outcome)
    del fields["timings_ms"]
    return fields


def scores_of(answer: dict) -> dict[str, float]:
    """The uncertainty scores that were computed (those of draws need draws)."""
    return {k: answer["query"][k] for k in SCORE_NAMES if answer["query"][k] is not None}


def alone(searcher: Searcher, queries: list[Query]) -> list[dict]:
    return [answer(searcher.search_batch([query])[0]) for query in queries]


def test_a_batch_of_embedding_queries_is_answered_exactly_as_one_at_a_time(
    artifacts: Artifacts, searcher: Searcher
) -> None:
    """The same bits: results, distances, scores and every uncertainty score."""
    queries = embedding_queries(artifacts)
    expected = alone(searcher, queries)
    assert [answer(o) for o in searcher.search_batch(queries)] == expected
    assert [answer(o) for o in searcher.search_batch(queries[::-1])] == expected[::-1]
    # The queries differ where it matters: a mix-up could not go unnoticed.
    assert len({tuple(h["id"] for h in a["results"]) for a in expected}) >= 6
    assert len({a["query"]["log_det"] for a in expected}) == len(expected)
    assert {a["metric"] for a in expected} == {"w2", "kl", "min_kl", "elk", "match_prob"}
    assert {len(a["results"]) for a in expected} == {3, 4, 5, 7, 10}


def test_encoded_queries_in_one_batch_get_their_own_answers(
    artifacts: Artifacts, searcher: Searcher
) -> None:
    """Texts and images: the ONNX encoder's numbers move by float32 round-off with the batch's
    size (tests/models/test_encoder_runtime.py), so numbers are compared to 1e-4; ids and
    ranks must be the same."""
    mixed = encoded_queries(artifacts) + embedding_queries(artifacts)[:2]
    expected = alone(searcher, mixed)
    batched = [answer(o) for o in searcher.search_batch(mixed)]
    for got, want in zip(batched, expected, strict=True):
        assert [labels(h) for h in got["results"]] == [labels(h) for h in want["results"]]
        numbers = [x for h in want["results"] for x in numbers_of(h)]
        assert [x for h in got["results"] for x in numbers_of(h)] == pytest.approx(
            numbers, rel=1e-4, abs=1e-6
        )
        assert scores_of(got) == pytest.approx(scores_of(want), rel=1e-4, abs=1e-6)
        assert (
            got["metric"] == want["metric"]
            and got["query"]["modality"] == want["query"]["modality"]
        )
    assert len({a["query"]["log_det"] for a in expected}) == len(expected)


def labels(hit: dict) -> tuple:
    return hit["id"], hit["rank"], hit["metadata"]


def numbers_of(hit: dict) -> tuple:
    return hit["score"], hit["distance"], hit["log_det"]


def test_a_bad_query_fails_alone_in_its_batch(artifacts: Artifacts, searcher: Searcher) -> None:
    queries = embedding_queries(artifacts)[:3]
    bad = replace(queries[1], params=params(metric="csd"))  # no csd index in the session's
    outcomes = searcher.search_batch([queries[0], bad, queries[2]])
    assert isinstance(outcomes[1], InvalidQueryError)
    got = [answer(outcomes[0]), answer(outcomes[2])]
    assert got == alone(searcher, [queries[0], queries[2]])


@pytest.fixture(scope="module")
def no_dropout_searcher(artifacts: Artifacts, tmp_path_factory) -> Iterator[Searcher]:
    """The session's model with dropout 0 (re-exported) on the session's image gallery."""
    model = tmp_path_factory.mktemp("no-dropout-model")
    shutil.copytree(artifacts.model, model, dirs_exist_ok=True)
    replace(ModelConfig.load(model), dropout=0.0).save(model)
    export_model_dir(model, verify=False)
    holder = IndexHolder(
        artifacts.index_root, ["image"], None, ServiceMetrics(), poll_interval_s=60
    )
    holder.start()
    try:
        yield Searcher(
            holder, {"text": OnnxEncoder(model, "text", device="cpu")},
            default_metrics={"image": "w2", "text": "w2"},
            settings=Settings(candidate_metric="w2", max_shortlist=200), model_name="test",
            device=torch.device("cpu"),
        )  # fmt: skip
    finally:
        holder.stop()


def test_draws_of_a_model_without_dropout_change_nothing(
    artifacts: Artifacts, no_dropout_searcher: Searcher
) -> None:
    """Its draws are its embedding: 8 of them give the answer of none, with MI and feature
    uncertainty 0; an embedding query sampled in the same batch keeps its own draws."""
    caption = "a red circle"
    with_draws = Query("text", "image", params(mc_samples=8, temperature=0.2), 1, text=caption)
    without = replace(with_draws, params=params(mc_samples=0, temperature=0.2))
    (mu, logvar), *_ = gallery_gaussians(artifacts, "image", [5])
    sampled = Query("embedding", "image", params(mc_samples=8), 2, mu=mu, logvar=logvar)
    got, plain, embedded = no_dropout_searcher.search_batch([with_draws, without, sampled])
    assert answer(got)["results"] == answer(plain)["results"]
    assert got.query.posterior_entropy == plain.query.posterior_entropy
    assert got.query.mutual_information == got.query.feature_uncertainty == 0.0
    assert plain.query.mutual_information is None and got.query.mc_samples == 8
    assert answer(embedded) == alone(no_dropout_searcher, [sampled])[0]
    assert embedded.query.feature_uncertainty > 0
