"""service.http.schemas.read_json_request against the independent path FastAPI took before
it: json.loads, then pydantic validation of the Python objects."""

import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from service.http.schemas import (
    EmbeddingSearchRequest,
    TextSearchRequest,
    add_body_schemas,
    json_body_schema,
    read_json_request,
)

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-2, 300)
    | st.floats(-1e3, 1e3, width=32)
    | st.sampled_from([1.0, 3.0, 2.5, "3", "w2", "kl", "image", "text", "", " ", "a cat"])
)
JSON_VALUES = JSON_SCALARS | st.lists(JSON_SCALARS, max_size=4)
FIELDS = ["text", "k", "metric", "shortlist", "mc_samples", "temperature", "reject_threshold",
          "return_embedding", "mu", "logvar", "gallery", "unknown"]  # fmt: skip
VALID = {
    TextSearchRequest: {"text": "a red circle"},
    EmbeddingSearchRequest: {"mu": [0.5, -1.0, 2.0], "logvar": [0.0, -3.0, 1.0], "gallery": "text"},
}


def _app(model) -> TestClient:
    app = FastAPI()

    @app.post("/body", openapi_extra=json_body_schema(model))
    async def body(request: Request) -> dict:
        return (await read_json_request(request, model)).model_dump()

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception) -> JSONResponse:
        return JSONResponse({"error": type(error).__name__}, status_code=422)

    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture(scope="module", params=[TextSearchRequest, EmbeddingSearchRequest])
def model_and_client(request):
    return request.param, _app(request.param)


@settings(max_examples=150, deadline=None)
@given(
    changes=st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=3),
    dropped=st.sets(st.sampled_from(FIELDS), max_size=1),
)
def test_a_body_is_accepted_exactly_when_the_two_step_path_accepts_it_and_parses_the_same(
    model_and_client, changes: dict, dropped: set
) -> None:
    """A valid body with a few fields changed or dropped, so that both outcomes occur."""
    model, client = model_and_client
    body = {k: v for k, v in {**VALID[model], **changes}.items() if k not in dropped}
    data = json.dumps(body).encode()
    try:
        expected = model.model_validate(json.loads(data)).model_dump()
    except ValidationError:
        expected = None
    response = client.post("/body", content=data, headers={"content-type": "application/json"})
    if expected is None:
        assert response.status_code == 422, response.text
    else:
        assert response.status_code == 200, response.text
        assert response.json() == json.loads(json.dumps(expected))


def test_the_body_schemas_are_components_the_route_refers_to() -> None:
    client = _app(EmbeddingSearchRequest)
    openapi = client.app.openapi()
    add_body_schemas(openapi)
    content = openapi["paths"]["/body"]["post"]["requestBody"]["content"]
    assert content["application/json"]["schema"] == {
        "$ref": "#/components/schemas/EmbeddingSearchRequest"
    }
    schema = openapi["components"]["schemas"]["EmbeddingSearchRequest"]
    assert schema == EmbeddingSearchRequest.model_json_schema(
        ref_template="#/components/schemas/{model}"
    )
