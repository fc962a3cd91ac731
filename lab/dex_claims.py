"""What Dex puts into the token it issues: newIDToken's claims by scope, `sub`, `aud` from cross-client scopes
checked against trustedPeers, and an access token's `at_hash`. Plain functions; lab/dex.py serves them."""

from __future__ import annotations

import base64
import hashlib
import secrets
from typing import Mapping, Protocol

from lab.dex_connector import Identity

CROSS_CLIENT_SCOPE = "audience:server:client_id:"
SCOPE_EMAIL = "email"
SCOPE_PROFILE = "profile"
SCOPE_GROUPS = "groups"
SCOPE_FEDERATED_ID = "federated:id"


class HasTrustedPeers(Protocol):
    trusted_peers: tuple[str, ...]


class UntrustedPeer(Exception):
    """A cross-client scope names a peer that does not exist or does not trust the client; the message says
    which, for the log."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def opaque_subject(user_id: str, connector_id: str) -> str:
    """Dex's `sub`: base64url (unpadded) of the protobuf message {1: user_id, 2: connector_id} (proto3: an
    empty field is left out)."""
    msg = b""
    for tag, value in ((0x0A, user_id), (0x12, connector_id)):
        raw = value.encode()
        if raw:
            msg += bytes([tag]) + _varint(len(raw)) + raw
    return base64.urlsafe_b64encode(msg).rstrip(b"=").decode()


def cross_client_peers(scopes: list[str]) -> list[str]:
    """The peers named by `audience:server:client_id:<peer>` scopes, in order, repeats kept (as Dex does)."""
    return [s[len(CROSS_CLIENT_SCOPE):] for s in scopes if s.startswith(CROSS_CLIENT_SCOPE)]


def audience(client_id: str, scopes: list[str]) -> list[str]:
    """Dex's getAudience: the requesting client alone, or the named peers plus the client."""
    peers = cross_client_peers(scopes)
    if not peers:
        return [client_id]
    return peers if client_id in peers else peers + [client_id]


def trusts(clients: Mapping[str, HasTrustedPeers], client_id: str, peer_id: str) -> bool:
    """Dex's validateCrossClientTrust: a client trusts itself; a peer must exist and list the client."""
    if peer_id == client_id:
        return True
    peer = clients.get(peer_id)
    return peer is not None and client_id in peer.trusted_peers


def at_hash(value: str) -> str:
    """OIDC's at_hash for RS256: the left half of SHA-256, base64url unpadded."""
    return base64.urlsafe_b64encode(hashlib.sha256(value.encode()).digest()[:16]).rstrip(b"=").decode()


def id_token_claims(clients: Mapping[str, "HasTrustedPeers"], client_id: str, identity: Identity,
                    connector_id: str, scopes: list[str], issuer: str, now: float, valid_for: float,
                    access_token: bool = False) -> dict:
    """Dex's newIDToken: the claims by scope; an untrusted cross-client scope is UntrustedPeer (Dex then answers
    500 server_error). An access token (newAccessToken) carries the at_hash of a random ID, which nothing can
    check."""
    expiry = now + valid_for
    claims: dict = {
        "iss": issuer,
        "sub": opaque_subject(identity.user_id, connector_id),
        "exp": int(expiry),
        "iat": int(now),
    }
    if access_token:
        claims["at_hash"] = at_hash(secrets.token_hex(16))
    for scope in scopes:
        if scope == SCOPE_EMAIL:
            if identity.email:
                claims["email"] = identity.email
            claims["email_verified"] = identity.email_verified
        elif scope == SCOPE_GROUPS:
            if identity.groups:
                claims["groups"] = list(identity.groups)
        elif scope == SCOPE_PROFILE:
            if identity.username:
                claims["name"] = identity.username
            if identity.preferred_username:
                claims["preferred_username"] = identity.preferred_username
        elif scope == SCOPE_FEDERATED_ID:
            claims["federated_claims"] = {k: v for k, v in (("connector_id", connector_id),
                                                            ("user_id", identity.user_id)) if v}
        elif scope.startswith(CROSS_CLIENT_SCOPE):
            peer = scope[len(CROSS_CLIENT_SCOPE):]
            if not trusts(clients, client_id, peer):
                raise UntrustedPeer(f"peer {peer!r} does not trust client {client_id} (its trustedPeers lack it)")
    aud = audience(client_id, scopes)
    # Dex writes a single audience as a string.
    claims["aud"] = aud[0] if len(aud) == 1 else aud
    if len(aud) > 1:
        claims["azp"] = client_id
    return claims
