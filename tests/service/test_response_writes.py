"""A response's head and body leave in one write of the connection's transport (HeadWithBody),
on real sockets: a head alone still leaves on the loop's next turn, a close sends what is held
first, and through the real uvicorn server a search's answer is one write."""

import asyncio
import json
import socket
from typing import Any
from urllib.parse import urlparse

import pytest

from service.http import transport as transport_module
from service.http.transport import HeadWithBody
from tests.service.conftest import ServerThread

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n"


class CountedTransport:
    """A real transport whose writes are counted on their way through."""

    def __init__(self, transport: Any) -> None:
        self.transport, self.writes = transport, 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


async def _socket_pair() -> tuple[CountedTransport, socket.socket]:
    ours, theirs = socket.socketpair()
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(asyncio.Protocol, ours)
    theirs.settimeout(5)
    return CountedTransport(transport), theirs


def _read(peer: socket.socket, size: int) -> bytes:
    received = b""
    while len(received) < size and (chunk := peer.recv(65536)):
        received += chunk
    return received


def test_the_head_leaves_with_the_body_in_one_write() -> None:
    async def scenario() -> tuple[int, int, bytes]:
        counted, peer = await _socket_pair()
        response = HeadWithBody(counted, asyncio.get_running_loop())
        response.write(HEAD)
        held = counted.writes
        response.write(b"body")
        await asyncio.sleep(0)  # the flush scheduled for the head finds nothing left
        writes = counted.writes
        counted.close()
        return held, writes, _read(peer, len(HEAD) + 4)

    held, writes, received = asyncio.run(scenario())
    assert (held, writes, received) == (0, 1, HEAD + b"body")


def test_a_head_without_a_body_leaves_on_the_next_turn() -> None:
    async def scenario() -> tuple[int, int, bytes]:
        counted, peer = await _socket_pair()
        HeadWithBody(counted, asyncio.get_running_loop()).write(HEAD)
        before = counted.writes
        await asyncio.sleep(0)
        after = counted.writes
        counted.close()
        return before, after, _read(peer, len(HEAD))

    assert asyncio.run(scenario()) == (0, 1, HEAD)


def test_a_close_sends_the_held_head_first() -> None:
    async def scenario() -> bytes:
        counted, peer = await _socket_pair()
        response = HeadWithBody(counted, asyncio.get_running_loop())
        response.write(HEAD)
        response.close()
        await asyncio.sleep(0.05)
        return _read(peer, 1 << 20)  # until the close

    assert asyncio.run(scenario()) == HEAD


def test_a_search_answer_is_one_write_through_uvicorn(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted: list[CountedTransport] = []

    def counting(transport: Any, loop: asyncio.AbstractEventLoop) -> HeadWithBody:
        counted.append(CountedTransport(transport))
        return HeadWithBody(counted[-1], loop)

    monkeypatch.setattr(transport_module, "HeadWithBody", counting)
    address = urlparse(server.url)
    body = json.dumps({"text": "a red circle", "k": 3}).encode()
    request = (
        f"POST /search/text HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    with socket.create_connection((address.hostname, address.port), timeout=30) as conn:
        conn.sendall(request)
        received = _read(conn, 1 << 30)
    head, _, answer = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert "results" in json.loads(answer)
    assert [c.writes for c in counted] == [1]
