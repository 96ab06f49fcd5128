"""The shared Redis fixture talks to a real server."""

import redis


def test_redis_fixture_is_a_real_server(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set("probsearch:test", "1")
    assert client.get("probsearch:test") == b"1"
    assert client.info("server")["redis_version"]
