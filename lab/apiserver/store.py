"""Versioned in-memory storage with watch, the emulator's etcd plus watch cache.

Stored objects are never changed in place: every write stores a new dict, so readers may hand out the stored
dict without copying and a watcher's queue holds references, not copies. One resourceVersion counter spans all
resources, as etcd's revision does; each resource keeps a bounded history of events for watches that resume."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Callable

from lab.apiserver import errors

DEFAULT_HISTORY = 1000
DEFAULT_WATCH_QUEUE = 1000


@dataclass(frozen=True)
class Event:
    rv: int
    type: str            # ADDED, MODIFIED, DELETED
    obj: dict
    old: dict | None     # the object before a MODIFIED, so selectors can turn it into ADDED or DELETED


class Watcher:
    """One watch stream: a bounded queue filled synchronously by writes, drained by the HTTP handler."""

    def __init__(self, namespace: str | None, predicate: Callable[[dict], bool] | None, maxsize: int) -> None:
        self.namespace = namespace
        self.predicate = predicate
        self.queue: asyncio.Queue[tuple[str, dict]] = asyncio.Queue(maxsize)
        # A watcher that falls a whole queue behind is dropped with an Expired error rather than stall writers.
        self.overflowed = False
        # The resource stopped being served (its CRD was deleted): the stream ends once its queue is drained.
        self.closed = False

    def _visible(self, obj: dict | None) -> bool:
        if obj is None:
            return False
        if self.namespace is not None and obj.get("metadata", {}).get("namespace") != self.namespace:
            return False
        return self.predicate is None or self.predicate(obj)

    def translate(self, ev: Event) -> tuple[str, dict] | None:
        """The event this watcher sees: with a selector an object moving in or out shows as ADDED or DELETED."""
        now = self._visible(ev.obj)
        if ev.type == "MODIFIED" and self.predicate is not None:
            before = self._visible(ev.old)
            if now and not before:
                return ("ADDED", ev.obj)
            if before and not now:
                return ("DELETED", ev.obj)
        return (ev.type, ev.obj) if now else None

    def offer(self, ev: Event) -> None:
        if self.overflowed:
            return
        item = self.translate(ev)
        if item is None:
            return
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.overflowed = True


class Collection:
    """The objects of one resource (all served versions), their recent events and their watchers."""

    def __init__(self, history: int) -> None:
        self.objects: dict[tuple[str, str], dict] = {}
        # Reads far outnumber writes (the RBAC check of every request lists the bindings of its namespace), so
        # lists come from a per-namespace index and a sorted view kept until the next write, not from sorting
        # every object of the resource on each call.
        self.by_namespace: dict[str, dict[str, dict]] = {}
        self._sorted: list[dict] | None = None
        self.history: deque[Event] = deque(maxlen=history)
        self.truncated_rv = 0          # resourceVersion of the newest event no longer in history
        self.watchers: set[Watcher] = set()

    def set(self, ns: str, name: str, obj: dict) -> None:
        self.objects[(ns, name)] = obj
        self.by_namespace.setdefault(ns, {})[name] = obj
        self._sorted = None

    def pop(self, ns: str, name: str) -> None:
        self.objects.pop((ns, name), None)
        names = self.by_namespace.get(ns)
        if names is not None:
            names.pop(name, None)
            if not names:
                del self.by_namespace[ns]
        self._sorted = None

    def listed(self, namespace: str | None) -> list[dict]:
        """The objects (of one namespace, or all) in (namespace, name) order, as a new list."""
        if namespace is not None:
            names = self.by_namespace.get(namespace)
            return [names[n] for n in sorted(names)] if names else []
        if self._sorted is None:
            self._sorted = [o for _, o in sorted(self.objects.items(), key=lambda kv: kv[0])]
        return list(self._sorted)

    def record(self, ev: Event) -> None:
        if len(self.history) == self.history.maxlen:
            self.truncated_rv = self.history[0].rv
        self.history.append(ev)
        for w in list(self.watchers):
            w.offer(ev)
            if w.overflowed:
                self.watchers.discard(w)


class Store:
    def __init__(self, history: int = DEFAULT_HISTORY, watch_queue: int = DEFAULT_WATCH_QUEUE) -> None:
        self._rv = itertools.count(1)
        self.current_rv = 0
        self._history = history
        self._watch_queue = watch_queue
        self._collections: dict[tuple[str, str], Collection] = {}
        self.by_uid: dict[str, tuple[tuple[str, str], str, str]] = {}
        # Called with (key, event) after every write; the garbage collector and CRD registration listen here.
        self.listeners: list[Callable[[tuple[str, str], Event], None]] = []

    def collection(self, key: tuple[str, str]) -> Collection:
        c = self._collections.get(key)
        if c is None:
            c = self._collections[key] = Collection(self._history)
        return c

    def next_rv(self) -> int:
        self.current_rv = next(self._rv)
        return self.current_rv

    # ------------------------------------------------------------ reads

    def get(self, key: tuple[str, str], namespace: str | None, name: str) -> dict | None:
        c = self._collections.get(key)
        return c.objects.get((namespace or "", name)) if c else None

    def list(self, key: tuple[str, str], namespace: str | None = None) -> list[dict]:
        c = self._collections.get(key)
        if not c:
            return []
        return c.listed(namespace)

    def keys(self) -> list[tuple[str, str]]:
        return list(self._collections)

    def lookup_uid(self, uid: str) -> dict | None:
        where = self.by_uid.get(uid)
        if not where:
            return None
        key, ns, name = where
        return self.get(key, ns, name)

    # ------------------------------------------------------------ writes

    def put(self, key: tuple[str, str], obj: dict, old: dict | None) -> dict:
        """Store obj (a new dict the caller hands over) with a fresh resourceVersion; ADDED or MODIFIED."""
        rv = self.next_rv()
        meta = dict(obj["metadata"])
        meta["resourceVersion"] = str(rv)
        obj["metadata"] = meta
        ns = meta.get("namespace") or ""
        c = self.collection(key)
        c.set(ns, meta["name"], obj)
        if meta.get("uid"):
            self.by_uid[meta["uid"]] = (key, ns, meta["name"])
        ev = Event(rv, "MODIFIED" if old is not None else "ADDED", obj, old)
        c.record(ev)
        for listener in list(self.listeners):
            listener(key, ev)
        return obj

    def remove(self, key: tuple[str, str], obj: dict) -> dict:
        rv = self.next_rv()
        meta = obj["metadata"]
        ns = meta.get("namespace") or ""
        c = self.collection(key)
        c.pop(ns, meta["name"])
        self.by_uid.pop(meta.get("uid", ""), None)
        gone = dict(obj)
        gone["metadata"] = dict(meta, resourceVersion=str(rv))
        ev = Event(rv, "DELETED", gone, obj)
        c.record(ev)
        for listener in list(self.listeners):
            listener(key, ev)
        return gone

    def start_history(self, key: tuple[str, str]) -> None:
        """A resource is served from now on (its CRD was made or changed): like kube-apiserver's watch cache,
        which starts from a list at this moment, a watch from an earlier resourceVersion is too old (410)."""
        c = self.collection(key)
        c.truncated_rv = max(c.truncated_rv, self.current_rv)

    def drop_collection(self, key: tuple[str, str]) -> list[dict]:
        """Remove every object of a resource (its CRD went away); watchers see them DELETED."""
        c = self._collections.get(key)
        if not c:
            return []
        return [self.remove(key, o) for o in list(c.objects.values())]

    # ------------------------------------------------------------ watch

    def watch(self, key: tuple[str, str], namespace: str | None, predicate, resource_version: int | None,
              initial: list[dict] | None = None) -> Watcher:
        """Register a watcher; replay history after resource_version (410 if it is too old), or, without one,
        start with ADDED for each of `initial`. Registration and replay happen without yielding to the loop,
        so no write falls between them."""
        c = self.collection(key)
        w = Watcher(namespace, predicate, self._watch_queue)
        backlog: list[tuple[str, dict]] = []
        if resource_version is not None and resource_version > 0:
            if resource_version < c.truncated_rv:
                raise errors.gone(f"too old resource version: {resource_version} ({c.truncated_rv})")
            for ev in c.history:
                if ev.rv > resource_version:
                    item = w.translate(ev)
                    if item:
                        backlog.append(item)
        else:
            for obj in initial or ():
                if w._visible(obj):
                    backlog.append(("ADDED", obj))
        if len(backlog) >= w.queue.maxsize:
            w.queue = asyncio.Queue(len(backlog) + self._watch_queue)
        for item in backlog:
            w.queue.put_nowait(item)
        c.watchers.add(w)
        return w

    def close_watchers(self, key: tuple[str, str]) -> None:
        """End every watch of a resource after the events already queued (its CRD went away)."""
        c = self._collections.get(key)
        if not c:
            return
        for w in list(c.watchers):
            try:
                w.queue.put_nowait(None)
                w.closed = True
            except asyncio.QueueFull:
                w.overflowed = True
        c.watchers.clear()

    def unwatch(self, key: tuple[str, str], w: Watcher) -> None:
        c = self._collections.get(key)
        if c:
            c.watchers.discard(w)
