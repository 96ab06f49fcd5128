"""Slow or lying clients cannot hold a connection: body deadline and keep-alive limit."""

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

from tests.service.conftest import Artifacts, ServerThread, make_settings

BODY_TIMEOUT_S = 1.0
KEEP_ALIVE_S = 1.0
BOUNDARY = "b0undary"
MULTIPART_START = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="f"'
                   '\r\nContent-Type: image/png\r\n\r\n').encode() + b"\x89PNG"  # fmt: skip


@pytest.fixture(scope="module")
def strict_server(artifacts: Artifacts) -> Iterator[ServerThread]:
    settings = make_settings(
        artifacts, request_body_timeout_s=BODY_TIMEOUT_S, keep_alive_timeout_s=KEEP_ALIVE_S
    )
    with ServerThread(settings) as running:
        yield running


def connect(server: ServerThread) -> socket.socket:
    address = urlparse(server.url)
    return socket.create_connection((address.hostname, address.port), timeout=10)


def read_until_closed(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (10 s at most)."""
    received = b""
    while chunk := conn.recv(65536):
        received += chunk
    return received


def lying_request(path: str, content_type: str, declared: int, sent: bytes) -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {declared}\r\n\r\n")  # fmt: skip
    return head.encode() + sent


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/search/text", "application/json"),
        ("/search/image", "application/json"),
        ("/search/image", f"multipart/form-data; boundary={BOUNDARY}"),
        ("/search/embedding", "application/json"),
    ],
)
def test_a_short_body_is_answered_408_and_the_connection_closed(
    strict_server: ServerThread, path: str, content_type: str
) -> None:
    conns = [connect(strict_server) for _ in range(20)]
    started = time.monotonic()
    for conn in conns:
        start = MULTIPART_START if content_type.startswith("multipart") else b'{"text": "a'
        conn.sendall(lying_request(path, content_type, 1000, start))
    answers = [read_until_closed(conn) for conn in conns]
    elapsed = time.monotonic() - started
    for conn in conns:
        conn.close()
    assert elapsed < BODY_TIMEOUT_S + 2.0, f"connections held for {elapsed:.1f}s"
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"connection: close" in answer.lower()
        assert b"did not arrive within 1 s" in answer


def test_an_idle_keep_alive_connection_is_closed(strict_server: ServerThread) -> None:
    conn = connect(strict_server)
    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    started = time.monotonic()
    answer = read_until_closed(conn)
    elapsed = time.monotonic() - started
    conn.close()
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert KEEP_ALIVE_S - 0.2 < elapsed < KEEP_ALIVE_S + 2.0


def test_a_complete_slow_body_within_the_deadline_is_served(strict_server: ServerThread) -> None:
    body = b'{"text": "a red circle", "k": 2}'
    conn = connect(strict_server)
    conn.sendall(lying_request("/search/text", "application/json", len(body), body[:10]))
    time.sleep(BODY_TIMEOUT_S / 3)
    conn.sendall(body[10:])
    answer = conn.recv(65536)
    conn.close()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
