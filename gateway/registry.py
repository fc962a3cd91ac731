"""The peer registry: an immutable snapshot of everything the gateway decides a request on.

The control loop builds it from watched API objects with `Registry.from_objects` (a pure function) and hands it to
`Gateway.publish`, which swaps it atomically. Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from contract.names import peer_secret_name, provider_name
from contract.peer_secret import PeerCredentials


_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class LocalCapability:
    """A PeeringCapability of this cluster, as the gateway needs it."""

    name: str
    version: str
    consumers: frozenset[tuple[str, str]]  # (namespace, serviceaccount name)
    accepted: bool


@dataclass(frozen=True)
class Peer:
    """A live ClusterPeer with the credentials the gateway needs for both directions."""

    name: str
    uuid: str
    fingerprints: frozenset[str]
    issuer_url: str | None
    jwks_json: str | None
    effective: frozenset[str]
    connector_id: str
    entrance: str | None
    peer_ca_pem: bytes | None
    client_cert_pem: bytes | None
    client_key_pem: bytes | None
    opened: frozenset[str] = frozenset()
    """spec.capabilities of the ClusterPeer here: what the administrator opened, effective or not yet. A refusal
    for an opened capability that is not effective yet may be a registry behind the status (catchup.py)."""
    grants: frozenset[tuple[str, str]] | None = None
    """status.grants as (capability, namespace) pairs: where the peer's consumers hold access here; None when the
    status has none yet. An open stream in a namespace that leaves it is closed (authority.py)."""
    validity: Mapping[str, tuple[float, float]] = field(default_factory=dict, compare=False)
    """(notBefore, notAfter) in Unix seconds of each certificate of `fingerprints`, read once when the registry is
    built: the entrance accepts a certificate of our CA at the handshake whatever its dates, and admission refuses
    one outside them everything but the renewal (docs/protocol.md §3). Derived from the certificates, so it is
    left out of comparisons (the fingerprints compare)."""


@dataclass(frozen=True)
class Registry:
    """One immutable snapshot; readers keep the reference they took, writers publish a new one."""

    cluster_uuid: str
    peers: Mapping[str, Peer]
    by_fingerprint: Mapping[str, Peer]
    capabilities: Mapping[str, LocalCapability]
    generation: int
    loaded: bool = field(default=True, compare=False)
    """False only for the placeholder the gateway starts with, so /readyz can tell it apart from a real empty one."""
    pending: frozenset[str] = frozenset()
    """ClusterPeers that are not live yet (no peer Secret with an issued certificate) while their exchange is under
    way (`exchange_under_way`): a request for one may be a moment ahead of the registry (catchup.py), and an
    entrance connection with a certificate no live peering holds is kept only while there is one
    (connections.py)."""

    def certificate_may_come(self, fingerprint: str | None, catch_up: float) -> bool:
        """Whether a client certificate of our CA that no live peering here holds may be one in a moment: a
        ClusterPeer's exchange is under way (`pending`) and waiting is on (`Limits.registry_catch_up`). Its requests
        then wait for a newer registry (admission.py, catchup.py); otherwise they are refused at once, and its
        connection is answered PeerUnknown and closed right after the handshake (connections.py)."""
        return catch_up > 0 and fingerprint is not None and bool(self.pending)

    def __reduce__(self):
        # Worker processes receive snapshots pickled; mapping proxies are not picklable, plain dicts are.
        return (_restore, (self.cluster_uuid, dict(self.peers), dict(self.by_fingerprint), dict(self.capabilities),
                           self.generation, self.loaded, self.pending))

    @classmethod
    def empty(cls) -> "Registry":
        return cls(cluster_uuid="", peers=_EMPTY, by_fingerprint=_EMPTY, capabilities=_EMPTY, generation=0,
                   loaded=False)

    @classmethod
    def from_objects(cls, *, cluster_uuid: str, clusterpeers: list[dict], peer_secrets: list[dict],
                     capabilities: list[dict], generation: int) -> "Registry":
        # By the name each ClusterPeer's Secret must have (bounded for long names: never parse it back).
        secrets = {}
        for secret in peer_secrets or ():
            name = _get(secret, "metadata", "name")
            if isinstance(name, str):
                secrets[name] = secret
        peers: dict[str, Peer] = {}
        by_fp: dict[str, Peer] = {}
        ambiguous: set[str] = set()
        pending: set[str] = set()
        for obj in clusterpeers or ():
            cp_name = _get(obj, "metadata", "name")
            peer = peer_from_objects(obj, secrets.get(peer_secret_name(cp_name)) if isinstance(cp_name, str) else None)
            if peer is None:
                if isinstance(cp_name, str) and cp_name and exchange_under_way(obj):
                    pending.add(cp_name)
                continue
            peers[peer.name] = peer
            for fp in peer.fingerprints:
                # A fingerprint claimed by two peers is ambiguous: refuse it for both rather than guess.
                if fp in by_fp and by_fp[fp].name != peer.name:
                    ambiguous.add(fp)
                by_fp[fp] = peer
        for fp in ambiguous:
            del by_fp[fp]
        caps = {}
        for obj in capabilities or ():
            cap = capability_from_object(obj)
            if cap is not None:
                caps[cap.name] = cap
        return cls(cluster_uuid=cluster_uuid or "", peers=MappingProxyType(peers),
                   by_fingerprint=MappingProxyType(by_fp), capabilities=MappingProxyType(caps),
                   generation=int(generation), pending=frozenset(pending))


def _restore(cluster_uuid: str, peers: dict, by_fingerprint: dict, capabilities: dict, generation: int,
             loaded: bool, pending: frozenset[str] = frozenset()) -> Registry:
    return Registry(cluster_uuid=cluster_uuid, peers=MappingProxyType(peers),
                    by_fingerprint=MappingProxyType(by_fingerprint), capabilities=MappingProxyType(capabilities),
                    generation=generation, loaded=loaded, pending=pending)


def exchange_under_way(clusterpeer: dict) -> bool:
    """Whether a ClusterPeer that is not live is in its credentials exchange, so that a certificate issued for it
    may be in use before the registry holds it: an Invite whose token was used (redeemed, its Secret not written
    or not seen yet), or a Join not refused for good (phase Error). An unused Invite is not, for its whole TTL:
    nobody holds a certificate of it yet."""
    if _get(clusterpeer, "metadata", "deletionTimestamp"):
        return False
    kind = _get(clusterpeer, "spec", "type")
    if kind == "Invite":
        return _get(clusterpeer, "status", "invite", "used") is True
    if kind == "Join":
        return _get(clusterpeer, "status", "phase") != "Error"
    return False


def peer_from_objects(clusterpeer: dict, secret: dict | None) -> Peer | None:
    """The Peer of one ClusterPeer and its `peer-<name>` Secret, or None when the peering is not live."""
    name = _get(clusterpeer, "metadata", "name")
    if not isinstance(name, str) or not name:
        return None
    if _get(clusterpeer, "metadata", "deletionTimestamp"):
        return None
    if not isinstance(secret, dict):
        return None
    values = PeerCredentials.from_secret(secret)
    issued = values.issued.encode()
    if not issued:
        return None
    validity = cert_validity(issued)
    if not validity:
        return None
    status = clusterpeer.get("status") if isinstance(clusterpeer.get("status"), dict) else {}
    peer_status = status.get("peer") if isinstance(status.get("peer"), dict) else {}
    issuer = peer_status.get("issuer") if isinstance(peer_status.get("issuer"), dict) else {}
    uuid = peer_status.get("clusterUUID") or values.peer_uuid.strip() or ""
    effective = status.get("effectiveCapabilities")
    effective_set = frozenset(c for c in effective if isinstance(c, str)) if isinstance(effective, list) else frozenset()
    spec = clusterpeer.get("spec") if isinstance(clusterpeer.get("spec"), dict) else {}
    opened = spec.get("capabilities")
    opened_set = frozenset(c for c in opened if isinstance(c, str)) if isinstance(opened, list) else frozenset()
    issuer_url = issuer.get("url") if isinstance(issuer.get("url"), str) and issuer.get("url") else None
    jwks = issuer.get("jwks") if isinstance(issuer.get("jwks"), str) and issuer.get("jwks") else None
    return Peer(
        name=name,
        uuid=str(uuid),
        fingerprints=frozenset(validity),
        issuer_url=issuer_url,
        jwks_json=jwks,
        effective=effective_set,
        connector_id=provider_name(name),
        entrance=values.peer_entrance.strip() or None,
        peer_ca_pem=values.peer_ca.encode() or None,
        client_cert_pem=values.client_cert.encode() or None,
        client_key_pem=values.client_key.encode() or None,
        opened=opened_set,
        grants=_grants(status.get("grants")),
        validity=validity,
    )


def _grants(value: Any) -> frozenset[tuple[str, str]] | None:
    if not isinstance(value, list):
        return None
    return frozenset((g["capability"], ns) for g in value if isinstance(g, dict) and isinstance(g.get("capability"), str)
                     and isinstance(g.get("namespaces"), list) for ns in g["namespaces"] if isinstance(ns, str))


def capability_from_object(obj: dict) -> LocalCapability | None:
    name = _get(obj, "metadata", "name")
    if not isinstance(name, str) or not name:
        return None
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    consumers = set()
    for c in spec.get("consumers") or ():
        if isinstance(c, dict) and c.get("kind", "ServiceAccount") == "ServiceAccount":
            ns, sa = c.get("namespace"), c.get("name")
            if isinstance(ns, str) and isinstance(sa, str) and ns and sa:
                consumers.add((ns, sa))
    accepted = False
    for cond in _get(obj, "status", "conditions") or ():
        if isinstance(cond, dict) and cond.get("type") == "Accepted":
            accepted = cond.get("status") == "True"
    version = spec.get("version")
    return LocalCapability(name=name, version=version if isinstance(version, str) else "",
                           consumers=frozenset(consumers), accepted=accepted)


def _certificates(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def cert_fingerprints(pem: bytes) -> list[str]:
    """SHA-256 (lower hex) of the DER of every certificate in a PEM bundle; unparsable input gives none."""
    return [hashlib.sha256(c.public_bytes(Encoding.DER)).hexdigest() for c in _certificates(pem)]


def cert_validity(pem: bytes) -> dict[str, tuple[float, float]]:
    """{fingerprint: (notBefore, notAfter) in Unix seconds} of every certificate in a PEM bundle, in its order;
    unparsable input gives none."""
    return {hashlib.sha256(c.public_bytes(Encoding.DER)).hexdigest(): (c.not_valid_before_utc.timestamp(),
                                                                      c.not_valid_after_utc.timestamp())
            for c in _certificates(pem)}


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


