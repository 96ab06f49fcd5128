"""What every request passes through before a route sees it: the connection (a header
deadline and a connection cap, in uvicorn's HTTP protocol), then the ASGI middleware (request
body deadline, body size limit, request metrics, unhandled errors).

Bounded connections: uvicorn's HTTP protocol with a header deadline and a connection cap.

uvicorn times out an idle keep-alive connection only after a response: a connection that
never sends a request, or sends its headers one line every few seconds, was held for ever,
and 1,100 of them exhausted a 1,024 file-descriptor limit (the service then failed reading its
own ACTIVE file). `BoundedHttpToolsProtocol` closes a connection whose request headers are not
complete `timeout_keep_alive` seconds after it opened or after the last byte of a previous
request arrived. At the cap (`limit_concurrency`, Settings.connection_cap, below the descriptor
limit, so the service's own files always have descriptors) a new connection first evicts the
oldest connections that never completed a request's headers: 2,000 idle connections otherwise
filled the cap for the whole header deadline, and since uvicorn answers every request 503 while
the connections reach the cap, a well-behaved client's keep-alive connection failed with them.
Only when no such connection is left is the new one answered 503 and closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from models.settings import Settings
from service.metrics import ServiceMetrics
from service.outage_log import OutageLog

log = logging.getLogger(__name__)


# The connection

_BODY = json.dumps(
    {
        "detail": "the server has as many connections open as it allows; retry shortly",
        "error": "too_many_connections",
    }
).encode()
TOO_MANY_CONNECTIONS = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: " + str(len(_BODY)).encode()
    + b"\r\n\r\n" + _BODY
)  # fmt: skip


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with a header deadline and a cap on open connections (see the module
    docstring); both read uvicorn's own settings, so the class travels to worker processes."""

    _header_timer: asyncio.TimerHandle | None = None
    _opened: float = 0.0
    _requests: int = 0  # requests whose headers completed on this connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened = self.loop.time()
        cap = self.limit_concurrency
        # uvicorn answers 503 to any request while len(connections) >= cap: keep one below it
        if cap is not None and len(self.connections) >= cap and not self._evict(cap - 1):
            transport.write(TOO_MANY_CONNECTIONS)
            transport.close()
            return
        self._arm_header_timer()

    def _evict(self, keep: int) -> bool:
        """Close the oldest connections that never completed a request's headers until at most
        `keep` are open; whether that was possible."""
        idle = sorted(
            (c for c in self.connections
             if c is not self and isinstance(c, BoundedHttpToolsProtocol) and c._requests == 0),
            key=lambda c: c._opened,
        )  # fmt: skip
        excess = len(self.connections) - keep
        if len(idle) < excess:
            return False
        for victim in idle[:excess]:
            self.connections.discard(victim)
            victim._cancel_header_timer()
            victim.transport.close()
        return True

    def data_received(self, data: bytes) -> None:
        if self.cycle is None or self.cycle.response_complete:
            self._arm_header_timer()  # bytes of a new request: its headers have a deadline
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        self._requests += 1
        previous = self.cycle
        super().on_headers_complete()
        if self.cycle is not None and self.cycle is not previous:  # not an upgrade
            self.cycle.transport = HeadWithBody(self.transport, self.loop)  # before its task runs

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.timeout_keep_alive, self._too_slow)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


class HeadWithBody:
    """A response's transport that sends its head together with the body's first bytes.

    uvicorn writes a response's status line and headers, then its body, in two writes, and each
    is a send() of its own: two system calls and two TCP segments for the client to wake up
    for, where a JSON answer fits in one. The head is held until the next write, or until the
    loop's next turn when none comes in this one (a HEAD request, a 204), and before a close.
    Everything else is the connection's transport."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._held: bytes | None = None
        self._first = True

    def write(self, data: bytes) -> None:
        if self._first:  # the head (or a 100 Continue, which the next turn sends)
            self._first, self._held = False, data
            self._loop.call_soon(self.flush)
            return
        held, self._held = self._held, None
        self._transport.write(data if held is None else held + data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for the service: its timeouts, forwarded headers, and the bounded
    protocol with the connection cap."""
    return settings.uvicorn_options() | {
        "http": BoundedHttpToolsProtocol,
        "limit_concurrency": settings.connection_cap,
    }


# The ASGI middleware


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
