"""FastAPI dependencies: the long-lived services on app.state and API keys (the JSON search
bodies are read by service.http.schemas).

Every dependency is `async def` although none awaits: FastAPI runs a plain `def` dependency in
its thread pool, and those hand-offs cost more than the search's own arithmetic on a small
gallery."""

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from models.settings import Settings
from service.errors import (
    AuthenticationError,
    IndexUnavailableError,
    TooManyFailedAttemptsError,
)
from service.http.auth_limit import FailedAuthLimiter
from service.services import Services


async def get_services(request: Request) -> Services:
    """The app's services; 503 while the app is still starting."""
    services = getattr(request.app.state, "services", None)
    if services is None:
        raise IndexUnavailableError("the service is starting; retry in a few seconds")
    return services


async def get_settings(request: Request) -> Settings:
    """The app's settings."""
    return request.app.state.settings


ServicesDep = Annotated[Services, Depends(get_services)]
SettingsDep = Annotated[Settings, Depends(get_settings)]

_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False)
_bearer = HTTPBearer(auto_error=False)


def _key_matches(provided: str | None, settings: Settings) -> bool:
    """Constant-time comparison of `provided` against every configured key."""
    if not provided:
        return False
    given = provided.encode()
    matches = [
        hmac.compare_digest(given, key.get_secret_value().encode()) for key in settings.api_keys
    ]
    return any(matches)


def _check_key(settings: Settings, header: str | None, bearer: HTTPAuthorizationCredentials | None):
    provided = header or (bearer.credentials if bearer is not None else None)
    if not settings.api_keys:
        raise AuthenticationError(
            "this endpoint needs an API key, and none is configured: set PROBSEARCH_API_KEYS"
        )
    if not provided:
        raise AuthenticationError("missing API key: send it as X-API-Key or Authorization: Bearer")
    if not _key_matches(provided, settings):
        raise AuthenticationError("invalid API key")


async def require_admin_key(
    request: Request,
    settings: SettingsDep,
    header: Annotated[str | None, Depends(_api_key_header)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """/admin/*: always requires a valid API key; failed attempts are rate limited."""
    provided = header or (bearer.credentials if bearer is not None else None)
    _authenticate_admin(request, settings, provided)


def _authenticate_admin(request: Request, settings: Settings, provided: str | None) -> None:
    """Check an admin key against the configured ones, through the failed-attempt limiter
    (429 while locked out; a wrong key is charged to its client and to itself, then 401)."""
    limiter: FailedAuthLimiter = request.app.state.auth_limiter
    client = request.client.host if request.client is not None else None
    identities = limiter.identities(client, provided)
    retry_after_s = limiter.retry_after_s(identities)
    if retry_after_s is not None:
        raise TooManyFailedAttemptsError(
            f"too many failed API key attempts; retry in {retry_after_s} s",
            retry_after_s,
        )
    try:
        _check_key(settings, provided, None)
    except AuthenticationError:
        limiter.failed(identities)
        raise


async def admin_key_presented(request: Request, settings: SettingsDep) -> bool:
    """Endpoints open to all that show more to an admin (GET /v1/indexes): False when the
    request carries no key; True for a valid admin key; a wrong key is refused (401, 429)
    and counted like one sent to /admin/*, so the endpoint is no way around the limiter.
    Read from the headers directly, so the OpenAPI schema keeps the endpoint open."""
    provided = request.headers.get("x-api-key")
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if not provided and scheme.lower() == "bearer":
        provided = credentials.strip()
    if not provided:
        return False
    _authenticate_admin(request, settings, provided)
    return True


async def require_search_key(
    settings: SettingsDep,
    header: Annotated[str | None, Depends(_api_key_header)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """/search/*: requires a valid API key only when require_api_key_for_search is set."""
    if settings.require_api_key_for_search:
        _check_key(settings, header, bearer)


SearchAuth = Depends(require_search_key)
AdminAuth = Depends(require_admin_key)
AdminView = Annotated[bool, Depends(admin_key_presented)]
