"""The join listener's rate limit: an address whose joins were refused too often in a minute gets 429 until the
oldest of those refusals is a minute old. Only refusals count (a 4xx of the control loop), so a good connection
string is never slowed by another's guessing. Bounded: far more addresses than any real use resets it."""

from __future__ import annotations

import time
from typing import Callable

WINDOW = 60.0


class JoinRateLimit:
    def __init__(self, per_minute: int, *, clock: Callable[[], float] = time.monotonic,
                 max_addresses: int = 10_000) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._max = max_addresses
        self._refused: dict[str, list[float]] = {}

    def allows(self, address: str) -> bool:
        """Whether a join from `address` may be tried now."""
        return len(self._recent(address)) < self.per_minute

    def refused(self, address: str) -> None:
        """A join from `address` was refused for what it sent."""
        recent = self._recent(address)
        if len(self._refused) >= self._max and address not in self._refused:
            self._refused.clear()
        self._refused[address] = [*recent, self._clock()]

    def _recent(self, address: str) -> list[float]:
        since = self._clock() - WINDOW
        return [t for t in self._refused.get(address, ()) if t > since]
