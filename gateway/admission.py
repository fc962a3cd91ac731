"""Where every entrance and egress request is admitted (DESIGN.md 7): one chain, called by the engine for both
listeners (serving.py through listeners.py, and calls.py).

    entrance: method -> peer (client certificate) -> header rules -> peer token (verified-token cache) -> consumer
              -> exchange decision -> the upstream request head
    egress:   method -> peer and Kubernetes API path (path) -> header rules -> local token (exactly one audience)
              -> TokenReview decision -> consumer -> the head

`admit_entrance` and `admit_egress` do no I/O: they answer `Admitted` (the upstream head is ready), or what must
be waited for first (`NeedsExchange`: a Dex exchange not in the cache; `NeedsReview`: a TokenReview), or raise
the `Refusal` of the first rule that fails; the connection's `ClientState` then says which peer and capabilities
label the answer. `complete` waits for that through the state's caches (what a failed upstream means to the
client is `status.upstream_refusal`), `closes_connection` says which refusals end the connection. A fast path calls these;
none re-implements a rule.
"""

from __future__ import annotations

import hashlib
import time
from typing import Callable
from urllib.parse import unquote_to_bytes

from contract import reasons
from contract.errors import Refusal
from contract.names import audience
from contract.paths import EGRESS_PREFIX, PEER_OPS, PEER_PREFIX, RENEWAL_OP
from gateway import catchup
from gateway.headers import Fields, bearer, request_head, screen_request
from gateway.heads import METHODS, method_message
from gateway.registry import Peer
from gateway.state import GatewayState
from gateway.status import unknown_certificate
from gateway.authority import Authority
from gateway.consumers import service_account
from gateway.tokens import VerifiedToken, check_expiry, claims_expiry, expired, unverified_claims

_EGRESS_PREFIX = EGRESS_PREFIX.encode()


EGRESS_ROOTS = (b"/api", b"/apis", b"/openapi/v3")
"""What the egress forwards: these paths and those under them, and EGRESS_EXACT; the Kubernetes API and the
discovery kubectl and client-go need, never the peer protocol (/peering/v1/, spoken only by the control loop's own
client) or anything else the peer's entrance serves."""
EGRESS_EXACT = (b"/version", b"/openapi/v2")


class Admitted:
    """A request that may pass: `head` is what goes upstream."""

    __slots__ = ("head", "watch")

    def __init__(self, head: bytes, watch: bool) -> None:
        self.head = head
        self.watch = watch


class _Pending:
    """A request admitted but for one answer still to wait for; `admit(...)` with it gives the Admitted."""

    __slots__ = ("watch", "token_hash", "token", "not_after", "_method", "_target", "_host", "_forward", "_length",
                 "_chunked")

    def __init__(self, watch: bool, token_hash: bytes, token: str, not_after: float, method: bytes, target: bytes,
                 host: bytes, forward: Fields, length: int | None, chunked: bool) -> None:
        self.watch, self.token_hash, self.token, self.not_after = watch, token_hash, token, not_after
        self._method, self._target, self._host, self._forward = method, target, host, forward
        self._length, self._chunked = length, chunked

    def _admitted(self, authorization: bytes) -> Admitted:
        head = request_head(self._method, self._target, self._host, self._forward, authorization, self._length,
                            self._chunked)
        return Admitted(head, self.watch)


class NeedsExchange(_Pending):
    """The peer's token is good; its exchange at Dex (through `connector`) is not cached yet."""

    __slots__ = ("connector",)

    def __init__(self, connector: str, *args) -> None:
        super().__init__(*args)
        self.connector = connector

    def admit(self, exchanged: str) -> Admitted:
        return self._admitted(b"Bearer " + exchanged.encode())


class NeedsReview(_Pending):
    """A local consumer's token, to be reviewed (cache key `key`) before the capabilities are known; `peer` is the
    peering it goes to, as admitted; `account` and `expires` what the token's claims say (true once reviewed)."""

    __slots__ = ("key", "peer", "account", "expires")

    def __init__(self, key: str, peer: Peer, account: tuple[str, str] | None, expires: float, *args) -> None:
        super().__init__(*args)
        self.key = key
        self.peer = peer
        self.account = account
        self.expires = expires

    def admit(self) -> Admitted:
        return self._admitted(b"Bearer " + self.token.encode())


Decision = Admitted | NeedsExchange | NeedsReview


