"""The desired TokenExchangeProvider of a peer (DESIGN.md §8): the contract assumed with user-authn.

Dex exchanges the peer's ServiceAccount tokens through it; the exchanged token's username is `usernamePrefix`
followed by the subject token's `sub`, which is what the grants name.
"""

from __future__ import annotations

from collections.abc import Iterable

from control.rules import ownership
from control.rules.access import audience
from control.rules.grants import username_prefix

API_VERSION = "deckhouse.io/v1alpha1"
KIND = "TokenExchangeProvider"


def provider_name(clusterpeer: str) -> str:
    """`peering-<clusterpeer>`: also Dex's connector_id for the exchange."""
    return ownership.bounded_name(f"peering-{clusterpeer}")


def desired_provider(
    clusterpeer: dict, *, peer_uuid: str, local_uuid: str, issuer_url: str, jwks: str, effective: Iterable[str]
) -> dict:
    """The provider object; `audiences` are the audiences the peer's consumer tokens carry for this cluster."""
    cp_name = clusterpeer["metadata"]["name"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": provider_name(cp_name),
            "labels": ownership.labels(cp_name),
            "ownerReferences": [ownership.owner_reference(clusterpeer)],
        },
        "spec": {
            "issuer": issuer_url,
            "jwks": jwks,
            "usernamePrefix": username_prefix(peer_uuid),
            "audiences": [audience(local_uuid, c) for c in sorted(set(effective))],
        },
    }
