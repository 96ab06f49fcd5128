"""POST /search/text, /search/image and /search/embedding: parse the request, answer it
(the work is in service.http.search_flow and service.http.image_request)."""

import hashlib
import time

import numpy as np
from fastapi import APIRouter, Request, Response

from service.errors import InvalidQueryError
from service.http.deps import ServicesDep
from service.http.image_request import image_query, read_image_request
from service.http.json_request import json_body_schema, read_json_request
from service.http.schemas import (
    SEARCH_ERROR_RESPONSES,
    EmbeddingSearchRequest,
    ImageSearchRequest,
    SearchOptions,
    SearchResponse,
    TextSearchRequest,
)
from service.http.search_flow import Answer, answer, check_text, search_params
from service.searcher import GALLERY_OF_KIND, Query

# The API key dependency is added by the app factory when require_api_key_for_search is set.
router = APIRouter(prefix="/search", tags=["search"], responses=SEARCH_ERROR_RESPONSES)

_IMAGE_FORM_SCHEMA = {
    "type": "object",
    "required": ["image"],
    "additionalProperties": False,
    "properties": {
        "image": {"type": "string", "format": "binary", "description": "The image file."},
        **{
            name: schema for name, schema in SearchOptions.model_json_schema()["properties"].items()
        },
    },
}
_IMAGE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {"schema": _IMAGE_FORM_SCHEMA},
            "application/json": {"schema": ImageSearchRequest.model_json_schema()},
        },
    }
}


@router.post(
    "/text", response_model=SearchResponse, openapi_extra=json_body_schema(TextSearchRequest)
)
async def search_text(request: Request, services: ServicesDep) -> Response:
    """Search the image gallery with a caption."""
    start = time.perf_counter()
    body = await read_json_request(request, TextSearchRequest)
    check_text(body.text, services.settings)
    params = search_params(body, services, GALLERY_OF_KIND["text"])

    async def query(seed: int) -> Query:
        return Query("text", GALLERY_OF_KIND["text"], params, seed, text=body.text)

    gallery, payload = GALLERY_OF_KIND["text"], {"text": body.text}
    result = await answer(services, "text", gallery, params, payload, query, start)
    return _respond(result)


@router.post("/image", response_model=SearchResponse, openapi_extra=_IMAGE_BODY)
async def search_image(request: Request, services: ServicesDep) -> Response:
    """Search the caption gallery with an image: multipart (field `image`) or JSON base64."""
    start = time.perf_counter()
    data, options = await read_image_request(request, services.settings.max_image_bytes)
    params = search_params(options, services, GALLERY_OF_KIND["image"])

    async def query(seed: int) -> Query:
        return await image_query(data, params, seed, services)

    gallery, payload = GALLERY_OF_KIND["image"], {"image_sha256": hashlib.sha256(data).hexdigest()}
    result = await answer(services, "image", gallery, params, payload, query, start)
    return _respond(result)


@router.post(
    "/embedding",
    response_model=SearchResponse,
    openapi_extra=json_body_schema(EmbeddingSearchRequest),
)
async def search_embedding(request: Request, services: ServicesDep) -> Response:
    """Search a gallery with a Gaussian (mu, logvar) computed by the caller's own encoder."""
    start = time.perf_counter()
    body = await read_json_request(request, EmbeddingSearchRequest)
    mu, logvar = _embedding(body, services.settings.max_embedding_dim)
    params = search_params(body, services, body.gallery)

    async def query(seed: int) -> Query:
        return Query("embedding", body.gallery, params, seed, mu=mu, logvar=logvar)

    payload = {"mu": body.mu, "logvar": body.logvar}
    result = await answer(services, "embedding", body.gallery, params, payload, query, start)
    return _respond(result)


def _embedding(body: EmbeddingSearchRequest, max_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """mu and logvar as float32 arrays, after the checks the schema cannot express."""
    if len(body.mu) != len(body.logvar):
        raise InvalidQueryError(
            f"mu has {len(body.mu)} values and logvar {len(body.logvar)}; they must match"
        )
    if len(body.mu) > max_dim:
        raise InvalidQueryError(f"embedding has {len(body.mu)} dimensions; the limit is {max_dim}")
    float32_max = float(np.finfo(np.float32).max)
    if max(map(abs, body.mu + body.logvar)) > float32_max:
        raise InvalidQueryError(f"mu and logvar must fit in float32 (|x| <= {float32_max:.3g})")
    return np.asarray(body.mu, np.float32), np.asarray(body.logvar, np.float32)


def _respond(result: Answer) -> Response:
    cache = "hit" if result.cache_hit else "miss"
    return Response(result.body, media_type="application/json", headers={"X-Cache": cache})
