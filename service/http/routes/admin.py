"""Admin endpoints (always behind an API key)."""

import asyncio

from fastapi import APIRouter

from service.http.deps import AdminAuth, ServicesDep
from service.http.schemas import ADMIN_ERROR_RESPONSES, ERROR_RESPONSES, ReloadResponse

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminAuth])


@router.post(
    "/reload", response_model=ReloadResponse, responses={**ERROR_RESPONSES, **ADMIN_ERROR_RESPONSES}
)
async def reload_indexes(services: ServicesDep) -> ReloadResponse:
    """Re-read the active version of every gallery now and swap in those that changed."""
    active = await asyncio.to_thread(services.holder.refresh)
    return ReloadResponse(active=active)
