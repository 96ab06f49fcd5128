"""Admin endpoints (always behind an API key)."""

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Query

from service.http.deps import AdminAuth, ServicesDep
from service.http.schemas import (
    ADMIN_ERROR_RESPONSES,
    ERROR_RESPONSES,
    CompactResponse,
    ReloadResponse,
)

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminAuth])


@router.post(
    "/reload", response_model=ReloadResponse, responses={**ERROR_RESPONSES, **ADMIN_ERROR_RESPONSES}
)
async def reload_indexes(services: ServicesDep) -> ReloadResponse:
    """Re-read the active version of every gallery now and swap in those that changed."""
    active = await asyncio.to_thread(services.holder.refresh)
    return ReloadResponse(active=active)


@router.post(
    "/compact",
    response_model=CompactResponse,
    responses={**ERROR_RESPONSES, **ADMIN_ERROR_RESPONSES},
)
async def compact(
    services: ServicesDep,
    gallery: Annotated[Literal["image", "text"], Query(description="The gallery to compact.")],
) -> CompactResponse:
    """Fold the gallery's added and deleted items into a new version (re-encoding nothing),
    activate it and serve it; writes made meanwhile are kept. Searches go on throughout."""
    result = await services.compactor.run(gallery)
    return CompactResponse(gallery=gallery, **{k: v for k, v in result.items() if k != "gallery"})
