"""What every answered request leaves behind: its count and latency in the metrics, and one JSON line on the
`gateway.access` logger (never a token, a query or an address)."""

from __future__ import annotations

import json
import logging
import time

from cachetools import LRUCache

from gateway.config import GatewayConfig
from gateway.metrics import Metrics

access_log = logging.getLogger("gateway.access")

LISTENERS = ("entrance", "egress", "join")


class Accounting:
    def __init__(self, metrics: Metrics, config: GatewayConfig) -> None:
        self.metrics = metrics
        self._config = config  # read on every request: config.access_log may be switched while serving
        # Metric children looked up once: labels() takes a lock and builds a tuple on every call.
        self.in_flight = {n: metrics.in_flight.labels(n) for n in ("entrance", "egress")}
        self.entrance_in_flight = self.in_flight["entrance"]
        self._latency = {n: metrics.latency.labels(n) for n in LISTENERS}
        # Bounded (labels are, but a flood of distinct peers is not a reason to grow): an LRU of metric children,
        # evicting one at a time; an evicted child is looked up again, its count is kept by the metric.
        self._counters: LRUCache = LRUCache(10_000)

    def finish(self, listener: str, peer: str, caps: str, method: str, path: str, code: int, start: float) -> None:
        """A request of `listener` was answered with `code`; `start` is its time.perf_counter() on arrival."""
        elapsed = time.perf_counter() - start
        key = (listener, peer, caps, code // 100)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = self.metrics.requests.labels(listener, peer, caps, f"{code // 100}xx")
        counter.inc()
        self._latency[listener].observe(elapsed)
        if self._config.access_log and access_log.isEnabledFor(logging.INFO):
            access_log.info(json.dumps({"listener": listener, "peer": peer, "capabilities": caps,
                                        "method": method, "path": path, "code": code,
                                        "ms": round(elapsed * 1000, 3)}, separators=(",", ":")))

    def upstream_error(self, listener: str, kind: str) -> None:
        self.metrics.upstream_errors.labels(listener, kind).inc()
