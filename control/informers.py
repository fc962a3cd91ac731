"""The process's informers: one per selection, shared by the feed and every reconciler, and owned here.

Plain resources get an `Informer` (or an `ObjectPoller` for one named object we may only get); the APIs of other
modules that a cluster may not serve get an `OptionalInformer` (`control.optional`), which never holds the
process back while its API is absent.
"""

from __future__ import annotations

import asyncio

from control.kube import KubeSession, Resource
from control.optional import RECHECK_SECONDS, OptionalApi, OptionalInformer
from control.watch import Informer, ObjectPoller


class Informers:
    """The process's informers, one per (resource, namespace, selectors); owns and stops their tasks."""

    def __init__(self, kube: KubeSession, *, watch_timeout: int = 300,
                 optional_recheck: float = RECHECK_SECONDS) -> None:
        self.kube = kube
        self.watch_timeout = watch_timeout
        self.optional_recheck = optional_recheck
        self._informers: dict[tuple, Informer | ObjectPoller | OptionalInformer] = {}
        self._started = False

    def get(self, resource: Resource | OptionalApi, *, namespace: str | None = None,
            label_selector: str | None = None, field_selector: str | None = None) -> Informer | OptionalInformer:
        """The shared informer of this selection; created (and started, if the others run) on first use. An
        `OptionalApi` gets an `OptionalInformer` (cluster-wide, no selectors)."""
        key = (resource, namespace, label_selector, field_selector)
        informer = self._informers.get(key)
        if informer is None and isinstance(resource, OptionalApi):
            informer = OptionalInformer(
                self.kube, resource, recheck=self.optional_recheck,
                make_informer=lambda r: Informer(self.kube, r, watch_timeout=self.watch_timeout))
            self._informers[key] = informer
            if self._started:
                informer.start()
        elif informer is None:
            informer = Informer(self.kube, resource, namespace=namespace, label_selector=label_selector,
                                field_selector=field_selector, watch_timeout=self.watch_timeout)
            self._informers[key] = informer
            if self._started:
                informer.start()
        return informer

    def get_object(self, resource: Resource, name: str, *, namespace: str | None = None,
                   interval: float = 60.0) -> ObjectPoller:
        """The shared poller of one named object (see `ObjectPoller`: for objects we may get but not watch)."""
        key = ("object", resource, namespace, name)
        poller = self._informers.get(key)
        if poller is None:
            poller = ObjectPoller(self.kube, resource, name, namespace=namespace, interval=interval)
            self._informers[key] = poller
            if self._started:
                poller.start()
        return poller

    def __iter__(self):
        return iter(list(self._informers.values()))

    def start(self) -> None:
        self._started = True
        for informer in self._informers.values():
            informer.start()

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in list(self._informers.values())))

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self._informers.values())

    async def stop(self) -> None:
        self._started = False
        await asyncio.gather(*(i.stop() for i in self._informers.values()))
