"""The keyed work queue and the reconciler runner.

A reconciler is declared once, in one way:

    class GrantsReconciler:
        name = "grants"
        watches = (
            Watch(CLUSTERPEERS),                                   # the key is the object's own key
            Watch(PEERINGCAPABILITIES, keys=all_clusterpeer_keys),  # an event maps to the keys it affects
        )

        async def reconcile(self, key: str) -> Result:
            ...                                                    # read the caches, write the differences
            return Result(requeue_after=300.0)

A reconciler whose work does not start from an object (the cluster's own certificates) may also define
`initial_keys() -> Iterable[str]`: those keys are queued every time this replica starts leading.

`Controller` (below) subscribes each reconciler's watches to the shared informers while this replica holds the
Lease, feeds the keys into one `WorkQueue` per reconciler and runs its workers. A key is a plain string:
`name` for cluster-scoped objects, `namespace/name` for namespaced ones (`key_of`).

The queue follows client-go's semantics because they make level-based reconciles safe: a key queued many times
is reconciled once; a key is never reconciled by two workers at once (an event that arrives while it is being
reconciled queues it again for after); failures back off per key, exponentially up to a cap; and an overall
token bucket keeps a storm of failures from hammering the API server.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Callable, Iterable, Protocol, Sequence

import prometheus_client

if TYPE_CHECKING:
    from control.kube import Resource
    from control.informers import Informers

log = logging.getLogger("peering.control.workqueue")

RECONCILES = prometheus_client.Counter("peering_reconciles", "Reconciles run, by reconciler and outcome",
                                       ["reconciler", "outcome"])
RECONCILE_SECONDS = prometheus_client.Histogram("peering_reconcile_seconds", "Time one reconcile took",
                                                ["reconciler"])


def key_of(obj: dict) -> str:
    """The work-queue key of an API object: `namespace/name`, or `name` when it is cluster-scoped."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    name = meta.get("name", "")
    return f"{namespace}/{name}" if namespace else name


def split_key(key: str) -> tuple[str | None, str]:
    """The (namespace or None, name) a key names."""
    namespace, sep, name = key.partition("/")
    return (namespace, name) if sep else (None, key)


@dataclasses.dataclass(frozen=True)
class Result:
    """What a reconcile asks of the queue when it returns without an exception.

    `requeue_after`: reconcile this key again after so many seconds even if nothing changes (time-driven work:
    expiries, periodic pulls). `requeue`: reconcile again soon with the key's backoff, without counting as an error
    (for example after a 409 Conflict, where the cache is known to be stale).
    """

    requeue_after: float | None = None
    requeue: bool = False


def _own_keys(event: str, obj: dict) -> Iterable[str]:
    return (key_of(obj),)


@dataclasses.dataclass(frozen=True)
class Watch:
    """One kind of object a reconciler reacts to.

    `resource`: what to watch; `namespace`/`label_selector`/`field_selector`: which of them (the informer is shared
    with any other watch of the same selection); `keys(event_type, obj)`: the keys an event affects (default: the
    object's own key). `event_type` is ADDED, MODIFIED or DELETED.
    """

    resource: "Resource"
    keys: Callable[[str, dict], Iterable[str]] = _own_keys
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None


class Reconciler(Protocol):
    """A level-based reconciler: reads the world for one key, writes only the differences, and is idempotent."""

    name: str
    watches: Sequence[Watch]

    async def reconcile(self, key: str) -> Result: ...


class Backoff:
    """Per-key exponential backoff: base * 2**failures, capped; pure bookkeeping, no timers."""

    def __init__(self, base: float = 0.05, cap: float = 60.0) -> None:
        self.base = base
        self.cap = cap
        self._failures: dict[str, int] = {}

    def next_delay(self, key: str) -> float:
        """Count one more failure of `key` and return how long to wait before its next attempt."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        # min() before the power would overflow for a key that failed a thousand times.
        return min(self.cap, self.base * (2 ** min(failures, 62)))

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: str) -> None:
        """Reset the key after a success."""
        self._failures.pop(key, None)


class TokenBucket:
    """An overall rate limit for retries (qps with a burst); `clock` is injectable so tests need no sleeping."""

    def __init__(self, qps: float = 10.0, burst: int = 100, clock: Callable[[], float] = time.monotonic) -> None:
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def reserve(self) -> float:
        """Take one token and return how long its holder must wait (0 when the bucket had one)."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps


