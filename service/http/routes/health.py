"""Liveness, readiness, Prometheus metrics and the list of loaded indexes."""

import dataclasses
from pathlib import PurePath

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from indexer.active_record import ActiveRecord
from indexer.calibration_inheritance import uncalibrated_metrics
from service.http.deps import AdminView, ServicesDep
from service.http.schemas import (
    ADMIN_ERROR_RESPONSES,
    ERROR_RESPONSES,
    ActiveStores,
    IndexesResponse,
    IndexInfo,
    ReadinessResponse,
)
from service.index_holder import IndexHolder, calibration_warning
from service.metrics import CONTENT_TYPE_LATEST

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """200 while the process serves HTTP (liveness)."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=ReadinessResponse,
    responses={503: {"model": ReadinessResponse, "description": "Not ready yet."}},
)
async def readyz(request: Request) -> JSONResponse:
    """200 only when every served gallery has a loaded index (readiness)."""
    services = request.app.state.services
    if services is None:
        body = ReadinessResponse(ready=False, versions={}, detail="starting: loading the model")
        return JSONResponse(body.model_dump(), status_code=503)
    versions = services.holder.versions()
    active = await run_in_threadpool(_active_stores, services.holder)
    missing = [gallery for gallery, version in versions.items() if version is None]
    if missing:
        detail = f"no index loaded for: {', '.join(missing)} (activate one with probsearch reindex)"
        return _readiness(False, versions, detail, active)
    problems = await run_in_threadpool(services.holder.shortlist_problems)
    if problems:
        return _readiness(False, versions, "shortlist unavailable: " + "; ".join(problems), active)
    warnings = [w for w in map(calibration_warning, services.holder.loaded()) if w]
    warnings += [f"{m}: {s.disagreement}" for m, s in active.items() if s.disagreement]
    detail = "; ".join(["ready", *(f"warning: {w}" for w in warnings)])
    return _readiness(True, versions, detail, active)


def _readiness(
    ready: bool, versions: dict[str, str | None], detail: str, active: dict[str, ActiveStores]
) -> JSONResponse:
    body = ReadinessResponse(ready=ready, versions=versions, detail=detail, active=active)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


def _active_stores(holder: IndexHolder) -> dict[str, ActiveStores]:
    def show(record: ActiveRecord | None) -> str | None:
        return None if record is None else f"{record.version} (generation {record.generation})"

    try:
        sides = holder.active_sides()
    except (ValueError, OSError) as error:
        return {"?": ActiveStores(file=None, redis=None, disagreement=f"unreadable: {error}")}
    return {
        modality: ActiveStores(
            file=show(s.file), redis=show(s.redis), disagreement=s.disagreement()
        )
        for modality, s in sides.items()
    }


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus text exposition of the service's metrics."""
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


# Manifest fields that name the server's own files or the model's exact build: shown to a
# request with an admin key only (`source` is cut to its last path component without one).
PRIVATE_MANIFEST_FIELDS = ("model_hash", "image_root")


@router.get(
    "/v1/indexes",
    response_model=IndexesResponse,
    responses={**ERROR_RESPONSES, **ADMIN_ERROR_RESPONSES},
)
async def list_indexes(services: ServicesDep, admin: AdminView) -> IndexesResponse:
    """The index version served for each gallery, with its manifest. Without an API key the
    manifest's `source` is only its last path component, and `model_hash` and `image_root`
    are left out; a valid admin key (X-API-Key or Authorization: Bearer) shows them, and a
    wrong one is refused (401) and counted like one sent to /admin/*."""
    indexes = []
    for loaded in services.holder.loaded():
        manifest = loaded.index.manifest
        shown = dataclasses.asdict(manifest)
        if not admin:
            shown = {k: v for k, v in shown.items() if k not in PRIVATE_MANIFEST_FIELDS}
            shown["source"] = PurePath(manifest.source).name
        indexes.append(
            IndexInfo(
                modality=loaded.modality,
                version=loaded.version,
                count=manifest.count,
                dim=manifest.dim,
                metrics=list(manifest.metrics),
                uncalibrated_metrics=uncalibrated_metrics(manifest),
                calibration_warning=calibration_warning(loaded) or None,
                manifest=shown,
            )
        )
    return IndexesResponse(indexes=indexes, model=services.model_name)
