"""status.access: how the local consumers reach the peer (DESIGN.md §6)."""

from __future__ import annotations

from collections.abc import Iterable

EGRESS_BASE_URL = "https://peering-gateway.d8-peering.svc"
AUDIENCE_PREFIX = "peering.deckhouse.io"


def audience(peer_uuid: str, capability: str) -> str:
    """The audience a consumer requests for its projected token to use `capability` at the peer `peer_uuid`."""
    return f"{AUDIENCE_PREFIX}/{peer_uuid}/{capability}"


def egress_endpoint(clusterpeer: str) -> str:
    """The egress URL through which local consumers reach the peer's Kubernetes API."""
    return f"{EGRESS_BASE_URL}/peers/{clusterpeer}"


def desired_access(clusterpeer: str, peer_uuid: str, local_ca_pem: str, effective: Iterable[str]) -> dict:
    """status.access for a ClusterPeer: endpoint, the local peering CA, and one audience per effective capability."""
    return {
        "endpoint": egress_endpoint(clusterpeer),
        "caBundle": local_ca_pem,
        "audiences": [{"capability": c, "audience": audience(peer_uuid, c)} for c in sorted(set(effective))],
    }