class ShutDown(Exception):
    """The queue was shut down; a worker that gets this exits."""


class WorkQueue:
    """A deduplicating keyed queue with delayed adds and per-key rate-limited retries.

    Delays use loop timers, not tasks, so a queue owns nothing that could outlive `shutdown()`.
    """

    def __init__(self, name: str = "", backoff: Backoff | None = None, bucket: TokenBucket | None = None) -> None:
        self.name = name
        self.backoff = backoff or Backoff()
        self.bucket = bucket or TokenBucket()
        self._queue: collections.deque[str] = collections.deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self._wakeup = asyncio.Event()
        self._shut = False

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def processing(self) -> frozenset[str]:
        return frozenset(self._processing)

    def add(self, key: str) -> None:
        """Queue `key` now; a key already queued stays queued once; a key being processed is queued for after."""
        if self._shut or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._wakeup.set()

    def add_after(self, key: str, delay: float) -> None:
        """Queue `key` after `delay` seconds; of several pending delayed adds of one key the earliest wins."""
        if self._shut:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        pending = self._timers.get(key)
        if pending is not None:
            if pending[0] <= due:
                return
            pending[1].cancel()
        self._timers[key] = (due, loop.call_at(due, self._fire, key))

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: str) -> float:
        """Queue `key` again after its backoff (and the overall bucket); returns the delay chosen."""
        delay = max(self.backoff.next_delay(key), self.bucket.reserve())
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        """Clear the key's failure count after a success."""
        self.backoff.forget(key)

    async def get(self) -> str:
        """Wait for the next key and mark it as being processed; call `done(key)` afterwards."""
        while not self._queue:
            if self._shut:
                raise ShutDown(self.name)
            self._wakeup.clear()
            await self._wakeup.wait()
        key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: str) -> None:
        """Finish processing `key`; if it was added meanwhile, it goes back in the queue."""
        self._processing.discard(key)
        if key in self._dirty and not self._shut:
            self._queue.append(key)
            self._wakeup.set()

    def shutdown(self) -> None:
        """Drop every queued and delayed key and wake the workers so that they exit."""
        self._shut = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._queue.clear()
        self._dirty.clear()
        self._wakeup.set()


class Runner:
    """Runs one reconciler: `workers` tasks take keys from its queue and call `reconcile(key)`."""

    def __init__(self, reconciler: Reconciler, *, workers: int = 2, backoff: Backoff | None = None,
                 bucket: TokenBucket | None = None) -> None:
        self.reconciler = reconciler
        self.workers = workers
        self._backoff = backoff
        self._bucket = bucket
        self.queue = WorkQueue(reconciler.name, backoff, bucket)
        self._tasks: list[asyncio.Task] = []
        self.reconciles = 0
        self.failures = 0

    @property
    def running(self) -> bool:
        return bool(self._tasks)

    def start(self) -> None:
        if self._tasks:
            return
        if self.queue._shut:
            self.queue = WorkQueue(self.reconciler.name, self._backoff, self._bucket)
        self._tasks = [asyncio.create_task(self._work(), name=f"reconcile-{self.reconciler.name}-{i}")
                       for i in range(self.workers)]

    async def stop(self) -> None:
        """Stop at once: queued keys are dropped and a reconcile in flight is cancelled (reconciles are idempotent
        and write with preconditions, so an interrupted one is simply redone by the next leader)."""
        self.queue.shutdown()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _work(self) -> None:
        queue = self.queue
        while True:
            try:
                key = await queue.get()
            except ShutDown:
                return
            try:
                await self._reconcile_one(queue, key)
            finally:
                queue.done(key)

    async def _reconcile_one(self, queue: WorkQueue, key: str) -> None:
        name = self.reconciler.name
        self.reconciles += 1
        started = time.perf_counter()
        try:
            result = await self.reconciler.reconcile(key)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failures += 1
            RECONCILES.labels(name, "error").inc()
            RECONCILE_SECONDS.labels(name).observe(time.perf_counter() - started)
            delay = queue.add_rate_limited(key)
            log.warning("reconcile failed", extra={"reconciler": name, "key": key, "retry_in": round(delay, 3),
                                                   "error": f"{type(exc).__name__}: {exc}"})
            return
        RECONCILES.labels(name, "ok").inc()
        RECONCILE_SECONDS.labels(name).observe(time.perf_counter() - started)
        if result is None:
            result = Result()
        if result.requeue:
            queue.add_rate_limited(key)
            return
        queue.forget(key)
        if result.requeue_after is not None:
            queue.add_after(key, result.requeue_after)


