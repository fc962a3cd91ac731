"""status.access: how the local consumers reach the peer (DESIGN.md §6).

An audience is announced only once this replica's egress serves it (control/rules/served.py): a module's controller
may start the moment `status.access` lists its audience, and the egress it calls decides on the registry the feed
built from the status this reconciler wrote, a moment after the write. So the audiences are the effective
capabilities that the registry published here already serves; the rest follow in the pass after the registry that
serves them is published. One that stops being effective leaves at once."""

from __future__ import annotations

from collections.abc import Iterable

from contract.names import audience, egress_endpoint

__all__ = ["audience", "egress_endpoint", "desired_access"]


def desired_access(clusterpeer: str, peer_uuid: str, local_ca_pem: str, effective: Iterable[str],
                   served: Iterable[str] | None = None) -> dict:
    """status.access for a ClusterPeer: endpoint, the local peering CA, and one audience per effective capability
    that the egress serves already (`served`; None where no gateway runs in this process: all of them)."""
    announced = set(effective) if served is None else set(effective) & set(served)
    return {
        "endpoint": egress_endpoint(clusterpeer),
        "caBundle": local_ca_pem,
        "audiences": [{"capability": c, "audience": audience(peer_uuid, c)} for c in sorted(announced)],
    }
