"""gateway/tokens.py verify_peer_token on a peer's bearer token: any text, or a header or payload of the fuzzer's
signed with one of the peer's keys. The answer is a VerifiedToken or a Refusal of the token rules (401; 403 for
NotAConsumer) that never quotes the token's signature; a token verifies only when a verifier written apart from the
module's (cryptography, strict base64url) says its signature is the peer's key's over exactly its text, and its
signed claims hold to the rules (issuer, an expiry still ahead, nbf with the skew, an audience of an effective
capability its subject consumes)."""

from __future__ import annotations

import base64
import json
import re

import atheris

with atheris.instrument_imports():
    from contract import reasons
    from contract.errors import Refusal
    from gateway.tokens import KeySets, verify_peer_token

from fuzz.common import run
from fuzz.seeds import ALGS, CLUSTER, MAX_TOKEN, NOW_S, SKEW, granted, peer_material, peer_token, sign

REASONS = frozenset({
    reasons.TOKEN_TOO_LARGE, reasons.TOKEN_MALFORMED, reasons.TOKEN_ALGORITHM_REFUSED, reasons.PEER_ISSUER_UNKNOWN,
    reasons.TOKEN_KEY_UNKNOWN, reasons.TOKEN_SIGNATURE_INVALID, reasons.TOKEN_ISSUER_MISMATCH, reasons.TOKEN_EXPIRED,
    reasons.TOKEN_NOT_YET_VALID, reasons.TOKEN_AUDIENCE_MISMATCH, reasons.NOT_A_CONSUMER})
KIDS = sorted(ALGS)
KEYSETS = KeySets()
_PART = re.compile(r"[A-Za-z0-9_-]*")


def _decode(part: str) -> bytes | None:
    if not _PART.fullmatch(part) or len(part) % 4 == 1:
        return None
    data = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    return data if base64.urlsafe_b64encode(data).rstrip(b"=").decode() == part else None


def signed_claims(token: str) -> dict | None:
    """The claims of `token` if its signature is one of the peer's keys' over its first two parts, in that key's
    algorithm (cryptography, not jwcrypto); None otherwise."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, utils

    parts = token.split(".")
    decoded = [_decode(p) for p in parts] if len(parts) == 3 else [None]
    if None in decoded:
        return None
    header, payload, signature = decoded
    try:
        header = json.loads(header)
        claims = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    kid = header.get("kid") if isinstance(header, dict) else None
    if kid not in ALGS or header.get("alg") != ALGS[kid] or not isinstance(claims, dict):
        return None
    public = peer_material()["keys"][kid].public_key()
    signing_input = f"{parts[0]}.{parts[1]}".encode()
    try:
        if kid == "ed":
            public.verify(signature, signing_input)
        else:
            size = len(signature) // 2
            der = utils.encode_dss_signature(int.from_bytes(signature[:size], "big"),
                                             int.from_bytes(signature[size:], "big"))
            if size != (public.curve.key_size + 7) // 8:
                return None
            public.verify(der, signing_input, ec.ECDSA(hashes.SHA256() if kid == "p256" else hashes.SHA384()))
    except InvalidSignature:
        return None
    return claims


def check(token: str) -> None:
    try:
        verified = verify_peer_token(token, peer_material()["peer"], peer_material()["registry"], KEYSETS, now=NOW_S,
                                     skew=SKEW, max_bytes=MAX_TOKEN)
    except Refusal as refusal:
        # A good token of no consumer is forbidden (403); every other refusal of the token rules is a 401.
        code = 403 if refusal.reason == reasons.NOT_A_CONSUMER else 401
        if refusal.code != code or refusal.reason not in REASONS or not refusal.message:
            raise AssertionError(f"a refusal {refusal.code} {refusal.reason!r}") from None
        signature = token.rpartition(".")[2]
        if len(signature) >= 16 and signature in refusal.message:
            raise AssertionError("a refusal quotes the token's signature") from None
        return
    claims = signed_claims(token)
    if claims is None:
        raise AssertionError("a token verified that the peer's key did not sign in compact form")
    want = granted(claims)
    if not want or (verified.subject, verified.capabilities, verified.expires) != (claims["sub"], want,
                                                                                   float(claims["exp"])):
        raise AssertionError(f"a token verified against the rules: {verified}")


def test_one_input(data: bytes) -> None:
    if len(data) < 2:
        return check(data.decode("latin-1"))
    mode, kid, rest = data[0] % 3, KIDS[data[1] % 3], data[2:]
    if mode == 0:
        check(rest.decode("latin-1"))
    elif mode == 1:  # the fuzzer's claims, signed
        check(sign(json.dumps({"alg": ALGS[kid], "kid": kid}).encode(), rest, kid))
    else:  # the fuzzer's header over good claims, signed
        from fuzz.seeds import peer_claims

        check(sign(rest, json.dumps(peer_claims()).encode(), kid))


def seeds():
    from fuzz.seeds import peer_claims

    for i, kid in enumerate(KIDS):
        yield b"\x00" + bytes([i]) + peer_token(kid).encode()
        yield b"\x01" + bytes([i]) + json.dumps(peer_claims(aud=f"peering.deckhouse.io/{CLUSTER}/write",
                                                            sub="system:serviceaccount:mod:writer")).encode()
        yield b"\x02" + bytes([i]) + json.dumps({"alg": ALGS[kid], "kid": kid}).encode()
    # A JWS JSON serialization whose text, split on dots, reads as a compact token with other claims.
    legit = peer_token("ed").split(".")
    forged = json.dumps({"eyJhbGciOiJFZERTQSIsImtpZCI6ImVkIn0": ".eyJpc3MiOiJ4In0.", "protected": legit[0],
                         "payload": legit[1], "signature": legit[2]})
    yield b"\x00\x00" + forged.encode()


if __name__ == "__main__":
    run(test_one_input, seeds)
