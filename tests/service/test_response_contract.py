"""Every 200 matches the response schema, at the edges of what the request schema allows."""

import math

import httpx
import pytest

from service.http.schemas import (
    LOGVAR_LIMIT,
    MAX_TEMPERATURE,
    MIN_TEMPERATURE,
    MU_LIMIT,
)
from service.outcome import parse_response

EDGES = [(MU_LIMIT, LOGVAR_LIMIT), (-MU_LIMIT, -LOGVAR_LIMIT), (MU_LIMIT, -LOGVAR_LIMIT),
         (0.0, LOGVAR_LIMIT)]  # fmt: skip


def allowed_metrics(client: httpx.Client) -> list[str]:
    schema = client.get("/openapi.json").json()
    props = schema["components"]["schemas"]["EmbeddingSearchRequest"]["properties"]
    return next(b["enum"] for b in props["metric"]["anyOf"] if b.get("type") == "string")


@pytest.mark.parametrize("temperature", [MIN_TEMPERATURE, MAX_TEMPERATURE])
@pytest.mark.parametrize("gallery", ["image", "text"])
def test_embeddings_at_the_bounds_give_complete_finite_answers(
    client: httpx.Client, gallery: str, temperature: float
) -> None:
    metrics = allowed_metrics(client)
    assert metrics == client.get("/v1/config").json()["metrics"]  # the one list (issue 42.3)
    assert {"w2", "kl", "min_kl"} <= set(metrics)
    for metric in metrics:
        for mu, logvar in EDGES:
            body = {"mu": [mu] * 32, "logvar": [logvar] * 32, "gallery": gallery, "k": 5,
                    "metric": metric, "temperature": temperature, "mc_samples": 4}  # fmt: skip
            response = client.post("/search/embedding", json=body)
            assert response.status_code == 200, (metric, mu, logvar, response.text)
            answer = parse_response(response.content)
            assert len(answer.results) == 5, (metric, mu, logvar)
            numbers = [
                answer.query.log_det,
                answer.query.entropy,
                answer.query.mutual_information,
                answer.query.feature_uncertainty,
            ]
            numbers += [v for h in answer.results for v in (h.score, h.distance, h.log_det)]
            assert all(v is not None and math.isfinite(v) for v in numbers), (metric, mu, logvar)
            assert all(0.0 <= h.score <= 1.0 for h in answer.results)
