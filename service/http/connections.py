"""Bounded connections: uvicorn's HTTP protocol with a header deadline and a connection cap.

uvicorn times out an idle keep-alive connection only after a response: a connection that
never sends a request, or sends its headers one line every few seconds, was held for ever,
and 1,100 of them exhausted a 1,024 file-descriptor limit (the service then failed reading its
own ACTIVE file). `BoundedHttpToolsProtocol` closes a connection whose request headers are not
complete `timeout_keep_alive` seconds after it opened or after the last byte of a previous
request arrived, and answers a connection past `limit_concurrency` open ones with 503 and
closes it at once, so the cap (Settings.connection_cap, below the descriptor limit) always
leaves descriptors for the service's own files.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from models.settings import Settings

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

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        cap = self.limit_concurrency
        if cap is not None and len(self.connections) > cap:
            transport.write(TOO_MANY_CONNECTIONS)
            transport.close()
            return
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self.cycle is None or self.cycle.response_complete:
            self._arm_header_timer()  # bytes of a new request: its headers have a deadline
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        super().on_headers_complete()

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


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for the service: its timeouts, forwarded headers, and the bounded
    protocol with the connection cap."""
    return settings.uvicorn_options() | {
        "http": BoundedHttpToolsProtocol,
        "limit_concurrency": settings.connection_cap,
    }
