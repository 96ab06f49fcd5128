"""A probe that tells when Redis answers again, so the components that use it recover at once.

The result cache and the index watcher only find out that Redis is down when a command fails,
and then back off. Without a probe they would also only find out that it is back when their
backoff next lets them try (and the cache only on a request). The probe pings Redis every
`interval_s` while it answers and, while it does not, with a capped exponential backoff; it
keeps the `redis_up` gauge true at all times (a paused Redis included) and, on recovery, calls
the components' recovery callbacks so they retry immediately.
"""

import logging
import threading
from collections.abc import Callable

import redis

from service.cache import REDIS_ERRORS, Backoff, redis_connection_kwargs
from service.metrics import ServiceMetrics

log = logging.getLogger(__name__)


class RedisHealth:
    """Background pinger of one Redis server; `up` is its last verdict."""

    def __init__(
        self,
        redis_url: str,
        metrics: ServiceMetrics,
        *,
        socket_timeout_s: float = 0.5,
        backoff_max_s: float = 2.0,
        interval_s: float = 1.0,
    ) -> None:
        self._client = redis.Redis.from_url(redis_url, **redis_connection_kwargs(socket_timeout_s))
        self._metrics = metrics
        self._backoff = Backoff(maximum_s=backoff_max_s)
        self._interval_s = interval_s
        self._callbacks: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.up: bool | None = None  # None: not probed yet

    def on_recovery(self, callback: Callable[[], None]) -> None:
        """Call `callback` (in the probe thread) each time Redis answers again after a failure."""
        self._callbacks.append(callback)

    def start(self) -> None:
        """Probe once now, then keep probing in a daemon thread."""
        self.probe()
        self._thread = threading.Thread(target=self._run, name="redis-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop probing and close the connection."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._client.close()

    def probe(self) -> bool:
        """Ping once, update `up` and the gauge, and run the recovery callbacks on a recovery."""
        try:
            self._client.ping()
        except REDIS_ERRORS as error:
            self._set_down(error)
            return False
        was_down = self.up is False
        self.up = True
        self._backoff.succeeded()
        self._metrics.redis_up.set(1)
        if was_down:
            log.info("Redis answers again; resuming the result cache and activation events")
            for callback in self._callbacks:
                callback()
        return True

    def _set_down(self, error: Exception) -> None:
        if self.up is not False:
            log.warning("Redis does not answer (%s); probing with backoff until it does", error)
        self.up = False
        self._metrics.redis_up.set(0)

    def _run(self) -> None:
        while not self._stop.is_set():
            wait_s = self._interval_s if self.up else self._backoff.failed()
            if self._stop.wait(wait_s):
                return
            self.probe()