class ClientState:
    """What admission keeps of one client connection. Per request, what labels its metrics and answer: `peer`,
    `capabilities`, and `close` (the client asked to close after it). Across requests, what the last
    Authorization header came to: a client sends the same one every time, so its hash and capabilities label are
    computed once per connection and token, not per request."""

    __slots__ = ("peer", "capabilities", "close", "last_auth", "last_token_hash", "last_verified", "last_capabilities",
                 "authority")

    def __init__(self) -> None:
        self.peer = "-"
        self.capabilities = "-"
        self.close = False
        self.last_auth = b""
        self.last_token_hash = b""
        self.last_verified: VerifiedToken | None = None
        self.last_capabilities = "-"
        #: What admitted the last admitted request (its stream ends when that no longer passes: authority.py).
        self.authority: Authority | None = None

    def begin(self) -> None:
        self.peer, self.capabilities, self.close = "-", "-", False


# ----- the entrance -----------------------------------------------------------------------------------------------
def entrance_peer(state: GatewayState, fingerprint: str | None) -> Peer:
    """The live peer the client certificate belongs to, or PeerUnknown (and the connection is closed)."""
    peer = state.registry.by_fingerprint.get(fingerprint) if fingerprint is not None else None
    if peer is None:
        raise unknown_certificate()
    return peer


def known_peer(state: GatewayState, fingerprint: str | None) -> str:
    """The live peer a client certificate belongs to, "-" for none: what labels a request refused before admission."""
    peer = state.registry.by_fingerprint.get(fingerprint) if fingerprint is not None else None
    return "-" if peer is None else peer.name


def certificate_in_force(peer: Peer, fingerprint: str | None, now: float) -> float:
    """The notAfter (Unix seconds) of the peer's client certificate `fingerprint`, or the Refusal of a certificate
    outside its validity period. The entrance's TLS accepts a certificate of our CA whatever its dates (tls.py), so
    that an expired one can still prove possession of its key for the renewal; everywhere else its dates are
    checked here, against the registry's copy of them (no certificate is parsed per request)."""
    not_before, not_after = peer.validity.get(fingerprint or "", (float("inf"), float("-inf")))
    if now > not_after:
        raise Refusal(401, reasons.CERTIFICATE_EXPIRED, f"the client certificate of peering {peer.name} expired at "
                      f"{_utc(not_after)}: it admits nothing but its own renewal (POST {PEER_PREFIX}{RENEWAL_OP}), "
                      "which the peer's module makes by itself as soon as it reaches this cluster; if this lasts, "
                      "run `d8 k peering check` on the peer's cluster")
    if now < not_before:
        raise Refusal(401, reasons.CERTIFICATE_NOT_YET_VALID, f"the client certificate of peering {peer.name} is not "
                      f"valid before {_utc(not_before)}: it admits nothing but its own renewal, which the peer's "
                      "module makes by itself; the clock of this cluster or of the peer's is wrong, fix the clocks")
    return not_after


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds)) if abs(seconds) < 1e11 else "?"


