"""The FastAPI app factory: long-lived services built in the lifespan, errors mapped at the edge."""

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from indexer.shortlist_backends import make_backend
from indexer.store import IndexVersion
from indexer.threads import apply_thread_budget
from models.networks.model_config import ModelConfig, model_fingerprint
from models.onnx.encoder_runtime import OnnxEncoder
from models.scoring.known_words import KnownWords
from models.scoring.rerank import compute_device
from models.settings import Settings
from models.threads import concurrent_batches, thread_budget
from service.batching import MicroBatcher
from service.cache import ResultCache
from service.compactor import Compactor
from service.errors import HANDLED_ERRORS, TooManyFailedAttemptsError, status_of
from service.gallery_stats import GalleryStats
from service.http.auth_limit import FailedAuthLimiter
from service.http.deps import SearchAuth
from service.http.openapi_limits import install_openapi_limits
from service.http.routes import admin, health, items, page, search
from service.http.routes.docs import install_docs
from service.http.schemas import AUTH_ERROR_RESPONSES
from service.http.transport import (
    BodyReadTimeoutError,
    BodyReadTimeoutMiddleware,
    BodySizeLimitMiddleware,
    RequestMetricsMiddleware,
    UnhandledErrorMiddleware,
    error_response,
)
from service.image_decode import (
    ImageDecoder,
    default_concurrent_decodes,
    default_pixel_limit,
)
from service.index_holder import IndexHolder
from service.metrics import ServiceMetrics
from service.outage_log import OutageLog
from service.redis_health import RedisHealth
from service.searcher import GALLERY_OF_KIND, KIND_OF_GALLERY, Searcher
from service.services import Services

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; models and indexes are loaded when it starts (lifespan), not here.
    Without `settings`: from PROBSEARCH_*; an index root or model dir configured nowhere is
    ./indexes or ./model (Settings.with_default_paths)."""
    settings = (settings if settings is not None else Settings()).with_default_paths()
    app = FastAPI(
        title="probsearch",
        summary="Uncertainty-aware image <-> text retrieval with Gaussian embeddings.",
        version="0.1.0",
        lifespan=_lifespan,
        docs_url=None,  # FastAPI's pages load Swagger UI and ReDoc from a CDN: install_docs
        redoc_url=None,  # serves /docs from local files, and no /redoc
    )
    app.state.settings = settings
    app.state.metrics = ServiceMetrics()
    app.state.services = None
    app.state.gallery_stats = GalleryStats()
    app.state.auth_limiter = FailedAuthLimiter(
        settings.admin_auth_max_failures, settings.admin_auth_window_s
    )
    _include_routers(app, settings)
    app.mount("/static", page.static_files(), name="static")
    install_docs(app)
    install_openapi_limits(app, settings)
    unhandled = OutageLog(log, "requests")  # one traceback per outage, not per request
    _install_error_handlers(app, unhandled)
    app.add_middleware(UnhandledErrorMiddleware, outage=unhandled)
    app.add_middleware(
        RequestMetricsMiddleware, metrics=app.state.metrics, paths=set(app.openapi()["paths"])
    )
    app.add_middleware(
        BodySizeLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        max_json_bytes=settings.max_json_bytes,
        large_paths=search.IMAGE_PATHS | items.IMAGE_PATHS,
    )
    app.add_middleware(BodyReadTimeoutMiddleware, timeout_s=settings.request_body_timeout_s)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Content-Type", "X-API-Key", "Authorization"],
        )
    return app


def _include_routers(app: FastAPI, settings: Settings) -> None:
    """Search endpoints carry the API key dependency (and so declare its security scheme and
    401 in the schema) only when require_api_key_for_search is set; admin ones always do."""
    if settings.require_api_key_for_search:
        app.include_router(search.router, dependencies=[SearchAuth], responses=AUTH_ERROR_RESPONSES)
    else:
        log.info("search endpoints are open: no API key needed (require_api_key_for_search)")
        app.include_router(search.router)
    for router in (health.router, admin.router, items.router, items.writes, page.router):
        app.include_router(router)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    services = await asyncio.to_thread(build_services, settings, app.state.metrics)
    await services.batcher.start()
    await services.image_batcher.start()
    freeze_startup_heap()
    app.state.services = services
    try:
        yield
    finally:
        app.state.services = None
        await services.batcher.stop()
        await services.image_batcher.stop()
        await services.cache.close()
        await asyncio.to_thread(services.holder.stop)
        await asyncio.to_thread(services.decoder.close)
        if services.redis_health is not None:
            await asyncio.to_thread(services.redis_health.stop)
        app.state.metrics.close()


def freeze_startup_heap() -> None:
    """Move every object alive after start-up out of the garbage collector's reach.

    The loaded model, indexes and libraries leave about 230 000 tracked objects, and a full
    collection walked them all: 100 ms on the demo, on the event loop, at whatever request it
    fell on (an open-loop run at 100 QPS had a p99 of 106 ms against a p95 of 8.5 ms). Frozen,
    they are skipped; what requests allocate is still collected."""
    gc.collect()
    gc.freeze()


def build_services(settings: Settings, metrics: ServiceMetrics) -> Services:
    """Load the encoders, open the active indexes and start watching for activations."""
    config = ModelConfig.load(settings.model)
    threads = apply_thread_budget(thread_budget("serve", settings.threads, settings.workers))
    log.info("thread budget: %d per pool (torch, ONNX Runtime, FAISS)", threads.intra_op)
    encoders = {}
    for gallery in settings.galleries:
        kind = KIND_OF_GALLERY[gallery]
        encoders[kind] = OnnxEncoder(settings.model, kind, device=settings.device, threads=threads)
        metrics.onnx_provider.labels(encoder=kind, provider=encoders[kind].provider).set(1)
        if config.pretrained:  # backbone vectors sent to /search/embedding
            encoders[f"vector-{kind}"] = OnnxEncoder(
                settings.model, kind, device=settings.device, threads=threads, heads_only=True
            )
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
        backend=make_backend(settings.shortlist_backend, settings.milvus_uri, settings.device),
        namespace=settings.namespace,
    )
    holder.start()
    searcher = Searcher(
        holder,
        encoders,
        default_metrics={g: config.default_metric(g) for g in GALLERY_OF_KIND.values()},
        settings=settings,
        model_name=config.name,
        device=compute_device(settings.device),
        known_words=KnownWords.load(settings.model),
    )
    # Image queries have a batcher (and worker thread) of their own: encoding a batch of
    # images with MC draws takes far longer than a caption, and text queries must not queue
    # behind it.
    batcher, image_batcher = (
        MicroBatcher(
            searcher.search_batch,
            max_size=settings.batch_max_size,
            max_wait_s=settings.batch_max_wait_ms / 1000,
            on_batch=metrics.batch_size.observe,
            name=name,
            thread_initializer=lambda: apply_thread_budget(threads),  # OpenMP's count is per thread
            # A lone caption or embedding query is quick enough to run on the event loop; an
            # image query with MC draws is not (it would hold up every other request).
            inline_when_alone=settings.batch_inline_when_alone and name == "search-batcher",
            concurrency=settings.batch_concurrency or concurrent_batches(threads, settings.workers),
        )
        for name in ("search-batcher", "image-batcher")
    )
    cache = ResultCache(
        settings.redis_url,
        settings.cache_ttl_s,
        metrics,
        settings.redis_socket_timeout_s,
        settings.redis_backoff_max_s,
        settings.cache_write_delay_ms / 1000,
    )
    health = _start_redis_health(settings, metrics, [cache.recover, holder.recover])
    max_pixels = settings.max_image_pixels or default_pixel_limit(config.image_size)
    concurrent = settings.max_concurrent_decodes or default_concurrent_decodes()
    decoder = ImageDecoder(config.image_size, max_pixels, concurrent, settings.decode_nice)
    return Services(
        settings, metrics, holder, encoders, searcher, batcher, cache, config.name,
        decoder=decoder, image_batcher=image_batcher, compactor=Compactor(holder, settings),
        redis_health=health,
    )  # fmt: skip


def _start_redis_health(
    settings: Settings, metrics: ServiceMetrics, on_recovery: list
) -> RedisHealth | None:
    if settings.redis_url is None:
        return None
    health = RedisHealth(
        settings.redis_url,
        metrics,
        socket_timeout_s=settings.redis_socket_timeout_s,
        backoff_max_s=settings.redis_backoff_max_s,
        interval_s=settings.redis_health_interval_s,
    )
    for callback in on_recovery:
        health.on_recovery(callback)
    health.start()
    return health


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


def _install_error_handlers(app: FastAPI, unhandled: OutageLog) -> None:
    async def domain_error(request: Request, error: Exception) -> JSONResponse:
        status, code = status_of(error)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if status == 503:
            headers = {"Retry-After": "5"}
        if isinstance(error, TooManyFailedAttemptsError):
            headers = {"Retry-After": str(error.retry_after_s)}
        return error_response(status, code, str(error), headers)

    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid_request", describe_validation_errors(error.errors()))

    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        code, detail = "http_error", str(error.detail)
        if isinstance(error, BodyReadTimeoutError):
            code = "body_timeout"
        elif isinstance(error.__cause__, UnicodeDecodeError):
            code = "invalid_encoding"
            detail = "the request body is not valid UTF-8: send JSON text encoded as UTF-8"
        return error_response(error.status_code, code, detail, error.headers)

    async def unexpected_error(request: Request, error: Exception) -> JSONResponse:
        unhandled.failed(error)
        return error_response(500, "internal_error", "internal error; it has been logged")

    for error_type in HANDLED_ERRORS:
        app.add_exception_handler(error_type, domain_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected_error)


MAX_ERRORS_LISTED = 5


def describe_validation_errors(errors: list[dict]) -> str:
    """One readable line per pydantic error, e.g. "k: Input should be greater than or equal
    to 1"; the input itself is not echoed (it may be huge), and the same error at many list
    positions (mu.0, mu.1, ...) is reported once with a count."""
    groups: dict[tuple[str, str], list[str]] = {}
    for error in errors:
        location = [str(part) for part in error.get("loc", ()) if part not in ("body", "form")]
        field = ".".join(part for part in location if not part.isdigit())
        groups.setdefault((field, error.get("msg", "invalid value")), []).append(
            ".".join(location) or "body"
        )
    lines = []
    for (_, message), places in list(groups.items())[:MAX_ERRORS_LISTED]:
        more = f" (and {len(places) - 1} more like it)" if len(places) > 1 else ""
        lines.append(f"{places[0]}: {message}{more}")
    if len(groups) > MAX_ERRORS_LISTED:
        lines.append(f"and {len(groups) - MAX_ERRORS_LISTED} more errors")
    return "; ".join(lines) or "invalid request"
