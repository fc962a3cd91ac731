"""What this replica's gateway serves now, read from the registry the feed published (control/feed.py).

The control loop tells others of what they may use (a module's controller: an audience in status.access; a peer:
the certificate a join answer or a credentials delivery carries), and they use it at once. So each announcement
waits until the registry this replica's gateway decides on serves it (docs/protocol.md, "Announced only once
served"); other replicas, whose registries may be a moment behind, catch up within a bound at the gateway
(gateway/catchup.py). Pure functions over one Registry.
"""

from __future__ import annotations

from gateway.registry import Registry, cert_fingerprints


def served_capabilities(registry: Registry, clusterpeer: str) -> frozenset[str]:
    """The capabilities the egress serves toward the peer of ClusterPeer `clusterpeer` with `registry`: its
    effective ones, when the registry's peer has everything the egress needs to reach the peer's entrance (the
    peer's CA, our client certificate and key, the entrance); none otherwise."""
    peer = registry.peers.get(clusterpeer)
    if peer is None or not (peer.entrance and peer.peer_ca_pem and peer.client_cert_pem and peer.client_key_pem):
        return frozenset()
    return peer.effective


def admits_certificate(registry: Registry, clusterpeer: str, cert_pem: str) -> bool:
    """Whether the entrance admits `cert_pem` (the first certificate of a PEM bundle) as ClusterPeer
    `clusterpeer`'s peer with `registry`."""
    fingerprints = cert_fingerprints(cert_pem.encode())
    peer = registry.by_fingerprint.get(fingerprints[0]) if fingerprints else None
    return peer is not None and peer.name == clusterpeer
