"""APIs of other modules that a cluster may not serve, and caches of them that never hold the process back.

The module reads two APIs it does not own: multitenancy-manager's `Project` (absent when that module is off) and
user-authn's `TokenExchangeProvider` (absent until user-authn ships it). Either may be missing, served at another
version than we know, or failing. None of that may stop the rest of the module (CA, certificates, invites, joins,
offers, self-check): an absent API is an empty cache that says it is absent, and the part that needs it says why
it waits. When the API appears later, the cache fills and its subscribers hear ADDED events, without a restart.

`served_version` asks discovery which of the versions we understand the API server serves, best first.
`OptionalInformer` looks like an `Informer` to its readers (store, get, items, synced, subscribe) and re-asks
discovery every `recheck` seconds: on a new or changed version it lists and watches that one; when the API is no
longer served (404 from discovery) it empties the store with DELETED events. A discovery that fails (5xx, no
answer) changes nothing: a passing failure of the API server must never look like "every project was deleted".
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Callable

from control.kube import ApiError, KubeSession, NotFound, Resource
from control.watch import Informer, object_key

log = logging.getLogger("peering.control.optional")

#: How often discovery is asked again whether an optional API appeared, changed version or went away.
RECHECK_SECONDS = 15.0


@dataclasses.dataclass(frozen=True)
class OptionalApi:
    """An API of another module: group, plural and kind, and the versions this module understands, best first."""

    group: str
    plural: str
    kind: str
    versions: tuple[str, ...]
    module: str
    """The Deckhouse module that serves it, for messages."""
    namespaced: bool = False

    @property
    def name(self) -> str:
        """The CRD's name, `<plural>.<group>`, as an administrator sees it in `kubectl get crd`."""
        return f"{self.plural}.{self.group}"

    def resource(self, version: str) -> Resource:
        return Resource(self.group, version, self.plural, self.namespaced, self.kind)

    def absent_message(self) -> str:
        return (f"the API server does not serve {self.name} at {' or '.join(self.versions)}; "
                f"enable the {self.module} module (or wait until it serves that API)")


PROJECTS = OptionalApi("deckhouse.io", "projects", "Project", ("v1alpha3", "v1alpha2"), "multitenancy-manager")
"""Deckhouse serves Projects at v1alpha2 and v1alpha3 (storage); v1alpha1 is not served."""
TOKENEXCHANGEPROVIDERS = OptionalApi("deckhouse.io", "tokenexchangeproviders", "TokenExchangeProvider",
                                     ("v1alpha1",), "user-authn")
"""The assumed user-authn contract (docs/user-authn-contract.md)."""


async def served_version(kube: KubeSession, api: OptionalApi) -> str | None:
    """The best version of `api` the API server serves, or None when it serves none of ours (404 or not listed).
    Any other failure raises: it says nothing about whether the API exists."""
    try:
        group = await kube.request("GET", f"/apis/{api.group}")
    except NotFound:
        return None
    served = {v.get("version") for v in group.get("versions") or [] if isinstance(v, dict)}
    for version in api.versions:
        if version not in served:
            continue
        try:
            listing = await kube.request("GET", f"/apis/{api.group}/{version}")
        except NotFound:
            continue
        if any(isinstance(r, dict) and r.get("name") == api.plural for r in listing.get("resources") or []):
            return version
    return None


class OptionalInformer:
    """The cache of an optional API; `available` says whether it is served, `resource` at which version.

    `make_informer(resource)` builds the plain `Informer` that lists and watches one served version."""

    def __init__(self, kube: KubeSession, api: OptionalApi, *, make_informer: Callable[[Resource], Informer],
                 recheck: float = RECHECK_SECONDS) -> None:
        self.kube = kube
        self.api = api
        self.recheck = recheck
        self._make_informer = make_informer
        self.resource: Resource | None = None
        self.store: dict[str, dict] = {}
        self.synced = asyncio.Event()
        self.last_error: str | None = None
        self.discoveries = 0
        self._known = False
        self._inner: Informer | None = None
        self._unsubscribe_inner: Callable[[], None] | None = None
        self._stale: set[str] = set()
        self._subscribers: list = []
        self._task: asyncio.Task | None = None
        self._poke = asyncio.Event()

    @property
    def description(self) -> str:
        return f"{self.api.name} (optional)"

    @property
    def available(self) -> bool | None:
        """True when served, False when discovery says it is not, None before discovery first answered."""
        if not self._known:
            return None
        return self.resource is not None

    get = Informer.get
    items = Informer.items
    subscribe = Informer.subscribe
    _emit = Informer._emit
    start = Informer.start

    def poke(self) -> None:
        """Ask discovery again now rather than at the next recheck."""
        self._poke.set()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._drop_inner()

    async def _run(self) -> None:
        while True:
            try:
                version = await served_version(self.kube, self.api)
                self.discoveries += 1
                self.last_error = None
                await self._follow(version)
                self._known = True
            except asyncio.CancelledError:
                raise
            except (ApiError, OSError, ValueError, asyncio.TimeoutError) as exc:
                # Unknown is not absent: keep what we have.
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("discovery of an optional API failed, keeping what is cached",
                            extra={"api": self.api.name, "error": self.last_error})
            self._settle()
            self._poke.clear()
            waits = [asyncio.ensure_future(self._poke.wait())]
            if self._inner is not None and not self._inner.synced.is_set():
                waits.append(asyncio.ensure_future(self._inner.synced.wait()))
            try:
                await asyncio.wait(waits, timeout=self.recheck, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
            self._settle()

    def _settle(self) -> None:
        """Synced once discovery answered (or failed: an empty cache must not hold the process back) and, when
        the API is served, once its first list is in; objects of a previous version not listed again go."""
        if self._inner is None:
            self.synced.set()
            return
        if self._inner.synced.is_set():
            for key in list(self._stale):
                obj = self.store.pop(key, None)
                if obj is not None:
                    self._emit("DELETED", obj)
            self._stale.clear()
            self.synced.set()

    async def _follow(self, version: str | None) -> None:
        want = self.api.resource(version) if version else None
        if want == self.resource:
            return
        log.info("optional API served" if want else "optional API not served",
                 extra={"api": self.api.name, "version": version or "", "before": getattr(self.resource, "version", "")})
        await self._drop_inner()
        self.resource = want
        if want is None:
            for key in list(self.store):
                self._emit("DELETED", self.store.pop(key))
            return
        self._stale = set(self.store)
        inner = self._make_informer(want)

        def forward(event_type: str, obj: dict) -> None:
            key = object_key(obj)
            self._stale.discard(key)
            if event_type == "DELETED":
                self.store.pop(key, None)
            else:
                self.store[key] = obj
            self._emit(event_type, obj)

        self._inner = inner
        self._unsubscribe_inner = inner.subscribe(forward)
        inner.start()

    async def _drop_inner(self) -> None:
        inner, self._inner = self._inner, None
        if self._unsubscribe_inner is not None:
            self._unsubscribe_inner()
            self._unsubscribe_inner = None
        if inner is not None:
            await inner.stop()
