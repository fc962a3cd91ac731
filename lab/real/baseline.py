"""What a real API server holds, and bringing it back to that, as a new emulator would start.

    base = Baseline.of(api)          # every object there is now (api: lab/real/api.py's HttpApi)
    now = await base.reset(api)      # delete every object made since; returns what is there once they are gone
    base.changed(now)                # what of the baseline is gone or was changed since ([] when nothing)

Shared by the tests of a module (lab/testing.py `RealApiserverAlone`) and by the lab clusters of one process
(lab/real/pool.py). A reset deletes with background propagation and takes finalizers off first, since what would
remove them (the peering process, a test's controller) is stopped by then; a CustomResourceDefinition keeps its
own finalizer, so that kube-apiserver deletes its objects before it, and a CRD installed again later finds none.
Leases in the baseline's namespaces are the control plane's own (its components renew them, and remake one that
is deleted), so a reset leaves them, and `changed` does not count what the control plane itself keeps rewriting
(leases, endpoints, the API priority and fairness objects' status, events).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from lab.apiserver.errors import ApiError
from lab.real.api import AGGREGATED

#: Resources whose objects the control plane rewrites by itself, by (group, plural): not a change a test made.
SELF_KEPT = {("coordination.k8s.io", "leases"), ("", "endpoints"), ("discovery.k8s.io", "endpointslices"),
             ("", "events"), ("events.k8s.io", "events"), ("flowcontrol.apiserver.k8s.io", "flowschemas"),
             ("flowcontrol.apiserver.k8s.io", "prioritylevelconfigurations")}
CRD = ("apiextensions.k8s.io", "customresourcedefinitions")


@dataclasses.dataclass(frozen=True)
class Stored:
    path: str
    resource: tuple[str, str]
    namespace: str
    resource_version: str
    finalizers: bool


def collections(api: Any) -> list[tuple[str, str, str]]:
    """(group, plural, collection path) of every resource that can be listed and deleted from, cluster-wide."""
    out: dict[tuple[str, str], str] = {}
    for root in ("/api", "/apis"):
        doc = api.request("GET", root, accept=AGGREGATED)
        for group in doc.get("items") or []:
            name = (group.get("metadata") or {}).get("name", "")
            # Each resource in the first version that serves it (the preferred one is listed first): a group's
            # versions need not serve the same resources.
            for version in group.get("versions") or []:
                prefix = f"/apis/{name}/{version['version']}" if name else f"/api/{version['version']}"
                for r in version.get("resources") or []:
                    if {"list", "delete"} <= set(r.get("verbs") or []):
                        out.setdefault((name, r["resource"]), f"{prefix}/{r['resource']}")
    return [(group, plural, path) for (group, plural), path in out.items()]


def objects(api: Any) -> dict[str, Stored]:
    """Every object there is, by uid."""
    found: dict[str, Stored] = {}
    for group, plural, path in collections(api):
        for obj in api.request("GET", path).get("items") or []:
            meta = obj.get("metadata") or {}
            ns = meta.get("namespace") or ""
            where = f"{path.rsplit('/', 1)[0]}/namespaces/{ns}/{plural}" if ns else path
            found[meta["uid"]] = Stored(f"{where}/{meta['name']}", (group, plural), ns,
                                        meta.get("resourceVersion", ""), bool(meta.get("finalizers")))
    return found


@dataclasses.dataclass
class Baseline:
    """The objects an API server held when it was taken, by uid."""

    stored: dict[str, Stored]

    @classmethod
    def of(cls, api: Any) -> "Baseline":
        return cls(objects(api))

    @property
    def namespaces(self) -> set[str]:
        return {s.path.rsplit("/", 1)[1] for s in self.stored.values() if s.resource == ("", "namespaces")}

    def made_since(self, now: dict[str, Stored]) -> list[Stored]:
        """What `now` holds that the baseline did not, but the control plane's own leases."""
        kept = self.namespaces
        return [s for uid, s in now.items() if uid not in self.stored
                and not (s.resource == ("coordination.k8s.io", "leases") and s.namespace in kept)]

    def changed(self, now: dict[str, Stored]) -> list[str]:
        """The paths of baseline objects that `now` (`objects`) no longer holds, or holds changed (what the control
        plane keeps rewriting aside): where a reset cannot bring the server back."""
        out = []
        for uid, s in self.stored.items():
            if s.resource in SELF_KEPT:
                continue
            if uid not in now:
                out.append(f"{s.path} (deleted)")
            elif now[uid].resource_version != s.resource_version:
                out.append(f"{s.path} (changed)")
        return sorted(out)

    async def reset(self, api: Any, timeout: float = 60.0) -> dict[str, Stored]:
        """Delete every object made since the baseline and return what is there once they are all gone;
        TimeoutError naming what is left after `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                now = await asyncio.to_thread(objects, api)
            except ApiError as e:
                # Right after kube-apiserver restarted, a whole list is 429 until that resource's watch cache is
                # filled again.
                if e.code != 429 or loop.time() > deadline:
                    raise
                await asyncio.sleep(0.1)
                continue
            made = self.made_since(now)
            if not made:
                return now
            if loop.time() > deadline:
                raise TimeoutError(f"{len(made)} objects are still there {timeout:.0f} s after they were deleted: "
                                   + ", ".join(sorted(s.path for s in made)[:10]))
            # Objects before CRDs: a CRD's own finalizer then finds fewer of its objects to delete.
            for s in sorted(made, key=lambda s: s.resource == CRD):
                try:
                    if s.finalizers and s.resource != CRD:
                        await asyncio.to_thread(api.request, "PATCH", s.path, {"metadata": {"finalizers": None}},
                                                content_type="application/merge-patch+json")
                    await asyncio.to_thread(api.request, "DELETE", s.path, {
                        "apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"})
                except ApiError as e:
                    if e.code not in (404, 409):
                        raise
            # Bounded poll: a namespace goes once kube-controller-manager has emptied it, which says nothing.
            await asyncio.sleep(0.1)
