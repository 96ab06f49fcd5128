"""Failures logged once per outage, with a count, instead of a traceback per request.

When a backend is down (Milvus, a disk), every search fails the same way: a 16 s Milvus outage at
8 clients wrote 20.6 MB of log, 11,137 tracebacks. An outage's first failure is logged with its
traceback; the ones after it only count, with a summary every `summary_every_s`; the outage ends
with the next success, or after `quiet_s` without a failure, and its total is logged then.
"""

from __future__ import annotations

import logging
import threading
import time


class OutageLog:
    """Logs the failures of one kind of work (`what`) once per outage; `count` is the number of
    failures of the outage in progress (0: none), for callers to skip succeeded() when it is
    0, as they do on their fast path."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        summary_every_s: float = 60.0,
        quiet_s: float = 30.0,
    ) -> None:
        self.logger = logger
        self.what = what
        self.summary_every_s = summary_every_s
        self.quiet_s = quiet_s
        self._lock = threading.Lock()
        self.count = 0
        self._started = self._last_failure = self._last_summary = 0.0

    def failed(self, error: BaseException) -> None:
        """Record a failure: logged with its traceback if it starts an outage."""
        now = time.monotonic()
        with self._lock:
            if self.count and now - self._last_failure > self.quiet_s:
                self._close(self._last_failure, "ended")
            self.count += 1
            self._last_failure = now
            if self.count == 1:
                self._started = self._last_summary = now
                self.logger.error("%s failed: %s", self.what, error, exc_info=error)
            elif now - self._last_summary >= self.summary_every_s:
                self._last_summary = now
                self.logger.error(
                    "%s still failing: %d failures in %.0f s (last: %s)",
                    self.what, self.count, now - self._started, error,
                )  # fmt: skip

    def succeeded(self) -> None:
        """Record a success: it ends the outage in progress, if any."""
        with self._lock:
            if self.count:
                self._close(time.monotonic(), "recovered")

    def _close(self, now: float, how: str) -> None:
        self.logger.warning(
            "%s %s after %d failures in %.0f s",
            self.what, how, self.count, now - self._started,
        )  # fmt: skip
        self.count = 0
