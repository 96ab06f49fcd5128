"""Rate limit of failed authentications on the admin endpoints (a brake on key guessing).

Failures are counted in a moving window per client address and per presented key (hashed;
the key itself is never stored). Once either has used up its allowance, every attempt from
it is refused with 429, right key or not, until the window has moved on: otherwise a 429 for
wrong keys next to a 200 for the right one would still tell a guesser when they hit.
"""

import hashlib
import math
import time

from limits import RateLimitItemPerSecond
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter


class FailedAuthLimiter:
    """At most `max_failures` failed authentications per identity in `window_s` seconds."""

    def __init__(self, max_failures: int, window_s: int) -> None:
        self._item = RateLimitItemPerSecond(max_failures, window_s)
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    @staticmethod
    def identities(client: str | None, presented_key: str | None) -> list[str]:
        """The counters one attempt is charged to: its client address and its key's hash."""
        names = [f"client:{client or 'unknown'}"]
        if presented_key:
            names.append(f"key:{hashlib.sha256(presented_key.encode()).hexdigest()[:32]}")
        return names

    def retry_after_s(self, identities: list[str]) -> int | None:
        """Seconds until these identities may try again; None when they may try now."""
        waits = []
        for identity in identities:
            if not self._limiter.test(self._item, identity):
                reset = self._limiter.get_window_stats(self._item, identity).reset_time
                waits.append(max(1, math.ceil(reset - time.time())))
        return max(waits) if waits else None

    def failed(self, identities: list[str]) -> None:
        """Charge one failed attempt to each identity."""
        for identity in identities:
            self._limiter.hit(self._item, identity)
