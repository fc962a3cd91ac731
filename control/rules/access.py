"""status.access: how the local consumers reach the peer (DESIGN.md §6)."""

from __future__ import annotations

from collections.abc import Iterable

from contract.names import audience, egress_endpoint

__all__ = ["audience", "egress_endpoint", "desired_access"]


def desired_access(clusterpeer: str, peer_uuid: str, local_ca_pem: str, effective: Iterable[str]) -> dict:
    """status.access for a ClusterPeer: endpoint, the local peering CA, and one audience per effective capability."""
    return {
        "endpoint": egress_endpoint(clusterpeer),
        "caBundle": local_ca_pem,
        "audiences": [{"capability": c, "audience": audience(peer_uuid, c)} for c in sorted(set(effective))],
    }
