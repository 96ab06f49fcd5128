"""Fixtures shared by every test package: a real Redis server of the tests' own."""

from collections.abc import Iterator

import pytest
import redis
from pytest_redis import factories
from pytest_redis.executor.process import RedisExecutor

redis_server = factories.redis_proc(port=None)


@pytest.fixture
def redis_url(redis_server: RedisExecutor) -> Iterator[str]:
    """URL of a real redis-server started for this test session, emptied before each test."""
    url = f"redis://{redis_server.host}:{redis_server.port}/0"
    client = redis.Redis.from_url(url)
    client.flushall()
    client.close()
    yield url
