"""POST /search/text, /search/image and /search/embedding: validate, cache, batch, answer."""

import base64
import binascii
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from PIL import Image, UnidentifiedImageError
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from models.preprocess import ImageTooLargeError, InvalidImageError
from service.cache import cache_key
from service.deps import JsonBody, Services, ServicesDep
from service.errors import (
    IndexUnavailableError,
    InvalidQueryError,
    PayloadTooLargeError,
    UnsupportedMediaTypeError,
)
from service.middleware import BodyReadTimeoutError
from service.schemas import (
    SEARCH_ERROR_RESPONSES,
    EmbeddingSearchRequest,
    ImageSearchRequest,
    QueryInfo,
    RejectScoreInfo,
    SearchHit,
    SearchOptions,
    SearchResponse,
    TextSearchRequest,
    Timings,
)
from service.searcher import (
    GALLERY_OF_KIND,
    Outcome,
    Query,
    SearchParams,
    default_shortlist,
)

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


@router.post("/text", response_model=SearchResponse, dependencies=[JsonBody])
async def search_text(body: TextSearchRequest, services: ServicesDep) -> Response:
    """Search the image gallery with a caption."""
    start = time.perf_counter()
    limit = services.settings.max_text_chars
    if not body.text.strip():
        raise InvalidQueryError("text is empty: send a caption with at least one word")
    if len(body.text) > limit:
        raise InvalidQueryError(
            f"text has {len(body.text)} characters; the limit is {limit} (max_text_chars)"
        )
    params = _params(body, services)
    return await _answer(
        services,
        "text",
        GALLERY_OF_KIND["text"],
        params,
        {"text": body.text},
        lambda seed: Query("text", "image", params, seed, text=body.text),
        start,
    )


@router.post("/image", response_model=SearchResponse, openapi_extra=_IMAGE_BODY)
async def search_image(request: Request, services: ServicesDep) -> Response:
    """Search the caption gallery with an image: multipart (field `image`) or JSON base64."""
    start = time.perf_counter()
    data, options = await _read_image_request(request, services.settings.max_image_bytes)
    params = _params(options, services)
    image_sha = hashlib.sha256(data).hexdigest()
    decode_start = time.perf_counter()
    image = await _decode(data, services)
    decode_ms = 1000 * (time.perf_counter() - decode_start)
    services.metrics.stage_latency.labels(stage="decode").observe(decode_ms / 1000)
    return await _answer(
        services,
        "image",
        GALLERY_OF_KIND["image"],
        params,
        {"image_sha256": image_sha},
        lambda seed: Query("image", "text", params, seed, image=image),
        start,
        extra_encode_ms=decode_ms,
    )


@router.post("/embedding", response_model=SearchResponse, dependencies=[JsonBody])
async def search_embedding(body: EmbeddingSearchRequest, services: ServicesDep) -> Response:
    """Search a gallery with a Gaussian (mu, logvar) computed by the caller's own encoder."""
    start = time.perf_counter()
    if len(body.mu) != len(body.logvar):
        raise InvalidQueryError(
            f"mu has {len(body.mu)} values and logvar {len(body.logvar)}; they must match"
        )
    if len(body.mu) > services.settings.max_embedding_dim:
        raise InvalidQueryError(
            f"embedding has {len(body.mu)} dimensions; the limit is "
            f"{services.settings.max_embedding_dim}"
        )
    params = _params(body, services)
    float32_max = float(np.finfo(np.float32).max)
    if max(map(abs, body.mu + body.logvar)) > float32_max:
        raise InvalidQueryError(f"mu and logvar must fit in float32 (|x| <= {float32_max:.3g})")
    mu, logvar = np.asarray(body.mu, np.float32), np.asarray(body.logvar, np.float32)
    payload = {"mu": body.mu, "logvar": body.logvar}
    return await _answer(
        services,
        "embedding",
        body.gallery,
        params,
        payload,
        lambda seed: Query("embedding", body.gallery, params, seed, mu=mu, logvar=logvar),
        start,
    )


# ----- shared steps ------------------------------------------------------------------------


