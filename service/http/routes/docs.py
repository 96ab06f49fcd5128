"""GET /docs: Swagger UI with every file served by this service.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so /docs was a blank page on a machine
without internet access. Swagger UI's files come from the fastapi-offline package (PyPI; Swagger
UI 5); only its static folder is used, mounted at DOCS_ASSETS. There is no /redoc: ReDoc's
bundle still fetches its logo from cdn.redoc.ly, and /docs already renders the same schema."""

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

DOCS_ASSETS = "/docs/assets"  # swagger-ui-bundle.js, swagger-ui.css
ASSETS_PACKAGE = ("fastapi_offline", "static")
FAVICON = "/static/favicon.svg"  # the search page's icon

router = APIRouter(include_in_schema=False)


def install_docs(app: FastAPI) -> None:
    """Serve /docs from local files; `app` must be built with docs_url=None and redoc_url=None
    (FastAPI's CDN pages)."""
    app.mount(DOCS_ASSETS, StaticFiles(packages=[ASSETS_PACKAGE]), name="docs-assets")
    app.include_router(router)


def _root(request: Request) -> str:
    return request.scope.get("root_path", "")


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root, app = _root(request), request.app
    return get_swagger_ui_html(
        openapi_url=f"{root}{app.openapi_url}",
        title=f"{app.title} - API",
        oauth2_redirect_url=f"{root}/docs/oauth2-redirect",
        swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{root}{FAVICON}",
        # No badge from the online validator (validator.swagger.io): nothing leaves the service.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get("/docs/oauth2-redirect")
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()
