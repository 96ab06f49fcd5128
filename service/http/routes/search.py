"""POST /search/text, /search/image and /search/embedding: parse the request, answer it
(the work is in service.http.search_flow and service.http.image_request)."""

import hashlib
import time

from fastapi import APIRouter, Request, Response

from service.http.deps import ServicesDep
from service.http.image_request import read_image_request
from service.http.schemas import (
    SEARCH_ERROR_RESPONSES,
    EmbeddingSearchRequest,
    ImageSearchRequest,
    SearchOptions,
    TextSearchRequest,
    json_body_schema,
    read_json_request,
)
from service.http.search_flow import Answer, answer
from service.http.vectors import backbone_vector, gaussian
from service.outcome import SearchResponse
from service.searcher import GALLERY_OF_KIND, QueryInput

# The API key dependency is added by the app factory when require_api_key_for_search is set.
router = APIRouter(prefix="/search", tags=["search"], responses=SEARCH_ERROR_RESPONSES)
# The routes whose body may hold an image (up to max_image_bytes); the others take JSON only.
IMAGE_PATHS = frozenset({"/search/image"})

_IMAGE_FORM_SCHEMA = {
    "type": "object",
    "required": ["image"],
    "additionalProperties": False,
    "properties": {
        "image": {"type": "string", "format": "binary", "description": "The image file."},
        **{
            name: schema for name, schema in SearchOptions.model_json_schema()["properties"].items()
        },
        "filter": {
            "type": "string",
            "description": "The filter object (see the JSON body's `filter`), as JSON text.",
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
    gallery = GALLERY_OF_KIND["text"]
    services.searcher.check_text(body.text)
    ask = QueryInput("text", gallery, body.options(), {"text": body.text}, text=body.text)
    return _respond(await answer(services, ask, start))


@router.post("/image", response_model=SearchResponse, openapi_extra=_IMAGE_BODY)
async def search_image(request: Request, services: ServicesDep) -> Response:
    """Search the caption gallery with an image: multipart (field `image`) or JSON base64."""
    start = time.perf_counter()
    data, options = await read_image_request(request, services.settings.max_image_bytes)
    gallery = GALLERY_OF_KIND["image"]
    identity = {"image_sha256": hashlib.sha256(data).hexdigest()}
    ask = QueryInput("image", gallery, options.options(), identity, image_bytes=data)
    return _respond(await answer(services, ask, start))


@router.post(
    "/embedding",
    response_model=SearchResponse,
    openapi_extra=json_body_schema(EmbeddingSearchRequest),
)
async def search_embedding(request: Request, services: ServicesDep) -> Response:
    """Search a gallery with a Gaussian (mu, logvar) computed by the caller's own encoder, or
    with a backbone vector (features) that the model's heads embed."""
    start = time.perf_counter()
    body = await read_json_request(request, EmbeddingSearchRequest)
    options = body.options()
    if body.features is not None:
        features = backbone_vector(body.features, services.settings.max_embedding_dim)
        identity = {"features": body.features}
        ask = QueryInput("vector", body.gallery, options, identity, features=features)
    else:
        assert body.mu is not None and body.logvar is not None
        mu, logvar = gaussian(body.mu, body.logvar, services.settings.max_embedding_dim)
        identity = {"mu": body.mu, "logvar": body.logvar}
        ask = QueryInput("embedding", body.gallery, options, identity, mu=mu, logvar=logvar)
    return _respond(await answer(services, ask, start))


def _respond(result: Answer) -> Response:
    cache = "hit" if result.cache_hit else "miss"
    return Response(result.body, media_type="application/json", headers={"X-Cache": cache})
