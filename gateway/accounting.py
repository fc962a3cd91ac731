"""What every answered request leaves behind: its count and latency in the metrics, and one JSON line on the
`gateway.access` logger (never a token, a query or an address).

Each request ends with one of `OUTCOMES`, so that neither the log nor the metric takes the ordinary end of a
stream for a failure (docs/operations.md, "Requests and their outcomes"):

- `answered`: the upstream's answer went to the client to its end; `code` is the upstream's, whatever it is.
- `refused`: the gateway answered with a Status of its own; `code` and `reason` are the gateway's (4xx: the
  request's fault; 5xx: something the request needs is down or refuses the gateway).
- `interrupted`: the upstream failed after its answer had begun; the client's connection was cut.
- `client_closed`: the client went away before the answer ended (it ended a watch); `code` is the upstream's if
  its answer had begun, else 499.
- `withdrawn`: the gateway ended the stream because what admitted it ended (a revocation, a capability closed,
  the consumer removed, the token expired).
- `error`: a fault inside the gateway (500 InternalError, logged with its traceback).
"""

from __future__ import annotations

import json
import logging
import time

from cachetools import LRUCache

from gateway.config import GatewayConfig
from gateway.metrics import Metrics

access_log = logging.getLogger("gateway.access")

LISTENERS = ("entrance", "egress", "join")
OUTCOMES = ANSWERED, REFUSED, INTERRUPTED, CLIENT_CLOSED, WITHDRAWN, ERROR = (
    "answered", "refused", "interrupted", "client_closed", "withdrawn", "error")
#: The code of a request whose client went away before any answer began (nginx's "client closed request").
CLIENT_CLOSED_CODE = 499


class Accounting:
    def __init__(self, metrics: Metrics, config: GatewayConfig) -> None:
        self.metrics = metrics
        self._config = config  # read on every request: config.access_log may be switched while serving
        # Metric children looked up once: labels() takes a lock and builds a tuple on every call.
        self.in_flight = {n: metrics.in_flight.labels(n) for n in ("entrance", "egress")}
        self._latency = {n: metrics.latency.labels(n) for n in LISTENERS}
        # Bounded (labels are, but a flood of distinct peers is not a reason to grow): an LRU of metric children,
        # evicting one at a time; an evicted child is looked up again, its count is kept by the metric.
        self._counters: LRUCache = LRUCache(10_000)

    def finish(self, listener: str, peer: str, caps: str, method: str, path: str, code: int, start: float | None,
               outcome: str | None = None, reason: str | None = None) -> None:
        """A request of `listener` was answered with `code` and ended as `outcome` (one of OUTCOMES; by default
        `answered` below 400 and `refused` from it, as for the join listener's answers); `start` is its
        time.perf_counter() on arrival, None for a request whose head never came whole (no latency then)."""
        if outcome is None:
            outcome = ANSWERED if code < 400 else REFUSED
        key = (listener, peer, caps, code // 100, outcome)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = self.metrics.requests.labels(listener, peer, caps, f"{code // 100}xx",
                                                                         outcome)
        counter.inc()
        elapsed = None
        if start is not None:
            elapsed = time.perf_counter() - start
            self._latency[listener].observe(elapsed)
        if self._config.access_log and access_log.isEnabledFor(logging.INFO):
            line = {"listener": listener, "peer": peer, "capabilities": caps, "method": method, "path": path,
                    "code": code, "outcome": outcome}
            if reason is not None:
                line["reason"] = reason
            line["ms"] = None if elapsed is None else round(elapsed * 1000, 3)
            access_log.info(json.dumps(line, separators=(",", ":")))

    def refused_head(self, listener: str, peer: str, code: int, reason: str) -> None:
        """A request refused before its head was read whole (a parse error, a head too slow): no method, path or
        latency to tell."""
        self.finish(listener, peer, "-", "-", "-", code, None, REFUSED, reason)

    def upstream_error(self, listener: str, kind: str) -> None:
        self.metrics.upstream_errors.labels(listener, kind).inc()
