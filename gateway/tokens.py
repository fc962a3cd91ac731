"""Verification of a peer consumer's ServiceAccount token (DESIGN.md 7, step 2): pure over the registry snapshot.

kube-apiserver would trust Dex's exchanged token blindly, and Dex does not check the subject token's audience,
so this is the check that keeps a peer's token for one capability or cluster from being used for another.
"""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass

from cachetools import LRUCache
from jwcrypto import jwk, jws
from jwcrypto.common import JWException

from contract import reasons
from contract.errors import Refusal
from contract.names import audience
from gateway.consumers import consumer_capabilities, service_account
from gateway.registry import Peer, Registry

ALLOWED_ALGS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
_KEY_ALGS = {"RSA": ALLOWED_ALGS[:6], "EC": ALLOWED_ALGS[6:9], "OKP": ("EdDSA",)}
"""What a JWK without `alg` may verify, by its kty; a JWK's `alg`, when set, is the only algorithm it verifies."""


@dataclass(frozen=True, slots=True)
class VerifiedToken:
    """What a verified token allows: which peer's consumer, for which capabilities, until when."""

    peer: str
    subject: str
    capabilities: frozenset[str]
    expires: float


class KeySets:
    """Parsed JWK Sets by their JSON text, so each peer's JWKS is parsed once per change, not per request."""

    MAX_ENTRIES = 1024

    def __init__(self) -> None:
        # An LRU: more JWK Sets than peers evict the least recently used one, never every peer's at once.
        self._cache: LRUCache = LRUCache(self.MAX_ENTRIES)

    def get(self, jwks_json: str) -> jwk.JWKSet | None:
        try:
            return self._cache[jwks_json]
        except KeyError:
            pass
        try:
            keyset = jwk.JWKSet.from_json(jwks_json)
        except (JWException, ValueError, TypeError, KeyError):
            keyset = None
        self._cache[jwks_json] = keyset
        return keyset


def _unauthorized(cause: str, message: str) -> Refusal:
    return Refusal(401, cause, message)


_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _part(part: str) -> bytes | None:
    """The bytes of one part of a compact JWS, or None unless it is base64url as RFC 7515 spells it: the URL-safe
    alphabet only (no padding, no other character, which a lenient decoder would skip) and no stray bits in the
    last character, so that one token has one spelling and the bytes decoded are the bytes signed."""
    if not _BASE64URL.fullmatch(part) or len(part) % 4 == 1:
        return None
    data = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    return data if base64.urlsafe_b64encode(data).rstrip(b"=").decode() == part else None


