"""Redis result cache that fails open: when Redis is down the service answers without it."""

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from service.metrics import ServiceMetrics

log = logging.getLogger(__name__)

REDIS_ERRORS = (redis.RedisError, OSError)
# How many keys a process remembers having stored or found (ResultCache.known).
KNOWN_KEYS = 4096


def cache_key(namespace: str, index_version: str, request_hash: str) -> str:
    """Redis key of a cached response:
    probsearch:<namespace>:cache:<index version>:<request sha256>."""
    return f"probsearch:{namespace}:cache:{index_version}:{request_hash}"


def redis_connection_kwargs(socket_timeout_s: float, *, asynchronous: bool = False) -> dict:
    """Client options shared by every Redis client of the service: short timeouts, one retry.

    redis-py retries a failed command up to 10 times with backoff by default, which would
    stall every request while Redis is down; the service backs off on its own instead.
    """
    return {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": socket_timeout_s,
        "retry": (AsyncRetry if asynchronous else Retry)(NoBackoff(), 1),
    }


class Backoff:
    """Exponential backoff between reconnection attempts to a dependency that went down."""

    def __init__(
        self,
        initial_s: float = 0.25,
        maximum_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.initial_s = initial_s
        self.maximum_s = maximum_s
        self._clock = clock
        self._delay_s = 0.0
        self._next_try = 0.0

    @property
    def down(self) -> bool:
        """Whether the last attempt failed."""
        return self._delay_s > 0

    def ready(self) -> bool:
        """Whether an attempt may be made now."""
        return self._clock() >= self._next_try

    def failed(self) -> float:
        """Record a failure; returns the delay before the next attempt."""
        self._delay_s = min(self.maximum_s, max(self.initial_s, 2 * self._delay_s))
        self._next_try = self._clock() + self._delay_s
        return self._delay_s

    def succeeded(self) -> None:
        """Record a success: the next failure starts again from the initial delay."""
        self._delay_s = 0.0
        self._next_try = 0.0


class ResultCache:
    """Caches serialized search responses in Redis under their index version, with a TTL.

    Every Redis failure is logged once per outage, counted, and turned into a cache miss;
    while Redis is down, attempts are spaced by an exponential backoff.

    `store` writes behind: a search answers without waiting for Redis, and until the write is
    done `get` finds the body in process, so the same request sent right after is a hit. The
    bodies stored within `write_delay_s` of each other go to Redis in one pipeline: one SET
    costs this process about 100 us of CPU, a SET in a pipeline of five about 43 (redis-py
    8.1), and at one client the lone SET lands on the next request's time.
    `known` tells the keys this process stored or found lately (the last KNOWN_KEYS), so that
    a caller may skip a lookup that would most likely miss (service.http.search_flow).
    """

    def __init__(
        self,
        redis_url: str | None,
        ttl_s: int,
        metrics: ServiceMetrics,
        socket_timeout_s: float = 0.5,
        backoff_max_s: float = 30.0,
        write_delay_s: float = 0.01,
    ) -> None:
        self.ttl_s = ttl_s
        self.write_delay_s = write_delay_s
        self._metrics = metrics
        self._backoff = Backoff(maximum_s=backoff_max_s)
        self._client: aioredis.Redis | None = None
        self._pending: dict[str, bytes] = {}  # written behind, not yet acknowledged by Redis
        self._queued: list[str] = []  # pending keys not yet sent
        self._writer: asyncio.Task | None = None  # waiting write_delay_s to send the queue
        self._known: dict[str, None] = {}  # insertion-ordered: the oldest goes first
        self._writes: set[asyncio.Task] = set()
        if redis_url is not None and ttl_s > 0:
            self._client = aioredis.Redis.from_url(
                redis_url, **redis_connection_kwargs(socket_timeout_s, asynchronous=True)
            )

    @property
    def enabled(self) -> bool:
        """Whether a Redis URL and a positive TTL are configured."""
        return self._client is not None

    def known(self, key: str) -> bool:
        """Whether this process stored `key` or found it among its last KNOWN_KEYS keys (it
        may have expired since)."""
        return key in self._known

    def _remember(self, key: str) -> None:
        self._known.pop(key, None)
        self._known[key] = None
        if len(self._known) > KNOWN_KEYS:
            del self._known[next(iter(self._known))]

    async def get(self, key: str) -> bytes | None:
        """The cached body under `key`, or None on a miss or while Redis is unavailable."""
        if key in self._pending:
            self._metrics.cache_hits.inc()
            return self._pending[key]
        if self._client is None or not self._backoff.ready():
            return None
        try:
            body = await self._client.get(key)
        except REDIS_ERRORS as error:
            self._on_error(error)
            return None
        self._on_success()
        if body is None:
            self._metrics.cache_misses.inc()
        else:
            self._metrics.cache_hits.inc()
            self._remember(key)
        return body

    async def set(self, key: str, body: bytes) -> None:
        """Store `body` under `key` with the TTL; a Redis failure only skips caching."""
        await self.set_many([(key, body)])

    async def set_many(self, items: list[tuple[str, bytes]]) -> None:
        """`set` of every (key, body), in one pipeline."""
        if self._client is None or not self._backoff.ready() or not items:
            return
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for key, body in items:
                    pipe.set(key, body, ex=self.ttl_s)
                await pipe.execute()
        except REDIS_ERRORS as error:
            self._on_error(error)
            return
        self._on_success()

    def store(self, key: str, body: bytes) -> None:
        """`set` in the background, with the other bodies stored within write_delay_s (see the
        class doc); the caller does not wait for Redis."""
        if self._client is None or not self._backoff.ready() or key in self._pending:
            return
        self._pending[key] = body
        self._queued.append(key)
        self._remember(key)
        if self._writer is None:
            self._writer = self._track(self._write_later())

    def _track(self, work: Coroutine[Any, Any, None]) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(work)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def _write_later(self) -> None:
        await asyncio.sleep(self.write_delay_s)
        self._writer = None
        await self._write_queued()

    async def _write_queued(self) -> None:
        keys, self._queued = self._queued, []
        try:
            await self.set_many([(key, self._pending[key]) for key in keys])
        finally:
            for key in keys:
                self._pending.pop(key, None)

    def recover(self) -> None:
        """Redis answers again (service.redis_health): try it on the next request."""
        self._backoff.succeeded()

    async def close(self) -> None:
        """Write what is queued, finish the writes under way, then close the connection pool."""
        if self._writer is not None:
            self._writer.cancel()
            self._writer = None
        await self._write_queued()
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    def _on_error(self, error: Exception) -> None:
        was_down = self._backoff.down
        delay_s = self._backoff.failed()
        self._metrics.redis_errors.labels(component="cache").inc()
        self._metrics.redis_up.set(0)
        if not was_down:
            log.warning(
                "Redis unavailable for the result cache (%s); serving without cache, "
                "retrying in %.1fs with backoff",
                error,
                delay_s,
            )

    def _on_success(self) -> None:
        if self._backoff.down:
            log.info("Redis reachable again; result cache resumed")
        self._backoff.succeeded()
        self._metrics.redis_up.set(1)
