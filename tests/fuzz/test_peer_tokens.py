"""A peer's bearer token at the entrance (gateway/tokens.py `verify_peer_token`) under arbitrary input, and
tokens signed with the peer's own keys: the answer is a VerifiedToken or a Refusal (401, a reason of the token
rules), never another exception; a token verifies exactly when every rule holds (signature with the key its `kid`
names, in an algorithm that key allows, `iss`, `exp`/`nbf` with the skew, an audience of an effective capability
whose consumer `sub` is); every single mutation of a valid token is refused, and so is a token whose claims its
signature does not cover; a refusal never quotes the token."""

from __future__ import annotations

import base64
import json

from hypothesis import given
from hypothesis import strategies as st
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from contract import reasons
from contract.errors import Refusal
from fuzz.seeds import (ALGS, CLUSTER, ISSUER, MAX_TOKEN, NOW_S, SKEW, b64url, granted, peer_claims, peer_material,
                        peer_token, sign, sign_with)
from gateway.tokens import ALLOWED_ALGS, KeySets, VerifiedToken, verify_peer_token

from tests.fuzz.strategies import FUZZ, json_values

M = peer_material()
PEER, REGISTRY = M["peer"], M["registry"]
KEYSETS = KeySets()
AUD = f"peering.deckhouse.io/{CLUSTER}/"
TOKEN_REASONS = frozenset({
    reasons.TOKEN_TOO_LARGE, reasons.TOKEN_MALFORMED, reasons.TOKEN_ALGORITHM_REFUSED, reasons.PEER_ISSUER_UNKNOWN,
    reasons.TOKEN_KEY_UNKNOWN, reasons.TOKEN_SIGNATURE_INVALID, reasons.TOKEN_ISSUER_MISMATCH, reasons.TOKEN_EXPIRED,
    reasons.TOKEN_NOT_YET_VALID, reasons.TOKEN_AUDIENCE_MISMATCH, reasons.NOT_A_CONSUMER})
B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def verdict(token: str) -> VerifiedToken | Refusal:
    """What the entrance answers `token` with: a VerifiedToken, or a Refusal that is one of the token rules', says
    what to do, and never quotes the token or its signature."""
    try:
        return verify_peer_token(token, PEER, REGISTRY, KEYSETS, now=NOW_S, skew=SKEW, max_bytes=MAX_TOKEN)
    except Refusal as refusal:
        # A good token of no consumer is forbidden (403), as the egress answers it; the rest unauthenticated.
        code = 403 if refusal.reason == reasons.NOT_A_CONSUMER else 401
        assert refusal.code == code and refusal.reason in TOKEN_REASONS, (refusal.code, refusal.reason)
        assert refusal.message and (len(token) < 16 or token not in refusal.message)
        signature = token.rpartition(".")[2]
        assert len(signature) < 16 or signature not in refusal.message
        return refusal


def test_a_token_of_each_key_verifies():
    for kid in ALGS:
        got = verdict(peer_token(kid))
        assert isinstance(got, VerifiedToken), got
        assert (got.peer, got.subject, got.capabilities, got.expires) == \
            ("peer-a", "system:serviceaccount:mod:controller", {"read-pods"}, int(NOW_S) + 600)


@FUZZ
@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_any_text_is_refused(token):
    assert isinstance(verdict(token), Refusal)


_parts = (json_values.map(lambda v: b64url(json.dumps(v).encode())) | st.binary(max_size=60).map(b64url)
          | st.text(max_size=60))


@FUZZ
@given(st.lists(_parts, min_size=1, max_size=5))
def test_any_three_parts_are_refused(parts):
    assert isinstance(verdict(".".join(parts)), Refusal)


_numbers = (st.integers() | st.integers(10**300, 10**400) | st.integers(-10**400, -10**300)
            | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([True, False, None]))
