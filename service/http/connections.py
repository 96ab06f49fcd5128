"""Bounded connections: uvicorn's HTTP protocol with a header deadline and a connection cap.

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
