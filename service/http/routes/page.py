"""GET / (the search page), its static files, and GET /v1/config that the page reads."""

import asyncio
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

from service.http.deps import ServicesDep
from service.http.page_config import ServiceConfig, service_config
from service.http.schemas import ERROR_RESPONSES

router = APIRouter(tags=["page"])

STATIC_PACKAGE = ("service.http", "static")

# Everything the page loads comes from this service: the browser refuses any other origin.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' blob:; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def page_html() -> str:
    """The page's HTML, shipped inside the package."""
    package, folder = STATIC_PACKAGE
    return (resources.files(package) / folder / "index.html").read_text(encoding="utf-8")


def static_files() -> StaticFiles:
    """The page's CSS, JavaScript and icon (mounted at /static)."""
    return StaticFiles(packages=[STATIC_PACKAGE])


@router.get("/", response_class=HTMLResponse, summary="The search page")
async def search_page() -> HTMLResponse:
    """A page to search by caption or image and see how sure the service is of each answer."""
    return HTMLResponse(page_html(), headers=PAGE_HEADERS)


@router.get("/v1/config", response_model=ServiceConfig, responses=ERROR_RESPONSES)
async def config(request: Request, services: ServicesDep) -> ServiceConfig:
    """Defaults and limits of the search API, the metrics served, and for each gallery its
    active version and the range of its items' log-det (what the page's bars are scaled to)."""
    return await asyncio.to_thread(service_config, services, request.app.state.gallery_stats)