def admit_entrance(state: GatewayState, client: ClientState, fingerprint: str | None, method: bytes, target: bytes,
                   fields: Fields, length: int | None = None, chunked: bool = False, *, until: float | None = None
                   ) -> "Admitted | NeedsExchange | catchup.AwaitRegistry":
    """Admit a request of a peer's consumer to this cluster's API server, or raise the Refusal of the first rule
    it fails. `target` is the origin-form target as sent; `length`/`chunked` describe a body; `until` is the
    bound of a wait for a newer registry already begun (`AwaitRegistry`, `caught_up`)."""
    client.peer, client.capabilities, client.close = "-", "-", False  # client.begin(), inline on the hot path
    if method not in METHODS:
        raise _method_refused(method)
    registry = state.registry
    limits = state.limits
    try:
        peer = entrance_peer(state, fingerprint)
    except Refusal as refusal:
        return _certificate_coming(state, refusal, fingerprint, until)
    client.peer = peer.name
    now = time.time()
    certificate_until = certificate_in_force(peer, fingerprint, now)
    forward, auth, client.close = screen_request(fields)
    _check_body(length, limits.max_body_bytes)
    if auth is not None and auth == client.last_auth:
        token_hash, token = client.last_token_hash, ""  # the same header as this connection's last request
    else:
        token = bearer(auth.decode("latin-1") if auth is not None else None, limits.max_token_bytes)
        token_hash = hashlib.sha256(token.encode()).digest()
        client.last_auth = b""
    tokens = state.tokens
    verified = tokens.get(token_hash)
    if verified is None or verified.peer != peer.name:
        token = token or bearer(auth.decode("latin-1"), limits.max_token_bytes)  # type: ignore[union-attr]
        try:
            verified = tokens.verify(token, token_hash, peer, registry, now=now, skew=limits.token_skew,
                                     max_bytes=limits.max_token_bytes)
        except Refusal as refusal:
            # A registry behind the status the peer's consumer acted on: wait for the next one (catchup.py).
            if not _may_wait(state, until) or not catchup.entrance_may_lift(registry, peer, refusal, token):
                raise
            return _await_registry(state, refusal, until)
    elif verified.expires <= now:
        tokens.forget(token_hash)
        raise expired()
    if auth is not None:
        client.last_auth, client.last_token_hash = auth, token_hash
    if verified is not client.last_verified:  # the capabilities label, joined once per token, not per request
        client.last_verified, client.last_capabilities = verified, ",".join(sorted(verified.capabilities))
        # A stream ends when its token or the client certificate it came with stops admitting it.
        client.authority = Authority(peer.name, verified.capabilities, service_account(verified.subject),
                                     min(verified.expires, certificate_until))
    client.capabilities = client.last_capabilities
    watch = b"watch" in target and is_watch(target)
    upstream_target = state.api_prefix + target
    exchanged = state.exchange.cached(peer.connector_id, token_hash)
    if exchanged is not None:
        state.exchange_hits.inc()
        head = request_head(method, upstream_target, state.api_authority, forward, b"Bearer " + exchanged.encode(),
                            length, chunked)
        return Admitted(head, watch)
    token = token or bearer(auth.decode("latin-1"), limits.max_token_bytes)  # type: ignore[union-attr]
    not_after = time.monotonic() + (verified.expires - now)
    return NeedsExchange(peer.connector_id, watch, token_hash, token, not_after, method, upstream_target,
                         state.api_authority, forward, length, chunked)


def _certificate_coming(state: GatewayState, refusal: Refusal, fingerprint: str | None,
                        until: float | None) -> "catchup.AwaitRegistry":
    """A certificate of our CA that no live peering holds yet, while a ClusterPeer's exchange is under way: the
    peer may already use what it was issued before the registry has that peering (catchup.py); else `refusal`."""
    if not _may_wait(state, until) or not state.registry.certificate_may_come(fingerprint,
                                                                             state.limits.registry_catch_up):
        raise refusal
    return _await_registry(state, refusal, until)


def _may_wait(state: GatewayState, until: float | None) -> bool:
    """Whether a refusal a newer registry may lift waits for one: catch-up on, and the wait's bound not passed."""
    return state.limits.registry_catch_up > 0 and (until is None or state.loop.time() < until)


def _await_registry(state: GatewayState, refusal: Refusal, until: float | None) -> "catchup.AwaitRegistry":
    return catchup.AwaitRegistry(refusal, state.registry.generation,
                                 state.loop.time() + state.limits.registry_catch_up if until is None else until)


async def caught_up(state: GatewayState, decision: object, admit: Callable[..., object], *args: object) -> object:
    """What `admit(*args)` (an admission function of this module, whose answer was `decision`) answers once
    no `AwaitRegistry` is left: after each newer registry, or once the wait's bound has passed, the caller admits
    the request again, passing the bound on. A decision that waits for nothing is returned as it is."""
    while isinstance(decision, catchup.AwaitRegistry):
        await catchup.newer_registry(state, decision.generation, decision.until)
        decision = admit(*args, until=decision.until)
    return decision


def admit_peer_call(state: GatewayState, client: ClientState, fingerprint: str | None, method: str, target: str,
                    now: float | None = None, *, until: float | None = None
                    ) -> "tuple[Peer, str] | catchup.AwaitRegistry":
    """A call of the peer protocol (`target` under /peering/v1/): the calling peer and the operation, or the wait
    for a registry that knows the calling certificate (a joiner delivers its half at once after the join). `now`
    (Unix seconds) is the time the certificate's dates are judged at: the clock's, unless given."""
    client.begin()
    try:
        peer = entrance_peer(state, fingerprint)
    except Refusal as refusal:
        return _certificate_coming(state, refusal, fingerprint, until)
    client.peer = peer.name
    op = target[len(PEER_PREFIX):].split("?", 1)[0]
    expected = PEER_OPS.get(op)
    if op != RENEWAL_OP or method != expected:
        # The renewal is the one call a certificate outside its validity period may make: its handshake proved
        # possession of the key the peering pinned, and the answer is a certificate for that key only.
        certificate_in_force(peer, fingerprint, time.time() if now is None else now)
    if expected is None:
        raise Refusal(404, reasons.UNKNOWN_OPERATION, f"{PEER_PREFIX}{op[:40]} is not a peering operation; this "
                      f"gateway serves {', '.join(sorted(PEER_OPS))}")
    if method != expected:
        raise Refusal(405, reasons.METHOD_NOT_ALLOWED, f"{PEER_PREFIX}{op} takes {expected}")
    return peer, op


