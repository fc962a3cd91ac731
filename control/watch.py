"""Resumable list+watch caches (informers) shared by the whole process.

An `Informer` lists its selection, then watches from the list's resourceVersion with bookmarks, keeping an
in-memory store of the objects and calling its subscribers on every change:

- the server ends the stream (timeoutSeconds, a restart of the API server's watch cache, a dropped connection):
  watch again from the last resourceVersion seen (an event's or a bookmark's), without listing;
- 410 Gone (as the answer or as an ERROR event): list again, and tell subscribers only what differs from the
  store, so that a relist after a long disconnection shows up as ordinary ADDED/MODIFIED/DELETED events;
- any other error: wait with exponential backoff and full jitter, then resume.

Subscribers are plain functions `fn(event_type, obj)` called in the informer's task; they must not block (they put
keys in a queue or set a flag). `Informers` hands out one informer per selection, so the feed and every reconciler
share the same watches, and owns their tasks.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Callable

from control.kube import ApiError, Gone, KubeSession, Resource

log = logging.getLogger("peering.control.watch")

Subscriber = Callable[[str, dict], None]


def object_key(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name', '')}" if ns else meta.get("name", "")


def diff_stores(old: dict[str, dict], new: dict[str, dict]) -> list[tuple[str, dict]]:
    """The events that turn `old` into `new`, by key, judged by resourceVersion (pure; used on relist)."""
    events: list[tuple[str, dict]] = []
    for key, obj in new.items():
        before = old.get(key)
        if before is None:
            events.append(("ADDED", obj))
        elif _rv(before) != _rv(obj):
            events.append(("MODIFIED", obj))
    for key, obj in old.items():
        if key not in new:
            events.append(("DELETED", obj))
    return events


def _rv(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("resourceVersion", "")


class JitteredBackoff:
    """Exponential backoff with "equal jitter": a random delay in [c/2, c] where c = min(cap, base*2**n), so that
    replicas that failed together do not retry together, yet none retries at once."""

    def __init__(self, base: float = 0.2, cap: float = 30.0, rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = cap
        self.attempts = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        ceiling = min(self.cap, self.base * (2 ** min(self.attempts, 30)))
        self.attempts += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempts = 0


class Informer:
    """One resumable list+watch with its store; `start()` it, await `synced`, read `store`/`get`/`items`."""

    def __init__(self, kube: KubeSession, resource: Resource, *, namespace: str | None = None,
                 label_selector: str | None = None, field_selector: str | None = None,
                 watch_timeout: int = 300, backoff: JitteredBackoff | None = None) -> None:
        self.kube = kube
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_timeout = watch_timeout
        self.backoff = backoff or JitteredBackoff()
        self.store: dict[str, dict] = {}
        self.resource_version: str | None = None
        self.synced = asyncio.Event()
        self.lists = 0
        self.watches = 0
        self.last_error: str | None = None
        self._subscribers: list[Subscriber] = []
        self._task: asyncio.Task | None = None

    @property
    def description(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        sel = f" ({self.label_selector})" if self.label_selector else ""
        return f"{self.resource.plural}{where}{sel}"

    def get(self, name: str, namespace: str | None = None) -> dict | None:
        return self.store.get(f"{namespace}/{name}" if namespace else name)

    def items(self) -> list[dict]:
        return list(self.store.values())

    def subscribe(self, fn: Subscriber, *, replay: bool = False) -> Callable[[], None]:
        """Call `fn(event_type, obj)` on every change from now on; `replay` first sends ADDED for every object
        already in the store. Returns the function that unsubscribes."""
        self._subscribers.append(fn)
        if replay:
            for obj in list(self.store.values()):
                fn("ADDED", obj)

        def unsubscribe() -> None:
            if fn in self._subscribers:
                self._subscribers.remove(fn)
        return unsubscribe

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"informer-{self.description}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _emit(self, event_type: str, obj: dict) -> None:
        for fn in list(self._subscribers):
            try:
                fn(event_type, obj)
            except Exception as exc:  # one broken subscriber must not stop the cache of everyone else
                log.error("informer subscriber failed", extra={"informer": self.description,
                                                              "error": f"{type(exc).__name__}: {exc}"})

    async def _run(self) -> None:
        # A restarted informer resumes from where it stopped; a 410 makes it list again.
        need_list = self.resource_version is None
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                await self._watch()
                # The server ended the stream cleanly: resume from the last resourceVersion, no backoff.
                self.backoff.reset()
            except asyncio.CancelledError:
                raise
            except Gone:
                log.info("watch expired, listing again", extra={"informer": self.description})
                need_list = True
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                delay = self.backoff.next()
                log.warning("watch failed, retrying", extra={"informer": self.description,
                                                            "error": self.last_error, "retry_in": round(delay, 3)})
                # A failed list leaves need_list set; a failed watch resumes from the last resourceVersion.
                await asyncio.sleep(delay)

    async def _list(self) -> None:
        answer = await self.kube.list(self.resource, self.namespace, label_selector=self.label_selector,
                                      field_selector=self.field_selector)
        self.lists += 1
        new = {object_key(obj): _typed(self.resource, obj) for obj in answer.get("items") or []}
        old, self.store = self.store, new
        self.resource_version = (answer.get("metadata") or {}).get("resourceVersion") or None
        for event_type, obj in diff_stores(old, new):
            self._emit(event_type, obj)
        self.last_error = None
        self.synced.set()

    async def _watch(self) -> None:
        self.watches += 1
        async for event in self.kube.watch(self.resource, self.namespace, resource_version=self.resource_version,
                                           label_selector=self.label_selector,
                                           field_selector=self.field_selector, timeout_seconds=self.watch_timeout):
            event_type = event.get("type")
            obj = event.get("object") or {}
            if event_type == "ERROR":
                code = int(obj.get("code") or 0)
                if code == 410:
                    raise Gone(410, obj.get("reason") or "Expired", obj.get("message") or "too old resource version")
                raise ApiError(code, obj.get("reason") or "WatchError", obj.get("message") or "watch error", obj)
            rv = _rv(obj)
            if event_type == "BOOKMARK":
                if rv:
                    self.resource_version = rv
                continue
            if event_type not in ("ADDED", "MODIFIED", "DELETED"):
                continue
            obj = _typed(self.resource, obj)
            key = object_key(obj)
            if event_type == "DELETED":
                self.store.pop(key, None)
            else:
                before = self.store.get(key)
                self.store[key] = obj
                if before is not None and _rv(before) == rv:
                    if rv:
                        self.resource_version = rv
                    continue
                event_type = "MODIFIED" if before is not None else "ADDED"
            if rv:
                self.resource_version = rv
            self.backoff.reset()
            self._emit(event_type, obj)


def _typed(resource: Resource, obj: dict) -> dict:
    # List items come without apiVersion/kind; reconcilers and the registry like to see them.
    if obj.get("kind") and obj.get("apiVersion"):
        return obj
    return {"apiVersion": resource.api_version, "kind": resource.kind, **obj}


class ObjectPoller:
    """One named object kept current by GET, for objects the process may `get` but not list or watch (the
    cluster UUID ConfigMap in kube-system: least privilege there is a Role with `get` on that one name).

    It looks like an `Informer` to its readers (store, get, items, synced, subscribe); `synced` is set after the
    first answer, found or not. Changes show up within `interval` seconds; a missing object or an error is
    retried sooner, with backoff."""

    def __init__(self, kube: KubeSession, resource: Resource, name: str, *, namespace: str | None = None,
                 interval: float = 60.0, backoff: JitteredBackoff | None = None) -> None:
        self.kube = kube
        self.resource = resource
        self.name = name
        self.namespace = namespace
        self.interval = interval
        self.backoff = backoff or JitteredBackoff(cap=min(30.0, interval))
        self.store: dict[str, dict] = {}
        self.synced = asyncio.Event()
        self.gets = 0
        self.last_error: str | None = None
        self._subscribers: list[Subscriber] = []
        self._task: asyncio.Task | None = None

    @property
    def description(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.resource.plural} {where}{self.name}"

    get = Informer.get
    items = Informer.items
    subscribe = Informer.subscribe
    _emit = Informer._emit
    start = Informer.start
    stop = Informer.stop

    async def _run(self) -> None:
        key = f"{self.namespace}/{self.name}" if self.namespace else self.name
        while True:
            delay = self.interval
            try:
                obj = await self.kube.get_or_none(self.resource, self.name, self.namespace)
                self.gets += 1
                self.last_error = None
                before = self.store.get(key)
                if obj is None:
                    delay = self.backoff.next()
                    if before is not None:
                        del self.store[key]
                        self._emit("DELETED", before)
                else:
                    self.backoff.reset()
                    obj = _typed(self.resource, obj)
                    self.store[key] = obj
                    if before is None:
                        self._emit("ADDED", obj)
                    elif _rv(before) != _rv(obj):
                        self._emit("MODIFIED", obj)
                self.synced.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                delay = self.backoff.next()
                log.warning("reading an object failed, retrying", extra={"object": self.description,
                                                                       "error": self.last_error,
                                                                       "retry_in": round(delay, 3)})
            await asyncio.sleep(delay)
