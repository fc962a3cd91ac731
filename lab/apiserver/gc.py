"""The controllers kube-controller-manager runs that the module depends on: the garbage collector
(ownerReferences, with background, foreground and orphan propagation) and the namespace controller
(a deleted namespace is emptied, then removed). They run as one background task fed by store events, so like
the real ones they act shortly after the write that triggered them, not inside it."""

from __future__ import annotations

import asyncio
import logging

from lab.apiserver import errors
from lab.apiserver.crud import CRD_KEY, FOREGROUND, NAMESPACE_KEY, ORPHAN, Objects
from lab.apiserver.store import Event

log = logging.getLogger(__name__)


def owner_uids(obj: dict | None) -> set[str]:
    if not obj:
        return set()
    return {r["uid"] for r in obj.get("metadata", {}).get("ownerReferences") or () if isinstance(r, dict)
            and r.get("uid")}


class GarbageCollector:
    def __init__(self, objects: Objects) -> None:
        self.objects = objects
        self.store = objects.store
        # owner uid -> {(key, namespace, name)} of the objects that name it
        self.dependents: dict[str, set[tuple[tuple[str, str], str, str]]] = {}
        self._work: asyncio.Queue | None = None
        self._pending: list[tuple] = []
        self._task: asyncio.Task | None = None
        self.store.listeners.append(self._on_event)

    # ------------------------------------------------------------ bookkeeping, synchronous with every write

    def _on_event(self, key: tuple[str, str], ev: Event) -> None:
        meta = ev.obj["metadata"]
        ref = (key, meta.get("namespace") or "", meta["name"])
        before = owner_uids(ev.old) if ev.type != "ADDED" else set()
        after = owner_uids(ev.obj) if ev.type != "DELETED" else set()
        for uid in before - after:
            deps = self.dependents.get(uid)
            if deps is not None:
                deps.discard(ref)
                if not deps:
                    del self.dependents[uid]
        for uid in after - before:
            self.dependents.setdefault(uid, set()).add(ref)
        if key == CRD_KEY:
            if ev.type == "DELETED":
                self.objects.unregister_crd(ev.old or ev.obj)
            else:
                self.objects.register_crd(ev.obj)
        if ev.type == "DELETED":
            self._enqueue(("owner-gone", meta.get("uid", "")))
            for uid in before:
                self._enqueue(("check-owner", uid))   # a foreground owner may be waiting for this one
            if meta.get("namespace"):
                self._enqueue(("namespace", meta["namespace"]))
        else:
            if after - before:
                self._enqueue(("dangling", ref))
            if meta.get("deletionTimestamp"):
                finalizers = meta.get("finalizers") or ()
                if FOREGROUND in finalizers or ORPHAN in finalizers:
                    self._enqueue(("check-owner", meta.get("uid", "")))
                if key == NAMESPACE_KEY:
                    self._enqueue(("namespace", meta["name"]))

    def _enqueue(self, item: tuple) -> None:
        if self._work is None:
            self._pending.append(item)
        else:
            self._work.put_nowait(item)

    # ------------------------------------------------------------ the controller task

    def start(self) -> None:
        self._work = asyncio.Queue()
        for item in self._pending:
            self._work.put_nowait(item)
        self._pending.clear()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="apiserver-gc")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._work = None

    async def _run(self) -> None:
        assert self._work is not None
        while True:
            item = await self._work.get()
            try:
                self.process(item)
            except errors.ApiError as exc:
                # Another writer got there first (gone, conflict); the next event brings the work back if needed.
                log.debug("garbage collector: %s: %s", item[0], exc.message)
            except Exception:
                log.exception("garbage collector failed on %s", item[0])

    def _info(self, key: tuple[str, str]):
        return self.objects.registry.any_version(*key)

    def _get(self, ref):
        key, ns, name = ref
        return self.store.get(key, ns or None, name)

    def process(self, item: tuple) -> None:
        kind = item[0]
        if kind == "owner-gone":
            self._owner_gone(item[1])
        elif kind == "check-owner":
            self._check_owner(item[1])
        elif kind == "dangling":
            self._dangling(item[1])
        elif kind == "namespace":
            self._namespace(item[1])

    def _delete(self, ref, propagation: str | None = None) -> None:
        info = self._info(ref[0])
        if info is None or self._get(ref) is None:
            return
        try:
            self.objects.delete(info, ref[1] or None, ref[2], propagation=propagation)
        except errors.ApiError as exc:
            if exc.code != 404:
                raise

    def _owner_gone(self, uid: str) -> None:
        """Owner deleted: dependents with no other live owner go too; the others just lose the reference."""
        for ref in list(self.dependents.get(uid, ())):
            obj = self._get(ref)
            if obj is None:
                continue
            others = owner_uids(obj) - {uid}
            if any(self.store.lookup_uid(o) is not None for o in others):
                info = self._info(ref[0])
                if info:
                    self.objects.drop_owner_reference(info, obj, uid)
            else:
                self._delete(ref)

    def _check_owner(self, uid: str) -> None:
        """An owner being deleted in the foreground waits for its dependents; an orphaning one frees them."""
        owner = self.store.lookup_uid(uid)
        if owner is None or not owner["metadata"].get("deletionTimestamp"):
            return
        key = self.store.by_uid[uid][0]
        info = self._info(key)
        finalizers = owner["metadata"].get("finalizers") or ()
        deps = [r for r in self.dependents.get(uid, ()) if self._get(r) is not None]
        if ORPHAN in finalizers:
            for ref in deps:
                dep_info = self._info(ref[0])
                if dep_info:
                    self.objects.drop_owner_reference(dep_info, self._get(ref), uid)
            self.objects.remove_finalizer(info, owner, ORPHAN)
            return
        if FOREGROUND in finalizers:
            if not deps:
                self.objects.remove_finalizer(info, owner, FOREGROUND)
                return
            for ref in deps:
                dep = self._get(ref)
                if dep is not None and not dep["metadata"].get("deletionTimestamp"):
                    self._delete(ref, "Foreground")

    def _dangling(self, ref) -> None:
        """A dependent created for an owner that does not exist is collected, as the real collector does."""
        obj = self._get(ref)
        if obj is None:
            return
        uids = owner_uids(obj)
        if uids and all(self.store.lookup_uid(u) is None for u in uids):
            self._delete(ref)

    def _namespace(self, name: str) -> None:
        ns = self.store.get(NAMESPACE_KEY, None, name)
        if ns is None or not ns["metadata"].get("deletionTimestamp"):
            return
        remaining = False
        for key in self.store.keys():
            info = self._info(key)
            if info is None or not info.namespaced:
                continue
            for obj in self.store.list(key, name):
                remaining = True
                if not obj["metadata"].get("deletionTimestamp"):
                    self._delete((key, name, obj["metadata"]["name"]))
        if not remaining or not any(self.store.list(k, name) for k in self.store.keys()
                                    if (i := self._info(k)) is not None and i.namespaced):
            self.objects.finalize_namespace(name)
