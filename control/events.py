"""Kubernetes Events (events.k8s.io/v1) about the module's objects, so that `kubectl describe clusterpeer` tells
a peering's story. Which changes are worth an Event is decided in `control.rules.events`; this module writes them.

Only the Lease holder writes Events (`leading`): the reconcilers, which run there, are where transitions are seen,
and a replica that does not lead stays silent. An Event of a cluster-scoped object (ClusterPeer,
PeeringCapability) lives in the namespace `default`, as client-go puts them; one of a namespaced object
(ProjectPeer, the module's Secrets) in that object's namespace.

Rate limits, so that a flapping peer cannot flood the API server:
- aggregation: an Event equal to one recorded in the last `aggregate_window` seconds (10 minutes: same object,
  type, reason and note) is not created again; the first one gets a `series` (count, lastObservedTime), written at
  most every `series_interval` seconds (30);
- per object, a token bucket: `per_object_burst` Events at once (25), then one every `per_object_refill` seconds
  (300), the numbers of client-go's spam filter;
- overall, `qps` (5) Events a second with a burst of `burst` (50).
What a limit holds back is dropped and counted (`peering_events_total{outcome="dropped"}`). Writing an Event
never fails a reconcile: an API error is logged and counted. A note is cut to the API's 1 kB and anything that
looks like a credential (a connection string, a JWT, a PEM block) is replaced before it leaves, although the
rules never put one there.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
from dataclasses import dataclass
from typing import Callable

import prometheus_client

from contract.names import MANAGED_BY, MANAGED_BY_VALUE
from control.clock import SYSTEM, Clock
from control.kube import EVENTS, ApiError, KubeSession, MERGE_PATCH
from control.lease import micro_time
from control.rules.events import EventSpec

log = logging.getLogger("peering.control.events")

#: events.k8s.io/v1 reportingController: a qualified name.
REPORTING_CONTROLLER = "peering.deckhouse.io/controller"
NOTE_LIMIT = 1024
CLUSTER_EVENTS_NAMESPACE = "default"

EVENTS_WRITTEN = prometheus_client.Counter(
    "peering_events", "Kubernetes Events about the module's objects, by kind of object, reason and outcome "
    "(created, aggregated into a series, dropped by a rate limit, failed)", ["kind", "reason", "outcome"])

_SECRETS = (
    (re.compile(r"d8peer\d+\.[A-Za-z0-9_-]+"), "<connection string>"),
    (re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"), "<token>"),
    (re.compile(r"-----BEGIN [A-Z ]+-----.*?(-----END [A-Z ]+-----|$)", re.S), "<PEM>"),
)
_REASON = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,63}$")


def safe_note(text: str) -> str:
    """The note as it may be written: credentials replaced, cut to the API's limit (in bytes)."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    data = text.encode()
    if len(data) <= NOTE_LIMIT:
        return text
    return data[:NOTE_LIMIT - 3].decode(errors="ignore") + "..."


def reason_label(reason: str) -> str:
    """The reason as a metric label: one of a bounded set of words, else `Other`."""
    return reason if _REASON.match(reason or "") else "Other"


def reference(obj: dict) -> dict:
    """events.k8s.io/v1 `regarding` of an API object (its uid makes `kubectl describe` find the Event)."""
    meta = obj.get("metadata") or {}
    ref = {"apiVersion": obj.get("apiVersion", ""), "kind": obj.get("kind", ""), "name": meta.get("name", "")}
    for key in ("namespace", "uid", "resourceVersion"):
        if meta.get(key):
            ref[key] = meta[key]
    return ref


class _Bucket:
    def __init__(self, burst: float, per_second: float, now: float) -> None:
        self.burst, self.rate, self.tokens, self.at = burst, per_second, burst, now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass
class _Recent:
    name: str
    namespace: str
    first: float
    count: int = 1
    written_count: int = 1
    written_at: float = 0.0


