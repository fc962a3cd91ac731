"""Where the clusters talk to each other (docs/protocol.md)."""

from __future__ import annotations

PEER_PREFIX = "/peering/v1/"
"""The peer protocol on the entrance, over mTLS; anything else there is proxied to kube-apiserver."""

PEER_OPS = {"offer": "GET", "notify": "POST", "credentials": "POST", "certificate": "POST"}
"""The peer-to-peer operations under PEER_PREFIX and the one method each accepts."""

RENEWAL_OP = "certificate"
"""The one operation a client certificate outside its validity period may call (docs/protocol.md §3): the renewal,
whose TLS handshake proves possession of the peering's pinned key."""

JOIN_PATH = "/v1/join"
"""The join endpoint on peering.<domain>, behind the Ingress."""

EGRESS_PREFIX = "/peers/"
"""Local consumers reach a peer's API at <egress>/peers/<clusterpeer>/<Kubernetes API path>."""


def peer_op_path(op: str) -> str:
    if op not in PEER_OPS:
        raise ValueError(f"{op!r} is not a peer operation; use one of {', '.join(PEER_OPS)}")
    return PEER_PREFIX + op
