"""The reconcilers of the peering (and the request handlers that share their state), as factories for
`control.process.RECONCILERS`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from gateway.resolve import split_target

from control.handlers.join import JoinHandler
from control.handlers.peer import PeerHandlers
from control.reconcilers.capability import CapabilityReconciler
from control.reconcilers.clusterpeer import NAME as CLUSTERPEER, ClusterPeerReconciler
from control.reconcilers.grants import GrantsReconciler
from control.selfcheck import SelfCheck
from control.version import version

if TYPE_CHECKING:
    from control.context import Context
    from control.workqueue import Reconciler


def clusterpeers(ctx: "Context") -> "Reconciler":
    """The ClusterPeer reconciler, with the join and peer handlers registered on `ctx.handlers`; they share the
    Context's memory and peer client."""
    control = ctx.settings.control
    resolve = dict(ctx.settings.resolve)

    def lookup(host: str) -> tuple[str, int] | None:
        target = resolve.get(host.lower().rstrip("."))
        return split_target(target) if target else None

    selfcheck = SelfCheck(ctx.settings.entrance_host, resolve=lookup, interval=control.selfcheck_interval,
                          clock=ctx.clock)
    reconciler = ClusterPeerReconciler(ctx, client=ctx.peer_client, memory=ctx.peer_memory, selfcheck=selfcheck,
                                       peering_version=version())

    def pull_now(name: str) -> None:
        ctx.peer_memory.pull_now(name)
        ctx.enqueue(CLUSTERPEER, name)

    ctx.handlers.set_join(JoinHandler(ctx, on_joined=lambda name: ctx.enqueue(CLUSTERPEER, name)))
    PeerHandlers(ctx, pull_now=pull_now).register()
    return reconciler


def capabilities(ctx: "Context") -> "Reconciler":
    return CapabilityReconciler(ctx)


def grants(ctx: "Context") -> "Reconciler":
    return GrantsReconciler(ctx)


FACTORIES: tuple[Callable[["Context"], "Reconciler"], ...] = (capabilities, clusterpeers, grants)
