"""Auth modes: the schema declares exactly what the server requires; failed admin attempts
are rate limited per client and per presented key."""

import httpx
import pytest

from service.http.auth_limit import FailedAuthLimiter
from tests.service.conftest import ADMIN_KEY, Artifacts, ServerThread, make_settings

SEARCH_PATHS = ("/search/text", "/search/image", "/search/embedding")


def operation(schema: dict, path: str) -> dict:
    return schema["paths"][path]["post"]


def test_open_search_declares_no_security_and_admin_does(client: httpx.Client) -> None:
    schema = client.get("/openapi.json").json()
    for path in SEARCH_PATHS:
        assert "security" not in operation(schema, path)
        assert "401" not in operation(schema, path)["responses"]
        assert client.post(path, json={}).status_code != 401  # indeed open
    admin = operation(schema, "/admin/reload")
    assert admin["security"] and {"401", "429"} <= set(admin["responses"])


def test_key_mode_declares_and_enforces_the_key(artifacts: Artifacts) -> None:
    settings = make_settings(artifacts, require_api_key_for_search=True)
    with ServerThread(settings) as server, httpx.Client(base_url=server.url) as http:
        schema = http.get("/openapi.json").json()
        for path in SEARCH_PATHS:
            assert operation(schema, path)["security"]
            assert "401" in operation(schema, path)["responses"]
        assert http.post("/search/text", json={"text": "a star"}).status_code == 401
        keyed = http.post("/search/text", json={"text": "a star"}, headers={"X-API-Key": ADMIN_KEY})
        assert keyed.status_code == 200


def test_failed_admin_attempts_are_limited_then_refused_even_with_the_right_key(
    artifacts: Artifacts,
) -> None:
    settings = make_settings(artifacts, admin_auth_max_failures=3, admin_auth_window_s=60)
    with ServerThread(settings) as server, httpx.Client(base_url=server.url) as http:
        guesses = [http.post("/admin/reload", headers={"X-API-Key": f"guess-{i:016d}"})
                   for i in range(3)]  # fmt: skip
        assert [r.status_code for r in guesses] == [401, 401, 401]
        blocked = http.post("/admin/reload", headers={"X-API-Key": ADMIN_KEY})
        assert blocked.status_code == 429
        assert 1 <= int(blocked.headers["retry-after"]) <= 60
        assert "too many failed API key attempts" in blocked.json()["detail"]
        assert http.post("/search/text", json={"text": "a star"}).status_code == 200


@pytest.mark.parametrize("shared", ["client", "key"])
def test_limiter_counts_per_client_and_per_key(shared: str) -> None:
    limiter = FailedAuthLimiter(max_failures=2, window_s=60)
    attempts = [("10.0.0.1", "key-a"), ("10.0.0.1", "key-b")] if shared == "client" else [
        ("10.0.0.1", "key-a"), ("10.0.0.2", "key-a")]  # fmt: skip
    for client, key in attempts:
        assert limiter.retry_after_s(limiter.identities(client, key)) is None
        limiter.failed(limiter.identities(client, key))
    blocked = ("10.0.0.1", "key-c") if shared == "client" else ("10.0.0.3", "key-a")
    assert limiter.retry_after_s(limiter.identities(*blocked)) is not None
    assert limiter.retry_after_s(limiter.identities("10.0.0.9", "key-z")) is None


def from_address(url: str, address: str) -> httpx.Client:
    """A client whose connections leave from `address` (any 127.x.y.z is this machine)."""
    return httpx.Client(base_url=url, transport=httpx.HTTPTransport(local_address=address))


def test_a_forged_forwarded_for_neither_bypasses_nor_redirects_the_lockout(
    artifacts: Artifacts,
) -> None:
    """By default X-Forwarded-For is ignored: guesses that each name another address are all
    charged to their socket's, and the address they name (a victim's) is not locked out.
    Naming the proxy in trusted_proxies makes the header count."""
    settings = make_settings(artifacts, admin_auth_max_failures=3, admin_auth_window_s=60)
    with ServerThread(settings) as server, from_address(server.url, "127.0.0.1") as attacker:
        codes = [attacker.post("/admin/reload", headers={"X-API-Key": f"guess-{i:016d}",
                                                          "X-Forwarded-For": f"10.0.0.{i}"})
                 for i in range(4)]  # fmt: skip
        assert [r.status_code for r in codes] == [401, 401, 401, 429]
        framing = {"X-API-Key": "wrong-key-0000000000", "X-Forwarded-For": "127.0.0.2"}
        assert attacker.post("/admin/reload", headers=framing).status_code == 429
        with from_address(server.url, "127.0.0.2") as victim:
            assert victim.post("/admin/reload", headers={"X-API-Key": ADMIN_KEY}).status_code == 200
    trusting = make_settings(artifacts, admin_auth_max_failures=3, admin_auth_window_s=60,
                             trusted_proxies=["127.0.0.1"])  # fmt: skip
    with ServerThread(trusting) as server, from_address(server.url, "127.0.0.1") as proxy:
        for i in range(4):  # each forwarded client has failures of its own
            guess = proxy.post(
                "/admin/reload",
                headers={"X-API-Key": f"guess-{i:016d}", "X-Forwarded-For": f"10.0.0.{i}"},
            )
            assert guess.status_code == 401
