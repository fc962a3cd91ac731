"""The grants reconciler: what follows from a ClusterPeer's status for the objects of this cluster, kept apart
from the ClusterPeer pass so that hundreds of Roles never delay a pull or a status.

For an established peering (phase Active with the peer's offer in status.peer), what `rules.entitlements` derives
from it: Roles and RoleBindings in every namespace of every paired project and ClusterRoles and
ClusterRoleBindings per effective capability, and one ProjectPeer per pair (`rules.projects`), PeerUnreachable while the ClusterPeer's Ready
says the peer cannot be reached. Everything else (not established, or phase Error) has none; objects of a deleted
ClusterPeer go by garbage collection. Only differences are written, with bounded concurrency.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Iterable

from contract.names import MANAGED_BY_SELECTOR
from control.facts import Discovery
from control.kube import (CLUSTERPEERS, CLUSTERROLEBINDINGS, CLUSTERROLES, NAMESPACES, PEERINGCAPABILITIES,
                          PROJECTPEERS, ROLEBINDINGS, ROLES, AlreadyExists, Conflict, KubeSession, NotFound)
from control.optional import PROJECTS
from control.rules import conditions as cond
from control.rules import events as event_rules
from control.rules import grants as grants_rules
from control.rules import projects as project_rules
from control.rules.capabilities import validated_capabilities
from control.rules.entitlements import NONE, entitlements
from control.rules.ownership import owner_names
from control.workqueue import Result, Watch, key_of

if TYPE_CHECKING:
    from control.context import Context

NAME = "grants"
RBAC_KINDS = {"Role": ROLES, "RoleBinding": ROLEBINDINGS, "ClusterRole": CLUSTERROLES,
              "ClusterRoleBinding": CLUSTERROLEBINDINGS}
#: Writes of one pass in flight at once (hundreds of Roles for a peer with many projects).
WRITE_CONCURRENCY = 16
#: Ready reasons under which the ProjectPeers say PeerUnreachable.
UNREACHABLE_REASONS = frozenset({cond.PEER_UNREACHABLE, cond.PEER_REFUSED_CERTIFICATE})


async def bounded(fn, items: list, limit: int = WRITE_CONCURRENCY) -> None:
    """`await fn(item)` for every item with at most `limit` in flight (coroutines are made only when a slot is
    free, so a cancelled pass leaves none un-awaited); the first failure is raised after all finished."""
    if not items:
        return
    gate = asyncio.Semaphore(limit)

    async def one(item):
        async with gate:
            return await fn(item)
    results = await asyncio.gather(*(one(i) for i in items), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r


def established(cp: dict) -> bool:
    """Whether the ClusterPeer's own status says the peering is established and the peer's offer is known."""
    status = cp.get("status") or {}
    peer = status.get("peer")
    return status.get("phase") == cond.ACTIVE and isinstance(peer, dict) and bool(peer.get("clusterUUID"))


class GrantsReconciler:
    name = NAME

    def __init__(self, ctx: "Context", *, discovery: Discovery | None = None, projects_resource=PROJECTS) -> None:
        self.kube: KubeSession = ctx.kube
        self.events = ctx.events
        self.discovery = discovery or ctx.discovery
        inf = ctx.informers
        self.clusterpeers = inf.get(CLUSTERPEERS)
        self.capabilities = inf.get(PEERINGCAPABILITIES)
        self.namespaces = inf.get(NAMESPACES)
        self.projects = inf.get(projects_resource)
        self.projectpeers = inf.get(PROJECTPEERS, label_selector=MANAGED_BY_SELECTOR)
        self.rbac = {kind: inf.get(res, label_selector=MANAGED_BY_SELECTOR) for kind, res in RBAC_KINDS.items()}
        every = self._every_key
        owned = self._owner_keys
        self.watches = (
            Watch(CLUSTERPEERS),
            Watch(PEERINGCAPABILITIES, keys=every),
            Watch(NAMESPACES, keys=every),
            Watch(projects_resource, keys=every),
            Watch(PROJECTPEERS, label_selector=MANAGED_BY_SELECTOR, keys=owned),
            *(Watch(res, label_selector=MANAGED_BY_SELECTOR, keys=owned) for res in RBAC_KINDS.values()),
        )

    def _every_key(self, event: str, obj: dict) -> Iterable[str]:
        return [key_of(cp) for cp in self.clusterpeers.items()]

    def _owner_keys(self, event: str, obj: dict) -> Iterable[str]:
        return owner_names(obj)

    async def reconcile(self, key: str) -> Result:
        cp = self.clusterpeers.get(key)
        if cp is None or (cp.get("metadata") or {}).get("deletionTimestamp"):
            return Result()  # garbage collection removes what it owned
        await self.discovery.refresh()
        derived, project_peers = NONE, []
        if established(cp):
            status = cp["status"]
            peer = status["peer"]
            derived = entitlements(
                cp, peer=peer,
                local_capabilities=validated_capabilities(self.capabilities.items(), self.discovery.namespaced),
                local_projects=project_rules.local_projects(self.projects.items(), self.namespaces.items()))
            ready = cond.get_condition(status.get("conditions"), cond.READY) or {}
            unreachable = ready.get("reason") in UNREACHABLE_REASONS
            project_peers = project_rules.desired_project_peers(
                cp, peer["clusterUUID"], derived.pairs, derived.effective.effective, reachable=not unreachable,
                reason=str(ready.get("reason") or "") if unreachable else "",
                message=str(ready.get("message") or "") if unreachable else "")
        await self._apply_grants(key, derived.grants.objects)
        await self._apply_project_peers(key, project_peers)
        return Result()

    def _existing_rbac(self, clusterpeer: str) -> list[dict]:
        out = []
        for informer in self.rbac.values():
            out.extend(o for o in informer.items() if clusterpeer in owner_names(o))
        return out

    async def _apply_grants(self, key: str, desired: list[dict]) -> None:
        diff = grants_rules.diff_objects(desired, self._existing_rbac(key), key)

        async def delete(obj: dict) -> None:
            meta = obj.get("metadata") or {}
            try:
                await self.kube.delete(RBAC_KINDS[obj["kind"]], meta["name"], meta.get("namespace"))
            except NotFound:
                pass

        async def create(obj: dict) -> None:
            try:
                await self.kube.create(RBAC_KINDS[obj["kind"]], obj)
            except AlreadyExists:
                pass  # the cache lags our own write; the next pass compares again
            except NotFound:
                pass  # the namespace went away meanwhile; the pair goes with it

        async def update(obj: dict) -> None:
            await self.kube.update(RBAC_KINDS[obj["kind"]], obj)

        await bounded(delete, diff.delete)
        await bounded(create, diff.create)
        await bounded(update, diff.update)

    async def _apply_project_peers(self, key: str, desired: list[dict]) -> None:
        existing = [o for o in self.projectpeers.items() if key in owner_names(o)
                    and (o.get("metadata") or {}).get("name") == key]
        have = {(o["metadata"].get("namespace"), o["metadata"]["name"]) for o in existing}
        want = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in desired}

        async def delete(obj: dict) -> None:
            meta = obj["metadata"]
            try:
                await self.kube.delete(PROJECTPEERS, meta["name"], meta.get("namespace"))
            except NotFound:
                pass

        async def create(obj: dict) -> None:
            try:
                created = await self.kube.create(PROJECTPEERS, {k: v for k, v in obj.items() if k != "status"})
            except (AlreadyExists, NotFound):
                return
            # The status subresource ignores status on create: write it through /status.
            written = await self.kube.update_status(PROJECTPEERS, {**created, "status": obj["status"]})
            await self.events.emit_all(written, event_rules.projectpeer_events(None, obj["status"]))

        before = {((o.get("metadata") or {}).get("namespace"), (o.get("metadata") or {}).get("name")): o
                  for o in existing}

        async def update(obj: dict) -> None:
            try:
                written = await self.kube.update_status(PROJECTPEERS, obj)
            except (Conflict, NotFound):
                return  # the next pass compares again
            old = before.get((obj["metadata"].get("namespace"), obj["metadata"]["name"])) or {}
            await self.events.emit_all(written, event_rules.projectpeer_events(old.get("status"), obj["status"]))

        await bounded(delete, [o for o in existing
                               if (o["metadata"].get("namespace"), o["metadata"]["name"]) not in want])
        await bounded(create, [o for o in desired if (o["metadata"]["namespace"], o["metadata"]["name"]) not in have])
        await bounded(update, project_rules.status_updates(desired, existing))