def _params(options: SearchOptions, services: Services) -> SearchParams:
    """Check the options against the configured limits and fill in the defaults."""
    settings = services.settings
    if options.k > settings.max_k:
        raise InvalidQueryError(f"k={options.k} is above the limit {settings.max_k}; ask for fewer")
    if options.shortlist is not None:
        if options.shortlist > settings.max_shortlist:
            raise InvalidQueryError(
                f"shortlist={options.shortlist} is above the limit {settings.max_shortlist}"
            )
        if options.shortlist < options.k:
            raise InvalidQueryError(
                f"shortlist={options.shortlist} is smaller than k={options.k}; it must be >= k"
            )
    mc_samples = settings.mc_samples if options.mc_samples is None else options.mc_samples
    if mc_samples > settings.max_mc_samples:
        raise InvalidQueryError(
            f"mc_samples={mc_samples} is above the limit {settings.max_mc_samples}"
        )
    return SearchParams(
        k=options.k,
        metric=options.metric or services.searcher.default_metric,
        shortlist=options.shortlist or min(default_shortlist(options.k), settings.max_shortlist),
        mc_samples=mc_samples,
        temperature=options.temperature,
        reject_threshold=options.reject_threshold,
        return_embedding=options.return_embedding,
    )


def _digest(value: Any) -> str:
    return hashlib.sha256(
        json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


async def _answer(
    services: Services,
    kind: str,
    gallery: str,
    params: SearchParams,
    payload: dict[str, Any],
    make_query: Callable[[int], Query],
    start: float,
    extra_encode_ms: float = 0.0,
) -> Response:
    """Cache lookup, micro-batched search, response, cache store."""
    version = services.holder.versions().get(gallery)
    if version is None:
        raise IndexUnavailableError(services.holder.unavailable_message(gallery))
    # The MC draws depend on the query itself only (so k, the metric or a threshold override
    # never change them); the cache key covers the whole canonical request.
    query_part = {"kind": kind, "model": services.model_name, "mc": params.mc_samples, **payload}
    seed = int(_digest(query_part)[:16], 16) >> 1  # 63 bits
    request_hash = _digest({**query_part, "gallery": gallery, "params": dataclasses.asdict(params)})
    cached = await services.cache.get(cache_key(version, request_hash))
    if cached is not None:
        return Response(cached, media_type="application/json", headers={"X-Cache": "hit"})
    batcher = services.image_batcher if kind == "image" else services.batcher
    outcome = await batcher.submit(make_query(seed))
    outcome.timings_ms["encode"] += extra_encode_ms
    outcome.timings_ms["total"] = 1000 * (time.perf_counter() - start)
    body = _response(outcome, params, services.model_name).model_dump_json().encode()
    _observe(services, outcome)
    await services.cache.set(cache_key(outcome.index_version, request_hash), body)
    return Response(body, media_type="application/json", headers={"X-Cache": "miss"})


def _response(outcome: Outcome, params: SearchParams, model_name: str) -> SearchResponse:
    unc = outcome.uncertainty
    query = QueryInfo(
        modality=outcome.kind,
        log_det=unc.log_det,
        entropy=unc.entropy,
        mutual_information=unc.mutual_information,
        feature_uncertainty=unc.feature_uncertainty,
        posterior_entropy=unc.posterior_entropy,
        reject_score=RejectScoreInfo(**dataclasses.asdict(outcome.reject_score)),
        rejected=outcome.reject_score.rejected,
        reject_threshold=outcome.reject_score.threshold,
        temperature=outcome.temperature,
        mc_samples=outcome.mc_samples,
        shortlist_size=outcome.shortlist_size,
        mu=outcome.mu.tolist() if params.return_embedding else None,
        logvar=outcome.logvar.tolist() if params.return_embedding else None,
    )
    hits = [
        SearchHit(
            id=h.id,
            rank=h.rank,
            score=h.score,
            distance=h.distance,
            log_det=h.log_det,
            metadata=h.metadata,
        )
        for h in outcome.hits
    ]
    return SearchResponse(
        query=query,
        results=hits,
        metric=outcome.metric,
        index_version=outcome.index_version,
        model=model_name,
        timings_ms=Timings(**outcome.timings_ms),
    )


def _observe(services: Services, outcome: Outcome) -> None:
    for stage, ms in outcome.timings_ms.items():
        services.metrics.stage_latency.labels(stage=stage).observe(ms / 1000)
    if outcome.reject_score.rejected:
        services.metrics.rejections.labels(gallery=GALLERY_OF_KIND.get(outcome.kind, "")).inc()


# ----- image request parsing ---------------------------------------------------------------


async def _read_image_request(request: Request, max_bytes: int) -> tuple[bytes, SearchOptions]:
    """The image bytes and options of a multipart or JSON /search/image request."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type == "multipart/form-data":
        return await _read_multipart(request, max_bytes)
    if media_type in ("application/json", ""):
        return await _read_json_image(request, max_bytes)
    raise UnsupportedMediaTypeError(
        f"Content-Type {media_type!r} is not accepted: send multipart/form-data with the file in "
        "field `image`, or application/json with `image_base64`"
    )


async def _read_multipart(request: Request, max_bytes: int) -> tuple[bytes, SearchOptions]:
    try:
        form = await request.form(max_files=1, max_fields=20)
    except BodyReadTimeoutError:
        raise
    except Exception as error:  # python-multipart raises several types for malformed bodies
        raise InvalidQueryError(f"malformed multipart body: {error}") from None
    upload = form.get("image")
    if not isinstance(upload, UploadFile):
        raise InvalidQueryError(
            "multipart field `image` is missing or not a file: "
            "send the image as a file part named `image`"
        )
    declared = (upload.content_type or "").split(";")[0].strip().lower()
    if declared and not declared.startswith("image/") and declared != "application/octet-stream":
        raise UnsupportedMediaTypeError(
            f"the `image` part is {declared!r}; send an image file (PNG, JPEG, ...)"
        )
    data = await upload.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise PayloadTooLargeError(f"image is larger than {max_bytes} bytes (max_image_bytes)")
    names = [name for name, _ in form.multi_items()]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InvalidQueryError(f"form fields given more than once: {', '.join(repeated)}")
    fields = {name: _form_value(value) for name, value in form.multi_items() if name != "image"}
    return data, _validate(SearchOptions, fields)


async def _read_json_image(request: Request, max_bytes: int) -> tuple[bytes, SearchOptions]:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise InvalidQueryError("the body is not valid JSON") from None
    parsed = _validate(ImageSearchRequest, body)
    if len(parsed.image_base64) > max_bytes * 4 // 3 + 4:
        raise PayloadTooLargeError(f"image is larger than {max_bytes} bytes (max_image_bytes)")
    try:
        data = base64.b64decode(parsed.image_base64, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidQueryError(
            "image_base64 is not valid base64 (standard alphabet, with padding)"
        ) from None
    options = SearchOptions.model_validate(parsed.model_dump(exclude={"image_base64"}))
    return data, options


async def _decode(data: bytes, services: Services) -> Image.Image:
    """Decode in the decoder's pool; a file of no image format at all is a 415, not a 422."""
    max_pixels = services.decoder.max_pixels
    try:
        return await services.decoder.decode(data)
    except ImageTooLargeError as error:
        raise ImageTooLargeError(
            f"{error}; this service accepts images of at most {max_pixels} pixels: downscale it"
        ) from None
    except InvalidImageError as error:
        if isinstance(error.__cause__, UnidentifiedImageError):
            raise UnsupportedMediaTypeError(
                "the uploaded file is not in an image format this service reads; send a PNG, "
                "JPEG, GIF, BMP or WebP file"
            ) from None
        raise


def _form_value(value: Any) -> Any:
    """A form field as the JSON value it spells ("3" -> 3, "true" -> True); other text (a
    metric name, "null": form fields are never null) stays a string."""
    if not isinstance(value, str):
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if isinstance(parsed, int | float) else value


def _validate(model: type, data: Any) -> Any:
    """Validate like FastAPI does for declared bodies (errors become the same 422)."""
    if not isinstance(data, dict):
        raise InvalidQueryError("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise RequestValidationError(error.errors(include_url=False)) from None