class Controller:
    """All reconcilers of the process; they run only while this replica leads (`start`/`stop`)."""

    def __init__(self, informers: "Informers", reconcilers: Sequence[Reconciler] = (), *, workers: int = 2) -> None:
        self.informers = informers
        self.workers = workers
        self.runners: list[Runner] = []
        self._unsubscribe: list[Callable[[], None]] = []
        for reconciler in reconcilers:
            self.add(reconciler)

    def add(self, reconciler: Reconciler) -> Runner:
        """Register a reconciler; its informers start now so that every replica keeps warm caches."""
        runner = Runner(reconciler, workers=self.workers)
        self.runners.append(runner)
        for watch in reconciler.watches:
            self.informers.get(watch.resource, namespace=watch.namespace, label_selector=watch.label_selector,
                               field_selector=watch.field_selector)
        if self.leading:
            self._start_runner(runner)
        return runner

    @property
    def leading(self) -> bool:
        return bool(self._unsubscribe)

    async def start(self) -> None:
        """Begin reconciling: wait for the caches, subscribe, and queue every key the caches hold (level-based)."""
        if self.leading:
            return
        for runner in self.runners:
            for watch in runner.reconciler.watches:
                await self.informers.get(watch.resource, namespace=watch.namespace,
                                         label_selector=watch.label_selector,
                                         field_selector=watch.field_selector).synced.wait()
        # A marker, so that `leading` is true even with no reconcilers.
        self._unsubscribe.append(lambda: None)
        for runner in self.runners:
            self._start_runner(runner)

    def _start_runner(self, runner: Runner) -> None:
        runner.start()
        initial = getattr(runner.reconciler, "initial_keys", None)
        if initial is not None:
            for key in initial():
                runner.queue.add(key)
        for watch in runner.reconciler.watches:
            informer = self.informers.get(watch.resource, namespace=watch.namespace,
                                          label_selector=watch.label_selector, field_selector=watch.field_selector)
            self._unsubscribe.append(informer.subscribe(_enqueuer(runner, watch), replay=True))

    async def stop(self) -> None:
        """Stop reconciling at once (the Lease was lost or the process stops)."""
        unsubscribe, self._unsubscribe = self._unsubscribe, []
        for fn in unsubscribe:
            fn()
        await asyncio.gather(*(runner.stop() for runner in self.runners))


def _enqueuer(runner: Runner, watch: Watch) -> Callable[[str, dict], None]:
    def on_event(event_type: str, obj: dict) -> None:
        try:
            keys = list(watch.keys(event_type, obj))
        except Exception as exc:  # a bad mapping must not break the informer that calls every subscriber
            log.error("event to key mapping failed", extra={"reconciler": runner.reconciler.name,
                                                           "error": f"{type(exc).__name__}: {exc}"})
            return
        for key in keys:
            runner.queue.add(key)
    return on_event