_times = st.sampled_from([NOW_S + 600, NOW_S - 600, NOW_S + SKEW, NOW_S - SKEW, NOW_S - SKEW - 1, NOW_S + SKEW + 1,
                          int(NOW_S) + 600, 1e308]) | _numbers | json_values
_auds = st.sampled_from([AUD + "read-pods", AUD + "write", AUD + "closed", AUD + "nosuch", AUD, "read-pods",
                         f"peering.deckhouse.io/{PEER.uuid}/read-pods", AUD + "read-pods/x"])
_subs = st.sampled_from(["system:serviceaccount:mod:controller", "system:serviceaccount:mod:writer",
                         "system:serviceaccount:mod", "system:serviceaccount:other:controller",
                         "system:serviceaccount:mod:controller:x", "mod:controller", ""])


@st.composite
def signed_claims(draw) -> dict:
    """Claims near the ones that verify: each claim kept, dropped, or drawn from what a peer could sign."""
    claims = peer_claims()
    for name, values in (("iss", st.sampled_from([ISSUER, ISSUER + "/", "https://elsewhere"]) | json_values),
                         ("exp", _times), ("nbf", _times),
                         ("aud", _auds | st.lists(_auds | json_values, max_size=4) | json_values),
                         ("sub", _subs | json_values)):
        choice = draw(st.sampled_from(["keep", "drop", "draw"]))
        if choice == "drop":
            del claims[name]
        elif choice == "draw":
            claims[name] = draw(values)
    return claims


@FUZZ
@given(signed_claims(), st.sampled_from(sorted(ALGS)))
def test_a_signed_token_verifies_exactly_when_every_rule_holds(claims, kid):
    token = sign(json.dumps({"alg": ALGS[kid], "kid": kid}).encode(), json.dumps(claims).encode(), kid)
    got = verdict(token)
    want = granted(claims)
    if want:
        assert isinstance(got, VerifiedToken), (got, claims)
        assert (got.subject, got.capabilities, got.expires) == (claims["sub"], want, float(claims["exp"]))
    else:
        assert isinstance(got, Refusal), (got, claims)


@FUZZ
@given(json_values | st.binary(max_size=80), st.sampled_from(sorted(ALGS)))
def test_a_signed_payload_that_is_no_claims_object_is_refused(payload, kid):
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    assert isinstance(verdict(sign(json.dumps({"alg": ALGS[kid], "kid": kid}).encode(), data, kid)), Refusal)


def _mutations(token: str):
    """Every token one character away from `token`: each character deleted, replaced by its neighbour in the
    base64url alphabet or by a character outside it, and a character inserted at each place."""
    for i, c in enumerate(token):
        yield token[:i] + token[i + 1:]
        if c in B64URL:
            yield token[:i] + B64URL[(B64URL.index(c) + 1) % 64] + token[i + 1:]
        for other in "=.+/ ":
            yield token[:i] + other + token[i + 1:]
    for i in range(len(token) + 1):
        for other in "A=.{ ":
            yield token[:i] + other + token[i:]


def test_every_single_mutation_of_a_valid_token_is_refused():
    for kid in ALGS:
        token = peer_token(kid)
        assert isinstance(verdict(token), VerifiedToken)
        for mutated in set(_mutations(token)) - {token}:
            assert isinstance(verdict(mutated), Refusal), (kid, mutated)


@FUZZ
@given(st.data())
def test_any_single_mutation_of_a_valid_token_is_refused(data):
    kid = data.draw(st.sampled_from(sorted(ALGS)))
    token = peer_token(kid)
    i = data.draw(st.integers(0, len(token)))
    c = data.draw(st.characters(max_codepoint=0x2FF))
    op = data.draw(st.sampled_from(["replace", "insert", "delete"]))
    mutated = {"replace": token[:i] + c + token[i + 1:], "insert": token[:i] + c + token[i:],
               "delete": token[:i] + token[i + 1:]}[op]
    if mutated != token:
        assert isinstance(verdict(mutated), Refusal), mutated


RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)
STRANGER = ec.generate_private_key(ec.SECP256R1())  # never published, though a header may name it p256
_HEADER_ALGS = st.sampled_from([*ALLOWED_ALGS, "none", "HS256", "HS512", "ES256K", "RS1", "", "es256"]) | json_values


@FUZZ
@given(st.sampled_from(["p256", "p384", "ed", "rsa", "stranger", "hmac"]), _HEADER_ALGS,
       st.sampled_from(["p256", "p384", "ed", None, "absent", 7, "P256", "p256 "]) | json_values)
def test_a_token_whose_alg_kid_or_key_do_not_match_is_refused(signer, alg, kid):
    """Signed with one of the peer's keys in its algorithm, with an RSA or EC key the peer never published, or in
    HMAC under the peer's public JWKS (the classic confusion of RS/ES with HS); the header claims `alg` and `kid`.
    Only the peer's key that `kid` names, in an algorithm that key allows, verifies."""
    header = json.dumps({"alg": alg, **({} if kid == "absent" else {"kid": kid})}).encode()
    key = {"rsa": RSA, "stranger": STRANGER, "hmac": PEER.jwks_json.encode()}.get(signer) or M["keys"][signer]
    got = verdict(sign_with(key, header, json.dumps(peer_claims()).encode()))
    if signer in ALGS and kid == signer and alg == ALGS[signer]:
        assert isinstance(got, VerifiedToken), got
    else:
        assert isinstance(got, Refusal), (signer, alg, kid)


def _json_serialization(token: str, forged_header: dict, forged_claims: dict) -> str:
    """A JWS JSON serialization (RFC 7515 7.2) of `token`'s signature, with one more member whose name and value
    split on dots read as a compact header and claims of the attacker's choosing."""
    protected, payload, signature = token.split(".")
    name, claims = b64url(json.dumps(forged_header).encode()), b64url(json.dumps(forged_claims).encode())
    return json.dumps({name: f".{claims}.", "protected": protected, "payload": payload, "signature": signature})


@FUZZ
@given(signed_claims(), st.sampled_from(sorted(ALGS)))
def test_claims_the_signature_does_not_cover_are_refused(claims, kid):
    """Any token of the peer (here one for another cluster, long expired) in the JSON serialization, with the
    claims of a consumer of `write` beside it, is refused: the claims read are the ones signed."""
    legit = peer_token(kid, aud=["elsewhere"], exp=1, sub="system:serviceaccount:kube-system:default")
    forged = _json_serialization(legit, {"alg": ALGS[kid], "kid": kid},
                                 peer_claims(aud=[AUD + "write"], sub="system:serviceaccount:mod:writer"))
    assert isinstance(verdict(forged), Refusal)
    # And a compact token whose claims were replaced after signing, whatever they are.
    protected, payload, signature = peer_token(kid).split(".")
    if b64url(json.dumps(claims).encode()) != payload:
        assert isinstance(verdict(f"{protected}.{b64url(json.dumps(claims).encode())}.{signature}"), Refusal)


def test_a_deeply_nested_header_or_claims_is_refused():
    deep = b"[" * 5000 + b"]" * 5000
    for token in (f"{b64url(deep)}.e30.e30", sign(json.dumps({"alg": "ES256", "kid": "p256"}).encode(), deep),
                  sign(b'{"alg": "ES256", "kid": "p256", "x": ' + deep + b"}", json.dumps(peer_claims()).encode())):
        assert isinstance(verdict(token), Refusal)


def test_a_padded_or_standard_base64_token_is_refused():
    token = peer_token()
    protected, payload, signature = token.split(".")
    standard = ".".join(base64.b64encode(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4))).decode()
                        for p in (protected, payload, signature))
    padded = ".".join(p + "=" * (-len(p) % 4) for p in (protected, payload, signature))
    for variant in {standard, padded} - {token}:
        assert isinstance(verdict(variant), Refusal), variant
