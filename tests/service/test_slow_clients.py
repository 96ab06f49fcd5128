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


def server_errors(metrics: str) -> float:
    """The 5xx requests counted in a /metrics page."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("probsearch_requests_total{") and 'status="5' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def metrics_page(server: ServerThread) -> str:
    conn = connect(server)
    conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    page = read_until_closed(conn).decode()
    conn.close()
    return page


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/search/text", "application/json"),
        ("/search/image", f"multipart/form-data; boundary={BOUNDARY}"),
    ],
)
def test_clients_that_leave_mid_body_add_no_server_error(
    strict_server: ServerThread, path: str, content_type: str, caplog
) -> None:
    """100 clients send half a body and close: each is counted under 499, none as a 5xx, and
    nothing is logged above debug."""
    before = server_errors(metrics_page(strict_server))
    caplog.set_level("INFO")
    for _ in range(100):
        conn = connect(strict_server)
        start = MULTIPART_START if content_type.startswith("multipart") else b'{"text": "a'
        conn.sendall(lying_request(path, content_type, 1000, start))
        conn.close()
    deadline = time.monotonic() + 10
    while True:
        page = metrics_page(strict_server)
        left = f'probsearch_requests_total{{endpoint="{path}",status="499"}}'
        counted = [float(ln.rsplit(" ", 1)[1]) for ln in page.splitlines() if ln.startswith(left)]
        if (counted and counted[0] >= 100) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert counted and counted[0] >= 100, "the disconnects were not counted under 499"
    assert server_errors(page) == before
    assert not [r for r in caplog.records if r.levelno >= 20 and "Traceback" in r.getMessage()]
    assert not [r for r in caplog.records if r.levelno >= 40]


def test_connections_that_send_no_request_or_drip_headers_are_closed(
    strict_server: ServerThread,
) -> None:
    """50 connections that send nothing and one that sends a header line every 0.4 s are all
    closed about KEEP_ALIVE_S after they opened, while a search on another connection works."""
    idle = [connect(strict_server) for _ in range(50)]
    drip = connect(strict_server)
    started = time.monotonic()
    drip.sendall(b"GET /healthz HTTP/1.1\r\n")
    drip.settimeout(0.4)
    closed_at = None
    for i in range(20):  # 8 s of headers if nobody stops it
        try:
            drip.sendall(f"X-Drip-{i}: {i}\r\n".encode())
            if drip.recv(1) == b"":
                closed_at = time.monotonic() - started
                break
        except TimeoutError:
            continue
        except OSError:
            closed_at = time.monotonic() - started
            break
    assert closed_at is not None and closed_at < KEEP_ALIVE_S + 1.5, closed_at
    search = connect(strict_server)
    body = b'{"text": "a red circle"}'
    search.sendall(lying_request("/search/text", "application/json", len(body), body))
    assert search.recv(65536).startswith(b"HTTP/1.1 200 ")
    search.close()
    for conn in idle:
        assert read_until_closed(conn) == b""
        conn.close()
    assert time.monotonic() - started < KEEP_ALIVE_S + 3.0
    drip.close()


KEEP_ALIVE_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def test_at_the_cap_a_new_connection_evicts_the_oldest_that_never_sent_a_request(
    artifacts: Artifacts,
) -> None:
    """Cap 10 (one left free: uvicorn answers 503 to every request while the open connections
    reach the cap). Nine connections that send nothing fill it; a client that then connects is
    served, and the oldest silent connection is closed for it."""
    settings = make_settings(artifacts, keep_alive_timeout_s=30, max_connections=10)
    with ServerThread(settings) as server:
        silent = []
        for _ in range(9):
            silent.append(connect(server))
            time.sleep(0.02)  # opened in this order
        client = connect(server)
        client.sendall(KEEP_ALIVE_HEALTHZ)
        assert client.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert read_until_closed(silent[0]) == b""
        client.sendall(KEEP_ALIVE_HEALTHZ)  # its keep-alive connection keeps working
        assert client.recv(65536).startswith(b"HTTP/1.1 200 ")
        for conn in [client, *silent]:
            conn.close()


def test_at_the_cap_with_every_connection_in_use_a_new_one_gets_503(artifacts: Artifacts) -> None:
    settings = make_settings(artifacts, keep_alive_timeout_s=30, max_connections=10)
    with ServerThread(settings) as server:
        busy = []
        for _ in range(9):
            conn = connect(server)
            conn.sendall(KEEP_ALIVE_HEALTHZ)
            assert conn.recv(65536).startswith(b"HTTP/1.1 200 ")
            busy.append(conn)
        extra = connect(server)
        answer = read_until_closed(extra)
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:100]
        assert b"too_many_connections" in answer and b"retry-after: 1" in answer
        extra.close()
        for conn in busy:
            conn.close()
        time.sleep(0.2)
        conn = connect(server)
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert read_until_closed(conn).startswith(b"HTTP/1.1 200 ")
        conn.close()
