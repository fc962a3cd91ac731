"""The desired TokenExchangeProvider of a peer (DESIGN.md §8): the contract assumed with user-authn.

Dex exchanges the peer's ServiceAccount tokens through it; the exchanged token's username is `usernamePrefix`
followed by the subject token's `sub`, which is what the grants name. The prefix is built from the peering's
identity here, the uid of our ClusterPeer (`contract.names.peering_identity`), never from the UUID the peer claims.
"""

from __future__ import annotations

from collections.abc import Iterable

from contract.names import audience, peering_identity, provider_name, username_prefix
from control.rules import ownership

API_VERSION = "deckhouse.io/v1alpha1"
KIND = "TokenExchangeProvider"

__all__ = ["API_VERSION", "KIND", "desired_provider", "provider_name"]


def desired_provider(
    clusterpeer: dict, *, local_uuid: str, issuer_url: str, jwks: str, effective: Iterable[str],
    api_version: str = API_VERSION,
) -> dict:
    """The provider object (docs/user-authn-contract.md), at the API version the API server serves;
    `audiences` are the audiences the peer's consumer tokens carry for this cluster."""
    cp_name = clusterpeer["metadata"]["name"]
    return {
        "apiVersion": api_version,
        "kind": KIND,
        "metadata": {
            "name": provider_name(cp_name),
            "labels": ownership.labels(cp_name),
            "ownerReferences": [ownership.owner_reference(clusterpeer)],
        },
        "spec": {
            "issuer": issuer_url,
            "jwks": jwks,
            "usernamePrefix": username_prefix(peering_identity(clusterpeer)),
            "audiences": [audience(local_uuid, c) for c in sorted(set(effective))],
        },
    }