def _json_object(data: bytes | None) -> dict | None:
    """A JSON object of UTF-8 `data`, or None for anything else (NaN and Infinity are no JSON, a nesting deeper
    than the interpreter's recursion is no object of a token)."""
    if data is None:
        return None
    try:
        value = json.loads(data, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def numeric_date(value: object) -> float | None:
    """A JSON number as seconds (an `exp`, an `nbf`, an `expires_in`), or None for anything else: a boolean, a
    string, or an integer beyond what a float holds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _b64json(part: str) -> dict:
    value = _json_object(_part(part))
    if value is None:
        raise _unauthorized(reasons.TOKEN_MALFORMED, "the bearer token is not a JWT")
    return value


def expired() -> Refusal:
    return _unauthorized(reasons.TOKEN_EXPIRED, "the token has expired; the kubelet refreshes projected tokens, read "
                         "the token file again")


def check_expiry(exp: float, now: float) -> None:
    """The one expiry rule of a consumer's token, on the entrance and the egress alike: it passes until its `exp`,
    with no allowance. Dex, which exchanges a peer's token, allows none (go-oidc), so a token past it could only
    be refused there as an exchange failure; kube-apiserver still authenticates its own tokens for a minute
    (go-jose's leeway), which the egress must not take for a grant."""
    if exp <= now:
        raise expired()


def verify_peer_token(token: str, peer: Peer, registry: Registry, keysets: KeySets, *, now: float,
                      skew: float, max_bytes: int) -> VerifiedToken:
    """Check signature, issuer, time, audience and subject; return what the token allows or raise a Refusal.
    `skew` is the allowance on `nbf` for a peer whose clock is ahead (none on `exp`: `check_expiry`)."""
    if len(token) > max_bytes:
        raise _unauthorized(reasons.TOKEN_TOO_LARGE, f"the bearer token is longer than {max_bytes} bytes")
    parts = token.split(".")
    if len(parts) != 3 or any(_part(p) is None for p in parts):
        raise _unauthorized(reasons.TOKEN_MALFORMED, "the bearer token is not a signed JWT in compact form (three "
                            "dot-separated base64url parts); send the ServiceAccount token as the kubelet wrote it")
    header = _b64json(parts[0])
    alg = header.get("alg")
    if alg not in ALLOWED_ALGS:
        raise _unauthorized(reasons.TOKEN_ALGORITHM_REFUSED,
                            f"token algorithm {str(alg)[:20]!r} is refused; ServiceAccount tokens are signed "
                            "with an asymmetric key (RS256 or ES256)")
    if not peer.issuer_url or not peer.jwks_json:
        raise _unauthorized(reasons.PEER_ISSUER_UNKNOWN, f"peer {peer.name} has not published its token issuer yet; "
                            "wait for the offer sync of the ClusterPeer")
    keyset = keysets.get(peer.jwks_json)
    if keyset is None:
        raise _unauthorized(reasons.PEER_ISSUER_UNKNOWN, f"the JWKS of peer {peer.name} is not a valid JWK Set")
    kid = header.get("kid")
    if isinstance(kid, str):
        key = keyset.get_key(kid)
    elif kid is None and len(keyset["keys"]) == 1:
        key = next(iter(keyset["keys"]))
    else:
        key = None
    if key is None:
        raise _unauthorized(reasons.TOKEN_KEY_UNKNOWN, f"the token's key id is not in the JWKS of peer {peer.name}; "
                            "if the peer rotated its keys, wait for the next offer sync")
    key_alg = key.get("alg")
    if alg not in (_KEY_ALGS.get(key.get("kty"), ()) if key_alg is None else (key_alg,)):
        raise _unauthorized(reasons.TOKEN_ALGORITHM_REFUSED,
                            f"the token is signed with {alg}, which its key in the JWKS of peer {peer.name} does not "
                            f"allow ({key_alg or key.get('kty')}); sign with the key's own algorithm")
    verifier = jws.JWS()
    try:
        verifier.deserialize(token)
        verifier.verify(key, alg=alg)
        signed = verifier.payload
    except (JWException, ValueError, TypeError):
        raise _unauthorized(reasons.TOKEN_SIGNATURE_INVALID, "the token's signature does not verify with the peer's key") \
            from None
    # The claims are the payload the signature covers, never a second reading of the token's text.
    claims = _json_object(signed)
    if claims is None:
        raise _unauthorized(reasons.TOKEN_MALFORMED, "the token's payload is not a JSON object of claims")
    if claims.get("iss") != peer.issuer_url:
        raise _unauthorized(reasons.TOKEN_ISSUER_MISMATCH, f"the token was not issued by the issuer of peer {peer.name}")
    exp = claims_expiry(claims)
    if exp is None:
        raise _unauthorized(reasons.TOKEN_EXPIRED, "the token has no expiry (exp, a number of seconds); use a "
                            "projected ServiceAccount token")
    check_expiry(exp, now)
    nbf = claims.get("nbf")
    not_before = numeric_date(nbf)
    if nbf is not None and not_before is None:
        raise _unauthorized(reasons.TOKEN_MALFORMED, "the token's nbf is not a number of seconds")
    if not_before is not None and not_before - skew > now:
        raise _unauthorized(reasons.TOKEN_NOT_YET_VALID, "the token is not valid yet; check the clocks of both clusters")
    aud = claims.get("aud")
    auds = [aud] if isinstance(aud, str) else [a for a in aud if isinstance(a, str)] if isinstance(aud, list) else []
    prefix = audience(registry.cluster_uuid, "")
    requested = {a[len(prefix):] for a in auds if a.startswith(prefix)}
    usable = requested & peer.effective
    if not usable:
        raise _unauthorized(reasons.TOKEN_AUDIENCE_MISMATCH,
                            "the token's audience names no capability effective for this peering; request a token "
                            f"with audience {prefix}<capability> for a capability listed in effectiveCapabilities")
    sub = claims.get("sub")
    account = service_account(sub)
    # A good token of no consumer: forbidden (403), as the egress answers it, not unauthenticated.
    if account is None:
        raise Refusal(403, reasons.NOT_A_CONSUMER, "the token's subject is not a ServiceAccount")
    allowed = consumer_capabilities(registry, usable, account)
    if not allowed:
        raise Refusal(403, reasons.NOT_A_CONSUMER, f"ServiceAccount {account[0]}/{account[1]} of peer {peer.name} "
                      "is not a consumer of the capabilities its token names; add it to spec.consumers of the "
                      "PeeringCapability")
    return VerifiedToken(peer=peer.name, subject=sub, capabilities=allowed, expires=exp)


class VerifiedTokens:
    """Verified peer tokens by the SHA-256 of the token, so that a token is verified once per registry, not per
    request. Bounded (a cachetools LRUCache): a flood of distinct tokens costs a verification each, never memory,
    and evicts the least recently used token one at a time, never every consumer's at once. An expired token is
    refused by admission on its next use and forgotten then."""

    MAX_ENTRIES = 100_000

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._max = max_entries
        self._by_hash: LRUCache = LRUCache(max_entries)
        self.keysets = KeySets()

    def __len__(self) -> int:
        return len(self._by_hash)

    def get(self, token_hash: bytes) -> VerifiedToken | None:
        return self._by_hash.get(token_hash)

    def verify(self, token: str, token_hash: bytes, peer: Peer, registry: Registry, *, now: float, skew: float,
               max_bytes: int) -> VerifiedToken:
        """verify_peer_token (raises its Refusal), remembered by the token's hash until `clear()`."""
        verified = verify_peer_token(token, peer, registry, self.keysets, now=now, skew=skew, max_bytes=max_bytes)
        self._by_hash[token_hash] = verified
        return verified

    def forget(self, token_hash: bytes) -> None:
        self._by_hash.pop(token_hash, None)

    def clear(self) -> None:
        """A new registry: what a token allows may have changed."""
        self._by_hash = LRUCache(self._max)


def unverified_claims(token: str) -> dict | None:
    """The claims of a compact JWT without checking them (None for anything else): only to bound or narrow a
    result obtained otherwise (the egress's TokenReview verifies the token), or to decide whether to wait."""
    parts = token.split(".")
    return _json_object(_part(parts[1])) if len(parts) == 3 else None


def unverified_expiry(token: str) -> float | None:
    """The exp claim of a JWT without checking it, only to bound a cache of a result obtained otherwise."""
    return claims_expiry(unverified_claims(token) or {})


def claims_expiry(claims: dict) -> float | None:
    """The `exp` of claims as seconds, None when it is no number a float holds."""
    return numeric_date(claims.get("exp"))
