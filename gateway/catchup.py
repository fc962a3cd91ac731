"""A registry that is about to serve what the status already says: the gateway waits for it, briefly.

The control loop writes a ClusterPeer's status (effectiveCapabilities, access, grants) and then, through its
watches, publishes the registry built from it; a module's controller that starts the moment `status.access` shows
an audience can reach a gateway whose registry is 30-100 ms behind, here (the egress) or at the peer (the
entrance, whose control loop learns of the capability from our offer a moment after ours did). The replica that
announces waits for its own registry first (control/rules/served.py); this is the bound for the others. A refusal
that only a registry behind the status explains is therefore held for at most `Limits.registry_catch_up` seconds:
at the egress PeerNotFound for a ClusterPeer that exists but is not live yet, or PeerNotConnected, for a token
of a local consumer; at the entrance PeerUnknown for a certificate (TLS verified it against our peering CA), on a
proxied request or a call of the peer protocol, while some ClusterPeer is not live yet (`Registry.pending`: its exchange is under way, and the peer may already use what
it was issued), PeerIssuerUnknown before the peer's first offer; and TokenAudienceMismatch
or NoEffectiveCapability for a capability that the ClusterPeer opens here, that exists here, is Accepted and
lists the token's ServiceAccount as a consumer, but is not effective for the peer yet. Admission answers such a
request `AwaitRegistry` (wait for a newer registry, at most until a time); its caller admits it again on each newer
registry, and the first that lets it pass answers it; when none does in time, admitted once more it gets the
original refusal. Any other refusal is answered at once. Nothing here does I/O but waiting for a registry.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Iterable

from contract import reasons
from contract.errors import Refusal
from contract.names import AUDIENCE_PREFIX, audience
from contract.paths import EGRESS_PREFIX
from gateway.consumers import service_account
from gateway.headers import bearer, screen_request
from gateway.registry import Peer, Registry
from gateway.tokens import unverified_claims

if TYPE_CHECKING:
    from gateway.state import GatewayState

#: The refusals a registry that is behind the status can cause: at the entrance, the peer's issuer not known yet
#: (its first offer is on its way) or the token's capability not effective yet; at the egress, no capability
#: effective yet.
LIFTABLE = frozenset({reasons.PEER_ISSUER_UNKNOWN, reasons.TOKEN_AUDIENCE_MISMATCH, reasons.NO_EFFECTIVE_CAPABILITY})
#: The egress's refusals of a ClusterPeer whose Secret (or the Secret's credentials) the registry lacks yet.
PEER_COMING = frozenset({reasons.PEER_NOT_FOUND, reasons.PEER_NOT_CONNECTED})


def claims_of(token: str) -> dict:
    """A JWT's claims without checking them (an empty dict for anything else): only to decide whether to wait."""
    return unverified_claims(token) or {}


def _audiences(claims: dict) -> list[str]:
    aud = claims.get("aud")
    return [aud] if isinstance(aud, str) else [a for a in aud if isinstance(a, str)] if isinstance(aud, list) else []


def _coming(registry: Registry, peer: Peer, names: set[str], subject: object) -> bool:
    """Whether one of the capabilities `names` is not effective for `peer` yet but would serve `subject` once it
    is: the administrator opened it for the peer (spec.capabilities), it exists here, is Accepted and lists the
    ServiceAccount as a consumer. A capability closed here is never waited for: its refusal is at once."""
    account = service_account(subject)
    if account is None:
        return False
    for name in (names & peer.opened) - peer.effective:
        cap = registry.capabilities.get(name)
        if cap is not None and cap.accepted and account in cap.consumers:
            return True
    return False


def entrance_may_lift(registry: Registry, peer: Peer, refusal: Refusal, token: str) -> bool:
    """A peer's token refused for its audience (after its signature, issuer and times verified), or because the
    peer's issuer is not known yet, whose audience names a capability of this cluster about to become effective
    for the peer. (Waiting admits nothing: the next registry verifies the token from the start.)"""
    if refusal.reason not in LIFTABLE or (refusal.reason == reasons.PEER_ISSUER_UNKNOWN and peer.jwks_json):
        return False
    claims = claims_of(token)
    prefix = audience(registry.cluster_uuid, "")
    names = {a[len(prefix):] for a in _audiences(claims) if a.startswith(prefix)}
    return _coming(registry, peer, names, claims.get("sub"))


def egress_behind(registry: Registry, peer: Peer, token: str) -> bool:
    """A local consumer's token whose audience names a capability of `peer` that this registry does not serve
    yet but will once it is effective (the claims are checked by the TokenReview that follows)."""
    claims = claims_of(token)
    names = {c for c in registry.capabilities if audience(peer.uuid, c) in _audiences(claims)}
    return _coming(registry, peer, names, claims.get("sub"))


async def newer_registry(state: "GatewayState", generation: int, deadline: float) -> bool:
    """Wait until the state decides on a registry other than `generation`, or until `deadline` (loop time)."""
    loop = asyncio.get_running_loop()
    while state.registry.generation == generation:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return False
        try:
            await asyncio.wait_for(state.published.wait(), remaining)
        except asyncio.TimeoutError:
            return False
    return True


def egress_peer_may_come(registry: Registry, refusal: Refusal, target: bytes, fields: Iterable[tuple[bytes, bytes]],
                         max_token_bytes: int) -> bool:
    """A local request refused PeerNotFound for a ClusterPeer that exists but is not live in this registry yet
    (`Registry.pending`), or PeerNotConnected for one whose token names a capability the ClusterPeer opens, whose
    token names a capability of this cluster that its ServiceAccount consumes: the peering's Secret and status
    may be a moment ahead of the registry."""
    if refusal.reason not in PEER_COMING:
        return False
    name = target[len(EGRESS_PREFIX):].partition(b"/")[0].decode("latin-1")
    peer = registry.peers.get(name)
    if (peer is None and name not in registry.pending) or (peer is not None and not peer.opened):
        return False
    try:
        auth = screen_request(fields)[1]
        token = bearer(auth.decode("latin-1") if auth is not None else None, max_token_bytes)
    except Refusal:
        return False
    claims = claims_of(token)
    account = service_account(claims.get("sub"))
    if account is None:
        return False
    for aud in _audiences(claims):
        name = aud.rsplit("/", 1)[-1] if aud.startswith(AUDIENCE_PREFIX) else ""
        cap = registry.capabilities.get(name)
        if cap is not None and cap.accepted and account in cap.consumers and (peer is None or name in peer.opened):
            return True
    return False


class AwaitRegistry:
    """Admission's answer for a request refused (`refusal`) on registry `generation` in a way a newer registry may
    lift: wait for a registry other than `generation`, at most until `until` (loop time), then admit the request
    again, passing `until` on (`admission.caught_up`). Admitted once more after `until`, the request gets the
    answer of its registry without waiting: the refusal, or (the egress's capability not served yet) the
    TokenReview. Plain data: it neither admits nor waits by itself."""

    __slots__ = ("refusal", "generation", "until")

    def __init__(self, refusal: Refusal, generation: int, until: float) -> None:
        self.refusal, self.generation, self.until = refusal, generation, until
