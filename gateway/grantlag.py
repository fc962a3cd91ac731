"""The entrance's catch-up with the API server's authorizer: a grant on its way is not refused.

The control loop writes a ClusterPeer's status (effectiveCapabilities, grants) and then its Roles and RoleBindings
(control/reconcilers/grants.py); kube-apiserver's RBAC authorizer reads them from its own informers a moment later.
The peer announces access from our offer and its own status (docs/protocol.md, "Announced only once served"), so a
peer's controller that starts at once may be answered 403 Forbidden by our API server for a grant still on its way.
The entrance then tries the request again, after `GRANTS_RETRY` and twice as long each time, at most until
`Limits.registry_catch_up` after the grant appeared in a registry published here, and only then passes the 403 on:
the same bound as the catch-up with a registry behind the status (catchup.py)."""

from __future__ import annotations

import asyncio
from typing import Iterable

from gateway.registry import Registry
class FreshGrants:
    """When each grant of the registries published here first appeared (loop time): (peer, capability, None) for a
    capability effective for the peer, (peer, capability, namespace) for a namespace of its status.grants."""

    __slots__ = ("_since",)

    def __init__(self) -> None:
        self._since: dict[tuple[str, str, str | None], float] = {}

    def update(self, registry: Registry, now: float) -> None:
        old, since = self._since, {}
        for peer in registry.peers.values():
            for key in [(peer.name, c, None) for c in peer.effective] + [(peer.name, c, ns) for c, ns in
                                                                           peer.grants or ()]:
                since[key] = old.get(key, now)
        self._since = since

    def settling_until(self, peer: str, capabilities: Iterable[str], namespace: str | None, bound: float) -> float:
        """Until when (loop time) a 403 of the API server to a request of `peer` with these capabilities in
        `namespace` (None: cluster scope) may be its grants still on their way; 0 when none of them is new."""
        since = self._since
        newest = max((t for c in capabilities for t in (since.get((peer, c, None)), since.get((peer, c, namespace)))
                      if t is not None), default=None)
        return 0.0 if newest is None else newest + bound


#: The first wait before a request the API server refused while its grants settle is tried again (doubling after).
GRANTS_RETRY = 0.05


async def pause(seconds: float) -> None:
    """The wait between two tries of a request refused while its grants settle (FreshGrants)."""
    await asyncio.sleep(seconds)
