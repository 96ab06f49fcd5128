"""Fixtures shared by every test package: a real Redis server of the tests' own."""

import os

# gRPC (loaded by the Milvus and Ray tests) installs fork handlers that can abort a forked
# child while gRPC threads are busy; the Redis fixture forks redis-server after those tests,
# and one CI run lost it that way (exit -6, every Redis test after it errored). Set before
# anything imports grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

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
