"""The FastAPI app factory: long-lived services built in the lifespan, errors mapped at the edge."""

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from indexer.publish import model_fingerprint
from indexer.store import IndexVersion
from models.encoder_runtime import OnnxEncoder
from models.model_config import ModelConfig
from models.scoring.rerank import compute_device
from service.batching import MicroBatcher
from service.cache import ResultCache
from service.deps import Services
from service.errors import HANDLED_ERRORS, status_of
from service.gallery_stats import GalleryStats
from service.index_holder import IndexHolder
from service.metrics import ServiceMetrics
from service.routes import admin, health, items, page, search
from service.searcher import GALLERY_OF_KIND, Searcher
from service.settings import Settings

log = logging.getLogger(__name__)

# The query encoder each gallery needs: the image gallery is searched with text, and back.
ENCODER_FOR_GALLERY = {gallery: kind for kind, gallery in GALLERY_OF_KIND.items()}


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; models and indexes are loaded when it starts (lifespan), not here."""
    settings = settings if settings is not None else Settings()
    app = FastAPI(
        title="probsearch",
        summary="Uncertainty-aware image <-> text retrieval with Gaussian embeddings.",
        version="0.1.0",
        lifespan=_lifespan,
    )
    app.state.settings = settings
    app.state.metrics = ServiceMetrics()
    app.state.services = None
    app.state.gallery_stats = GalleryStats()
    for router in (search.router, health.router, admin.router, items.router, page.router):
        app.include_router(router)
    app.mount("/static", page.static_files(), name="static")
    _install_error_handlers(app)
    app.add_middleware(
        RequestMetricsMiddleware, metrics=app.state.metrics, paths=set(app.openapi()["paths"])
    )
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Content-Type", "X-API-Key", "Authorization"],
        )
    return app


def create_app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory` with several workers: settings from PROBSEARCH_*."""
    return create_app(Settings())


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    services = await asyncio.to_thread(build_services, settings, app.state.metrics)
    await services.batcher.start()
    app.state.services = services
    try:
        yield
    finally:
        app.state.services = None
        await services.batcher.stop()
        await services.cache.close()
        await asyncio.to_thread(services.holder.stop)


def build_services(settings: Settings, metrics: ServiceMetrics) -> Services:
    """Load the encoders, open the active indexes and start watching for activations."""
    config = ModelConfig.load(settings.model)
    encoders = {}
    for gallery in settings.galleries:
        kind = ENCODER_FOR_GALLERY[gallery]
        encoders[kind] = OnnxEncoder(settings.model, kind, device=settings.device)
        metrics.onnx_provider.labels(encoder=kind, provider=encoders[kind].provider).set(1)
    holder = IndexHolder(
        settings.index_root,
        settings.galleries,
        settings.redis_url,
        metrics,
        device=settings.device,
        check=_compatibility_check(settings.model, config),
        poll_interval_s=settings.poll_interval_s,
        socket_timeout_s=settings.redis_socket_timeout_s,
        backoff_max_s=settings.redis_backoff_max_s,
    )
    holder.start()
    searcher = Searcher(
        holder,
        encoders,
        default_metric=config.search_metric,
        candidate_metric=settings.candidate_metric,
        max_shortlist=settings.max_shortlist,
        device=compute_device(settings.device),
    )
    batcher = MicroBatcher(
        searcher.search_batch,
        max_size=settings.batch_max_size,
        max_wait_s=settings.batch_max_wait_ms / 1000,
        on_batch=metrics.batch_size.observe,
        name="search-batcher",
    )
    cache = ResultCache(
        settings.redis_url,
        settings.cache_ttl_s,
        metrics,
        settings.redis_socket_timeout_s,
        settings.redis_backoff_max_s,
    )
    return Services(settings, metrics, holder, encoders, searcher, batcher, cache, config.name)


def _compatibility_check(model_dir: Path, config: ModelConfig):
    """Refuse index versions built by another model (their distances would be meaningless)."""

    def check(index: IndexVersion) -> None:
        manifest = index.manifest
        if manifest.dim != config.embed_dim:
            raise ValueError(
                f"index has dim {manifest.dim}, the model embeds in {config.embed_dim}; "
                "rebuild it with this model"
            )
        name, model_hash = model_fingerprint(model_dir, manifest.modality)
        if (manifest.model_name, manifest.model_hash) != (name, model_hash):
            raise ValueError(
                f"index was built by model {manifest.model_name!r} (hash "
                f"{manifest.model_hash[:12]}), the service runs {name!r} (hash "
                f"{model_hash[:12]}); rebuild the index with this model"
            )

    return check


# ----- errors ------------------------------------------------------------------------------


def _error(status: int, code: str, detail: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail, "error": code}, status_code=status, headers=headers)


def _install_error_handlers(app: FastAPI) -> None:
    async def domain_error(request: Request, error: Exception) -> JSONResponse:
        status, code = status_of(error)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if status == 503:
            headers = {"Retry-After": "5"}
        return _error(status, code, str(error), headers)

    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        return _error(422, "invalid_request", describe_validation_errors(error.errors()))

    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return _error(error.status_code, "http_error", str(error.detail), error.headers)

    async def unexpected_error(request: Request, error: Exception) -> JSONResponse:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=error)
        return _error(500, "internal_error", "internal error; it has been logged")

    for error_type in HANDLED_ERRORS:
        app.add_exception_handler(error_type, domain_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected_error)


def describe_validation_errors(errors: list[dict]) -> str:
    """One readable line per pydantic error, e.g. "k: Input should be greater than or equal
    to 1"; the input itself is not echoed (it may be huge)."""
    lines = []
    for error in errors:
        location = [str(part) for part in error.get("loc", ()) if part not in ("body", "form")]
        where = ".".join(location) or "body"
        lines.append(f"{where}: {error.get('msg', 'invalid value')}")
    return "; ".join(lines) or "invalid request"


# ----- middleware --------------------------------------------------------------------------


class BodySizeLimitMiddleware:
    """413 for request bodies over `max_bytes`, by Content-Length or while streaming."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        if declared is not None:
            await self.app(scope, receive, send)
            return
        messages, size = [], 0  # chunked: buffer up to the limit, then replay
        while True:
            message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        await self.app(scope, _replay(messages, receive), send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = _error(
            413,
            "payload_too_large",
            f"request body exceeds {self.max_bytes} bytes; send a smaller image "
            "(the limit is the max_image_bytes setting)",
        )
        await response(scope, receive, send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


class RequestMetricsMiddleware:
    """Counts requests and observes latency per endpoint (known paths only, to bound labels)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics, paths: set[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = scope["path"] if scope["path"] in self.paths else "other"
        status = 500
        start = time.perf_counter()

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            self.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()
            self.metrics.request_latency.labels(endpoint=endpoint).observe(
                time.perf_counter() - start
            )