class EventRecorder:
    """Writes Events for the reconcilers of the Lease holder; `emit` never raises (but for a cancellation)."""

    def __init__(self, kube: KubeSession, *, identity: str, leading: Callable[[], bool], clock: Clock = SYSTEM,
                 aggregate_window: float = 600.0, series_interval: float = 30.0, per_object_burst: int = 25,
                 per_object_refill: float = 300.0, qps: float = 5.0, burst: int = 50,
                 max_tracked: int = 4096) -> None:
        self.kube = kube
        self.identity = identity[:128] or "peering"
        self.leading = leading
        self.clock = clock
        self.aggregate_window = aggregate_window
        self.series_interval = series_interval
        self.per_object_burst = per_object_burst
        self.per_object_refill = per_object_refill
        self.max_tracked = max_tracked
        self._overall = _Bucket(burst, qps, clock.monotonic())
        self._objects: collections.OrderedDict[str, _Bucket] = collections.OrderedDict()
        self._recent: collections.OrderedDict[tuple, _Recent] = collections.OrderedDict()
        self._lock = asyncio.Lock()
        self._last_ns = 0
        #: Every Event written (created or updated) by this recorder, newest last: for tests and the check.
        self.written: collections.deque[dict] = collections.deque(maxlen=256)

    async def emit(self, obj: dict, spec: EventSpec) -> None:
        """Record `spec` about `obj` (an API object as read or written), subject to the rate limits."""
        if not self.leading():
            return
        ref = reference(obj)
        kind = ref.get("kind") or "Object"
        note = safe_note(spec.note)
        key = (ref.get("uid") or f"{kind}/{ref.get('namespace', '')}/{ref['name']}", spec.type, spec.reason, note)
        now = self.clock.monotonic()
        async with self._lock:
            try:
                await self._emit(ref, kind, spec, note, key, now)
            except asyncio.CancelledError:
                raise
            except (ApiError, OSError, asyncio.TimeoutError, ValueError) as exc:
                EVENTS_WRITTEN.labels(kind, reason_label(spec.reason), "failed").inc()
                log.warning("event not written", extra={"kind": kind, "object": ref["name"], "reason": spec.reason,
                                                        "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            except Exception as exc:  # aiohttp's errors and anything else: an Event must not fail the pass
                EVENTS_WRITTEN.labels(kind, reason_label(spec.reason), "failed").inc()
                log.warning("event not written", extra={"kind": kind, "object": ref["name"], "reason": spec.reason,
                                                        "error": type(exc).__name__})

    async def _emit(self, ref: dict, kind: str, spec: EventSpec, note: str, key: tuple, now: float) -> None:
        label = reason_label(spec.reason)
        recent = self._recent.get(key)
        if recent is not None and now - recent.first < self.aggregate_window:
            recent.count += 1
            self._recent.move_to_end(key)
            if now - recent.written_at < self.series_interval or not self._overall.take(now):
                EVENTS_WRITTEN.labels(kind, label, "aggregated").inc()
                return
            series = {"count": recent.count, "lastObservedTime": micro_time(self.clock.now())}
            written = await self.kube.patch(EVENTS, recent.name, {"series": series}, recent.namespace,
                                            content_type=MERGE_PATCH)
            recent.written_count, recent.written_at = recent.count, now
            self.written.append(written)
            EVENTS_WRITTEN.labels(kind, label, "aggregated").inc()
            return
        bucket = self._objects.get(key[0])
        if bucket is None:
            bucket = self._objects[key[0]] = _Bucket(self.per_object_burst, 1.0 / self.per_object_refill, now)
        self._objects.move_to_end(key[0])
        while len(self._objects) > self.max_tracked:
            self._objects.popitem(last=False)
        if not bucket.take(now) or not self._overall.take(now):
            EVENTS_WRITTEN.labels(kind, label, "dropped").inc()
            log.info("event dropped by the rate limit", extra={"kind": kind, "object": ref["name"],
                                                               "reason": spec.reason})
            return
        namespace = ref.get("namespace") or CLUSTER_EVENTS_NAMESPACE
        stamp = self.clock.now()
        # As client-go names them: the object's name and the time in nanoseconds, kept increasing so that two
        # Events of one instant (or of a clock that stands still) never share a name.
        self._last_ns = max(int(stamp.timestamp() * 1e9), self._last_ns + 1)
        name = f"{ref['name'][:230]}.{self._last_ns:x}"
        event = {
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY: MANAGED_BY_VALUE}},
            "eventTime": micro_time(stamp), "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": self.identity, "action": spec.action[:128], "reason": spec.reason[:128],
            "type": spec.type, "note": note, "regarding": ref,
        }
        written = await self.kube.create(EVENTS, event, namespace)
        self.written.append(written)
        EVENTS_WRITTEN.labels(kind, label, "created").inc()
        self._recent[key] = _Recent(name, namespace, first=now, written_at=now)
        while len(self._recent) > self.max_tracked:
            self._recent.popitem(last=False)

    async def emit_all(self, obj: dict, specs: list[EventSpec]) -> None:
        for spec in specs:
            await self.emit(obj, spec)
