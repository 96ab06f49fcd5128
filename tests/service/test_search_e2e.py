"""End-to-end searches against a real uvicorn server, real Redis and real indexes."""

import base64
import io
import itertools
import math
import time
from collections.abc import Callable

import httpx
import numpy as np
import pytest
import redis
from PIL import Image

from service.outcome import parse_response, response_json
from tests.service.conftest import Artifacts, ServerThread, brute_force

CAPTION = "a big red circle and a small blue square"


def png_bytes(color: str = "red", size: int = 64) -> bytes:
    """A small PNG with a filled circle, enough for the shapes encoder."""
    image = Image.new("RGB", (size, size), "white")
    from PIL import ImageDraw

    ImageDraw.Draw(image).ellipse((8, 8, size - 8, size - 8), fill=color)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("shortlist", [None, 10])
@pytest.mark.parametrize("metric", ["w2", "kl", "min_kl"])
def test_text_search_equals_exhaustive_exact_ranking(
    client: httpx.Client, artifacts: Artifacts, metric: str, shortlist: int | None
) -> None:
    # shortlist = k leaves no slack: only a metric-native, exact shortlist passes.
    k = 10
    response = client.post(
        "/search/text",
        json={
            "text": CAPTION,
            "k": k,
            "metric": metric,
            "shortlist": shortlist,
            "return_embedding": True,
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["metric"] == metric and body["index_version"] == artifacts.image_v1
    query = body["query"]
    expected_ids, expected_distances = brute_force(
        artifacts.index_root / "image" / artifacts.image_v1, metric, query["mu"], query["logvar"], k
    )
    assert [hit["id"] for hit in body["results"]] == expected_ids
    np.testing.assert_allclose(
        [hit["distance"] for hit in body["results"]], expected_distances, rtol=1e-4, atol=1e-5
    )
    assert [hit["rank"] for hit in body["results"]] == list(range(1, k + 1))


def test_image_search_multipart_and_base64_agree_and_rank_exactly(
    client: httpx.Client, artifacts: Artifacts
) -> None:
    data = png_bytes("green")
    multipart = client.post(
        "/search/image",
        files={"image": ("query.png", data, "image/png")},
        data={"k": "5", "metric": "kl", "return_embedding": "true"},
    )
    as_json = client.post(
        "/search/image",
        json={"image_base64": base64.b64encode(data).decode(), "k": 5, "metric": "kl",
              "return_embedding": True},
    )  # fmt: skip
    assert multipart.status_code == 200, multipart.text
    assert as_json.status_code == 200, as_json.text
    first, second = multipart.json(), as_json.json()
    assert first["results"] == second["results"]
    assert first["query"]["mutual_information"] == second["query"]["mutual_information"]
    assert first["query"]["modality"] == "image" and first["index_version"] == artifacts.text_v1
    expected_ids, _ = brute_force(
        artifacts.index_root / "text" / artifacts.text_v1, "kl",
        first["query"]["mu"], first["query"]["logvar"], 5,
    )  # fmt: skip
    assert [hit["id"] for hit in first["results"]] == expected_ids
    assert all("text" in hit["metadata"] for hit in first["results"])


def test_embedding_search_matches_the_text_search_it_came_from(client: httpx.Client) -> None:
    text = client.post(
        "/search/text", json={"text": CAPTION, "k": 7, "return_embedding": True}
    ).json()
    again = client.post(
        "/search/embedding",
        json={"mu": text["query"]["mu"], "logvar": text["query"]["logvar"], "gallery": "image",
              "k": 7},
    )  # fmt: skip
    assert again.status_code == 200, again.text
    body = again.json()
    assert body["query"]["modality"] == "embedding"
    assert [h["id"] for h in body["results"]] == [h["id"] for h in text["results"]]
    assert body["query"]["log_det"] == pytest.approx(text["query"]["log_det"], rel=1e-6)


def test_uncertainty_is_deterministic_and_bounded(client: httpx.Client) -> None:
    # return_embedding changes the cache key but not the query, so both are computed afresh.
    request = {"text": "two yellow stars", "k": 5, "mc_samples": 12}
    first = client.post("/search/text", json=request)
    second = client.post("/search/text", json={**request, "return_embedding": True})
    assert first.headers["x-cache"] == "miss" and second.headers["x-cache"] == "miss"
    one, two = first.json()["query"], second.json()["query"]
    assert one["mutual_information"] == two["mutual_information"]
    assert one["feature_uncertainty"] == two["feature_uncertainty"]
    assert one["shortlist_size"] == 100
    assert 0.0 <= one["mutual_information"] <= math.log(one["shortlist_size"])
    assert one["feature_uncertainty"] > 0  # MC-dropout draws differ
    scores = [hit["score"] for hit in first.json()["results"]]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1 + 1e-6
    expected_entropy = 0.5 * (len(two["mu"]) * (1 + math.log(2 * math.pi)) + two["log_det"])
    assert two["entropy"] == pytest.approx(expected_entropy, rel=1e-5)


def test_no_mc_samples_means_no_mi_and_no_rejection(client: httpx.Client) -> None:
    body = client.post("/search/text", json={"text": "a circle", "mc_samples": 0,
                                             "reject_threshold": 0.0}).json()  # fmt: skip
    assert body["query"]["mutual_information"] is None
    assert body["query"]["rejected"] is False


def test_rejected_flips_exactly_at_the_threshold(client: httpx.Client) -> None:
    request = {"text": "an orange star next to a circle", "k": 5, "mc_samples": 10}
    mi = client.post("/search/text", json=request).json()["query"]["mutual_information"]
    assert mi > 0

    def rejected(threshold: float) -> bool:
        body = client.post("/search/text", json={**request, "reject_threshold": threshold})
        query = body.json()["query"]
        assert query["mutual_information"] == mi  # the threshold does not change the draws
        assert query["reject_threshold"] == threshold
        return query["rejected"]

    assert rejected(math.nextafter(mi, 0.0)) is True
    assert rejected(mi) is False  # rejected means MI > threshold
    assert rejected(math.nextafter(mi, math.inf)) is False
    # Without an override the manifest's calibrated threshold applies (null: never rejected).
    default = client.post("/search/text", json=request).json()["query"]
    assert default["reject_threshold"] is None and default["rejected"] is False


def test_cache_hit_returns_the_identical_body(
    client: httpx.Client, server: ServerThread, artifacts: Artifacts
) -> None:
    request = {"text": "a purple square", "k": 4, "metric": "kl"}
    before = _cache_counts(client)
    first = client.post("/search/text", json=request)
    second = client.post("/search/text", json=request)
    assert first.headers["x-cache"] == "miss"
    assert second.headers["x-cache"] == "hit"
    assert second.content == first.content
    # Alone with a key it never saw, the first did not ask Redis; the second, whose key the
    # server stored, did and found it.
    after = _cache_counts(client)
    assert {name: after[name] - before[name] for name in after} == {
        "skips": 1, "hits": 1, "misses": 0
    }  # fmt: skip
    settings = server.services.settings
    pattern = f"probsearch:{server.services.holder.namespace}:cache:{artifacts.image_v1}:*"
    keys = _eventually(lambda: redis.Redis.from_url(settings.redis_url).keys(pattern))
    assert keys, "the response was not cached under its index version"
    ttl = redis.Redis.from_url(settings.redis_url).ttl(keys[0])
    assert 0 < ttl <= settings.cache_ttl_s


def test_every_search_body_is_exactly_a_search_response(client: httpx.Client) -> None:
    """Each body parses into the declared SearchResponse (service.outcome) and dumps back to the
    same bytes, and the OpenAPI schema names the same fields: none is missing, extra, renamed
    or out of order."""
    text = client.post(
        "/search/text", json={"text": "a tiny yellow star", "k": 3, "return_embedding": True}
    )
    image = client.post(
        "/search/image",
        files={"image": ("query.png", png_bytes("purple", size=60), "image/png")},
        data={"k": "2", "mc_samples": "0"},
    )
    query = text.json()["query"]
    embedding = client.post(
        "/search/embedding",
        json={"mu": query["mu"], "logvar": query["logvar"], "gallery": "image", "k": 4},
    )
    for response in (text, image, embedding):
        assert response.status_code == 200, response.text
        assert response_json(parse_response(response.content)) == response.content
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for name, body in (("SearchResponse", text.json()), ("QueryInfo", query)):
        assert list(schemas[name]["properties"]) == list(body), name
    assert list(schemas["SearchHit"]["properties"]) == list(text.json()["results"][0])
    assert len(query["mu"]) == len(query["logvar"]) > 0


def test_an_image_cache_hit_does_not_decode_the_image(client: httpx.Client) -> None:
    files = {"image": ("query.png", png_bytes("orange", size=72), "image/png")}
    decodes = [_decode_count(client)]
    first = client.post("/search/image", files=files, data={"k": "3"})
    decodes.append(_decode_count(client))
    second = client.post("/search/image", files=files, data={"k": "3"})
    decodes.append(_decode_count(client))
    assert (first.headers["x-cache"], second.headers["x-cache"]) == ("miss", "hit")
    assert second.content == first.content
    assert [b - a for a, b in itertools.pairwise(decodes)] == [1, 0]
    assert first.json()["timings_ms"]["encode"] > 0


def _decode_count(client: httpx.Client) -> float:
    """How many images the server decoded (its decode stage histogram's count)."""
    prefix = 'probsearch_stage_latency_seconds_count{stage="decode"} '
    lines = client.get("/metrics").text.splitlines()
    return next((float(line.split()[-1]) for line in lines if line.startswith(prefix)), 0.0)


def _eventually(read: Callable[[], list], timeout_s: float = 2.0) -> list:
    """What `read` returns once it is not empty (writes behind land later), else its last."""
    deadline = time.monotonic() + timeout_s
    while not (found := read()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return found


def _cache_counts(client: httpx.Client) -> dict[str, float]:
    """The result cache's counters in the server's /metrics."""
    lines = client.get("/metrics").text.splitlines()
    return {
        name: next(float(line.split()[-1]) for line in lines
                   if line.startswith(f"probsearch_cache_{name}_total "))
        for name in ("skips", "hits", "misses")
    }  # fmt: skip


def test_health_readiness_indexes_and_metrics(client: httpx.Client, artifacts: Artifacts) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["versions"] == {"image": artifacts.image_v1, "text": artifacts.text_v1}
    indexes = client.get("/v1/indexes").json()["indexes"]
    assert {(i["modality"], i["version"]) for i in indexes} == {
        ("image", artifacts.image_v1), ("text", artifacts.text_v1)
    }  # fmt: skip
    client.post("/search/text", json={"text": "a blue circle", "reject_threshold": 0.0})
    metrics = client.get("/metrics").text
    assert (
        f'probsearch_active_index_version{{modality="image",version="{artifacts.image_v1}"}} 1.0'
        in metrics
    )
    assert 'probsearch_onnx_provider{encoder="text",provider="CPUExecutionProvider"} 1.0' in metrics
    assert 'probsearch_requests_total{endpoint="/search/text",status="200"}' in metrics
    assert 'probsearch_stage_latency_seconds_count{stage="rerank"}' in metrics
    assert "probsearch_cache_hits_total" in metrics and "probsearch_cache_misses_total" in metrics
    assert 'probsearch_rejections_total{gallery="image"}' in metrics


def test_timings_cover_every_stage(client: httpx.Client) -> None:
    body = client.post("/search/text", json={"text": "a small green box", "k": 3}).json()
    timings = body["timings_ms"]
    assert set(timings) == {"encode", "shortlist", "rerank", "uncertainty", "total"}
    assert all(value >= 0 for value in timings.values())
    stages = timings["encode"] + timings["shortlist"] + timings["rerank"] + timings["uncertainty"]
    assert timings["total"] >= stages * 0.99


ROUNDS = 5  # concurrent rounds of test_mc_draws_do_not_depend_on_the_micro_batch


def test_mc_draws_do_not_depend_on_the_micro_batch(artifacts: Artifacts) -> None:
    """A request's MI is the same alone and encoded in one batch with other requests."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.service.conftest import make_settings

    # Inline queries are batches of one, and a second batch in flight takes what the first
    # leaves; this test needs batches of several. A batch waits for others only after a batch
    # of several (up to a second here), so whether the first concurrent round shares a batch
    # depends on timing: once all four arrived alone while the other test worker loaded both
    # cores. Rounds repeat until one has shared a batch (at most ROUNDS).
    settings = make_settings(
        artifacts, cache_ttl_s=0, batch_max_wait_ms=1000.0, batch_inline_when_alone=False,
        batch_concurrency=1,
    )  # fmt: skip
    texts = ["two yellow stars", "a red circle", "a blue box above a green ball", "shapes"]
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=60) as http:

        def mi(text: str) -> float:
            body = http.post("/search/text", json={"text": text, "k": 3, "mc_samples": 8}).json()
            return body["query"]["mutual_information"]

        def batches_and_queries() -> tuple[float, float]:
            registry = server.app.state.metrics.registry
            return (
                registry.get_sample_value("probsearch_batch_size_count"),
                registry.get_sample_value("probsearch_batch_size_sum"),
            )

        alone = [mi(text) for text in texts]
        assert batches_and_queries() == (len(texts), len(texts))
        with ThreadPoolExecutor(len(texts)) as pool:
            for _ in range(ROUNDS):
                assert list(pool.map(mi, texts)) == alone
                batches, queries = batches_and_queries()
                if batches < queries:
                    break
    assert queries % len(texts) == 0  # every request went through the batcher once
    assert batches < queries  # some requests shared a batch
