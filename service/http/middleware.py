"""ASGI middleware of the app: request body deadline, body size limit, request metrics."""

import asyncio
import logging
import time

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import ServiceMetrics
from service.outage_log import OutageLog

log = logging.getLogger(__name__)


def error_response(
    status: int, code: str, detail: str, headers: dict | None = None
) -> JSONResponse:
    """The body of every error answer: {"detail": ..., "error": ...}."""
    return JSONResponse({"detail": detail, "error": code}, status_code=status, headers=headers)


class BodyReadTimeoutError(HTTPException):
    """The client did not send its whole body in time (408; the connection is closed)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            408,
            f"the request body did not arrive within {timeout_s:g} s (a Content-Length larger "
            "than the body sent?); send the whole body at once",
            headers={"Connection": "close"},
        )


class BodyReadTimeoutMiddleware:
    """Gives every request `timeout_s` from its headers to the end of its body.

    uvicorn has no body timeout: a client that declares a Content-Length and sends less would
    hold its connection (and the request's task) forever. Past the deadline, reading the body
    raises BodyReadTimeoutError, answered 408 with `Connection: close`, so uvicorn closes the
    connection. Reads after the body is complete (disconnect listeners) are not limited.
    """

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        body_done = False
        started = False

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyReadTimeoutError(self.timeout_s) from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, timed_receive, tracked_send)
        except BodyReadTimeoutError as error:
            if started:
                raise
            response = error_response(408, "body_timeout", str(error.detail), error.headers)
            await response(scope, receive, send)


class BodySizeLimitMiddleware:
    """413 for request bodies over their route's limit, by Content-Length or while streaming:
    `max_bytes` on the routes that take an image (`large_paths`), `max_json_bytes` on every
    other. A JSON route's largest valid body is a few hundred KB (three vectors of
    max_embedding_dim numbers), so a multi-megabyte one is refused before it is read, and
    never parsed on the event loop."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, max_json_bytes: int, large_paths: frozenset[str]
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_json_bytes = max_json_bytes
        self.large_paths = large_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        image_route = scope.get("path") in self.large_paths
        limit = self.max_bytes if image_route else self.max_json_bytes
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._too_large(scope, receive, send, limit, image_route)
            return
        if declared is not None:
            await self.app(scope, receive, send)
            return
        messages, size = [], 0  # chunked: buffer up to the limit, then replay
        while True:
            message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if size > limit:
                await self._too_large(scope, receive, send, limit, image_route)
                return
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        await self.app(scope, _replay(messages, receive), send)

    @staticmethod
    async def _too_large(
        scope: Scope, receive: Receive, send: Send, limit: int, image_route: bool
    ) -> None:
        hint = (
            "send a smaller image (the limit is the max_image_bytes setting)"
            if image_route
            else "this route takes JSON up to the max_json_bytes setting"
        )
        response = error_response(
            413, "payload_too_large", f"request body exceeds {limit} bytes; {hint}"
        )
        await response(scope, receive, send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


# The status a request is counted under when its client disconnects before sending its whole
# body (nginx's "client closed request"); no response is sent.
CLIENT_CLOSED_REQUEST = 499


class RequestMetricsMiddleware:
    """Counts requests and observes latency per endpoint (known paths only, to bound labels);
    a client that disconnects mid-body is counted under CLIENT_CLOSED_REQUEST."""

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
        except ClientDisconnect:
            # The client left before its body arrived: nobody to answer and nothing wrong
            # with the service, so no traceback and no 500 (anyone could drive the 5xx alert).
            status = CLIENT_CLOSED_REQUEST
            log.debug(
                "%s %s: the client disconnected before sending its body",
                scope.get("method"),
                scope["path"],
            )
        finally:
            self.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()
            self.metrics.request_latency.labels(endpoint=endpoint).observe(
                time.perf_counter() - start
            )


class UnhandledErrorMiddleware:
    """A 500 for an exception no handler took, logged once per outage (OutageLog) and not
    raised further. Starlette's last-resort handler answers too, but then re-raises, and uvicorn
    logs a traceback per request: one broken backend wrote a traceback for every search.
    Added first, so it is the innermost middleware and the metrics count the 500."""

    def __init__(self, app: ASGIApp, outage: OutageLog) -> None:
        self.app = app
        self.outage = outage

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:  # nobody to answer: RequestMetricsMiddleware counts a 499
            raise
        except Exception as error:  # the last resort: whatever it is, log it once
            self.outage.failed(error)
            if not started:
                response = error_response(
                    500, "internal_error", "internal error; it has been logged"
                )
                await response(scope, receive, send)