# ----- the egress -------------------------------------------------------------------------------------------------
def egress_peer(state: GatewayState, target: bytes) -> tuple[Peer, bytes]:
    """The peer an egress target names (/peers/<clusterpeer>/<path>) and the path on its API server."""
    if not target.startswith(_EGRESS_PREFIX):
        raise Refusal(404, reasons.NOT_FOUND, f"the egress serves {EGRESS_PREFIX}<clusterpeer>/<Kubernetes API path>")
    name, _, rest = target[len(_EGRESS_PREFIX):].partition(b"/")
    peer = state.registry.peers.get(name.decode("latin-1"))
    if peer is None:
        raise Refusal(404, reasons.PEER_NOT_FOUND, f"no live ClusterPeer named {name.decode('latin-1')[:63]!r}; "
                      "check `kubectl get clusterpeers` and status.access.endpoint")
    if not peer.entrance or not peer.peer_ca_pem or not peer.client_cert_pem or not peer.client_key_pem:
        raise Refusal(503, reasons.PEER_NOT_CONNECTED, f"the peering {peer.name} has no credentials toward the "
                      "peer yet; wait until its phase is Active")
    path = b"/" + rest
    if not egress_path_allowed(path):
        raise Refusal(403, reasons.PATH_NOT_ALLOWED, f"the egress forwards only Kubernetes API paths (/api, /apis, "
                      f"/version, /openapi) to peering {peer.name}, not {path.partition(b'?')[0].decode('latin-1')[:80]}")
    return peer, path


def admit_egress(state: GatewayState, client: ClientState, method: bytes, target: bytes, fields: Fields,
                 length: int | None = None, chunked: bool = False, *, until: float | None = None
                 ) -> "NeedsReview | catchup.AwaitRegistry":
    """Admit a local consumer's request to a peer's API (through its entrance) up to the TokenReview, or raise
    the Refusal of the first rule it fails; `until` as for `admit_entrance`."""
    client.begin()
    if method not in METHODS:
        raise _method_refused(method)
    try:
        peer, path = egress_peer(state, target)
    except Refusal as refusal:
        # The ClusterPeer's Secret and status may be a moment ahead of this registry (catchup.py).
        if not _may_wait(state, until) or not catchup.egress_peer_may_come(state.registry, refusal, target, fields,
                                                                             state.limits.max_token_bytes):
            raise
        return _await_registry(state, refusal, until)
    client.peer = peer.name
    forward, auth, client.close = screen_request(fields)
    limits = state.limits
    _check_body(length, limits.max_body_bytes)
    token = bearer(auth.decode("latin-1") if auth is not None else None, limits.max_token_bytes)
    # The consumer asks for a capability this registry does not serve yet: wait for one that does (catchup.py);
    # past the wait's bound, the answer is this registry's (NoEffectiveCapability, or the review's).
    behind = _may_wait(state, until) and catchup.egress_behind(state.registry, peer, token)
    if not peer.effective and not behind:
        raise _no_effective(peer)
    claims = unverified_claims(token) or {}
    exp = claims_expiry(claims)
    if exp is not None:  # the entrance's rule: a TokenReview would still pass it for kube-apiserver's leeway
        check_expiry(exp, time.time())
    _check_audience(claims, peer)
    if behind:
        return _await_registry(state, _no_effective(peer), until)
    ttl = limits.token_review_ttl
    # A review is reused for its TTL, never past the token's own expiry.
    not_after = time.monotonic() + min(ttl, (exp - time.time()) if exp else ttl)
    key = f"{peer.name}/{state.registry.generation}"
    return NeedsReview(key, peer, service_account(claims.get("sub")), exp if exp is not None else float("inf"),
                       is_watch(path), hashlib.sha256(token.encode()).digest(), token, not_after, method, path,
                       peer.entrance.encode(), forward, length, chunked)  # type: ignore[union-attr]


