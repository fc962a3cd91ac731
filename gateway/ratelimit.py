"""A token bucket per key: what bounds each peer's token exchanges at Dex (exchange.PeerRate) and each peer's
calls of the peer protocol (peercalls.PeerCallBound).

`rate` a second, bursts of `burst`. The table is an LRU of `max_keys` buckets, so a flood of keys evicts one bucket
at a time (a bucket evicted starts full again: more keys than peers means something else is wrong). `rate` <= 0
turns the bound off.
"""

from __future__ import annotations

import math
import time
from typing import Callable

from cachetools import LRUCache


class TokenBuckets:
    def __init__(self, rate: float, burst: float, *, max_keys: int = 10_000,
                 clock: Callable[[], float] = time.monotonic, unit: str = "call") -> None:
        if rate > 0 and burst < 1:
            raise ValueError(f"a burst of {burst} {unit}s lets no {unit} through; give at least 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: LRUCache = LRUCache(max_keys)  # key -> [tokens, when]

    def take(self, key: str) -> float:
        """0 when a call for `key` may go on now (a token is taken), else the seconds until the next one may."""
        if self.rate <= 0:
            return 0.0
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = [self.burst, now]
        tokens = min(self.burst, bucket[0] + (now - bucket[1]) * self.rate)
        bucket[1] = now
        if tokens >= 1:
            bucket[0] = tokens - 1
            return 0.0
        bucket[0] = tokens
        return (1 - tokens) / self.rate


def retry_after_seconds(wait: float) -> int:
    """Whole seconds for a Retry-After header: at least 1."""
    return max(1, math.ceil(wait))