def egress_path_allowed(path: bytes) -> bool:
    """Whether the egress forwards `path` (the target on the peer's API server, query included): a Kubernetes API
    path (EGRESS_ROOTS, EGRESS_EXACT) without dot segments, empty segments or escapes that could name another."""
    path = path.partition(b"?")[0]
    if b"#" in path or b"\\" in path:
        return False
    segments = path.split(b"/")[1:]
    if b"%" in path:  # an escaped segment (system%3Aauth-delegator) is judged by what it stands for
        segments = [unquote_to_bytes(segment) for segment in segments]
    for segment in segments:
        if segment in (b"", b".", b"..") or b"/" in segment or b"\\" in segment or b"%" in segment:
            return False
    return path in EGRESS_EXACT or any(path == root or path.startswith(root + b"/") for root in EGRESS_ROOTS)


def _check_audience(claims: dict, peer: Peer) -> None:
    """A consumer's token names exactly one audience (the capability's), so that the peer cannot replay it anywhere
    else, such as at this cluster's own API server. A token that is not a JWT is left to the TokenReview."""
    if not claims:
        return
    aud = claims.get("aud")
    if isinstance(aud, str) or (isinstance(aud, list) and len(aud) == 1 and isinstance(aud[0], str)):
        return
    raise Refusal(401, reasons.TOKEN_AUDIENCE_TOO_BROAD, "the token must have exactly one audience, the capability's "
                  f"({audience(peer.uuid, '<capability>')}); set the projected serviceAccountToken's audience to one "
                  f"entry of status.access.audiences of ClusterPeer {peer.name} and request no other audience in it")


def _method_refused(method: bytes) -> Refusal:
    return Refusal(405, reasons.METHOD_NOT_ALLOWED, method_message(method))


# ----- both -------------------------------------------------------------------------------------------------------
async def complete(state: GatewayState, client: ClientState, decision: Decision) -> Admitted:
    """The Admitted of a decision, after the exchange or review it waits for (through the state's caches, which
    share one call among concurrent requests of one token); the Refusal of that step otherwise. A wait for a
    registry is settled before (`caught_up`)."""
    if isinstance(decision, Admitted):
        return decision
    if isinstance(decision, NeedsExchange):
        exchanged = await state.exchange.get(decision.connector, decision.token_hash, decision.token,
                                             not_after=decision.not_after)
        return decision.admit(exchanged)
    # The review answers the granted capabilities, joined by commas (tokenreview.TokenReviewer).
    client.capabilities = await state.reviews.get(decision.key, decision.token_hash, decision.token,
                                                  not_after=decision.not_after) or "-"
    return decision.admit()


def _no_effective(peer: Peer) -> Refusal:
    return Refusal(403, reasons.NO_EFFECTIVE_CAPABILITY, f"no capability is effective for peering {peer.name}; "
                   "open one in spec.capabilities on both clusters")


def not_held(authority: Authority | None) -> Refusal:
    """Why a request admitted a moment ago goes no further (`OpenStreams.add` would not hold it): its token expired
    while it waited for Dex, a review or a connection, or a newer registry withdrew what admitted it."""
    if authority is not None and authority.expires <= time.time():
        return expired()
    return withdrawn()


def withdrawn() -> Refusal:
    """A request admitted on a registry that a newer one, come while it waited, no longer admits."""
    return Refusal(403, reasons.NO_EFFECTIVE_CAPABILITY, "what admitted this request (the peering, a capability, the "
                   "consumer or the token) was withdrawn while it was checked; see the ClusterPeer's "
                   "effectiveCapabilities and the PeeringCapability's consumers")


_CLOSING = frozenset({reasons.PEER_UNKNOWN, reasons.CERTIFICATE_EXPIRED, reasons.CERTIFICATE_NOT_YET_VALID,
                      reasons.UPGRADE_REFUSED})


def closes_connection(refusal: Refusal) -> bool:
    """Refusals after which the client's connection is closed: a revoked peer, or a certificate outside its
    validity period, has nothing more to send on it, and after a refused upgrade the client may already be sending
    the upgraded protocol."""
    return refusal.reason in _CLOSING


def is_watch(target: bytes) -> bool:
    query = target.partition(b"?")[2]
    if b"watch" not in query:
        return False
    for part in query.split(b"&"):
        name, _, value = part.partition(b"=")
        if name == b"watch" and value.lower() in (b"1", b"true", b"t", b"yes"):
            return True
    return False


def _check_body(length: int | None, limit: int) -> None:
    if length is not None and length > limit:
        raise Refusal(413, reasons.REQUEST_ENTITY_TOO_LARGE, f"the request body is larger than {limit} bytes")
