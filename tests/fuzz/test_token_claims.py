"""The claims read from a token without verifying it, under arbitrary input: the catch-up's (gateway/catchup.py
`claims_of`, `_audiences`, and the decisions built on them) and the egress's (gateway/tokens.py
`unverified_claims`, `claims_expiry`). Each answers a dict, a list of strings, a finite number or None, never an
exception; a compact JWT's claims read back as they were written; the catch-up reads what the egress reads."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from contract import reasons
from contract.errors import Refusal
from fuzz.seeds import CLUSTER, b64url, peer_claims, peer_material, peer_token
from gateway import catchup
from gateway.tokens import claims_expiry, unverified_claims, unverified_expiry

from tests.fuzz.strategies import FUZZ, json_values

M = peer_material()
PEER, REGISTRY = M["peer"], M["registry"]
AUD = f"peering.deckhouse.io/{CLUSTER}/"
_b64 = st.binary(max_size=40).map(b64url)
_claims = st.dictionaries(st.sampled_from(["aud", "sub", "exp", "iss", "nbf"]) | st.text(max_size=8), json_values,
                          max_size=6)
_texts = (st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1"))
          | st.lists(_b64 | json_values.map(lambda v: b64url(json.dumps(v).encode())) | st.text(max_size=20),
                     min_size=1, max_size=4).map(".".join))


def _is_json(value: object) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


def _token_of(claims: object, header: str = "e30", signature: str = "c2ln") -> str:
    return f"{header}.{b64url(json.dumps(claims).encode())}.{signature}"


@FUZZ
@given(_texts)
def test_any_text_reads_as_claims_or_none(token):
    claims = unverified_claims(token)
    assert claims is None or isinstance(claims, dict)
    assert catchup.claims_of(token) == (claims or {})
    exp = unverified_expiry(token)
    assert exp is None or math.isfinite(exp)
    assert all(isinstance(a, str) for a in catchup._audiences(claims or {}))


@FUZZ
@given(_claims, _b64, _b64)
def test_the_claims_of_a_compact_jwt_read_back_as_written(claims, header, signature):
    token = _token_of(claims, header, signature)
    # json.dumps writes an infinity as Infinity, which is no JSON: such claims are no claims.
    want = claims if _is_json(claims) else None
    assert unverified_claims(token) == want and catchup.claims_of(token) == (want or {})


@FUZZ
@given(json_values | st.binary(max_size=40))
def test_a_payload_that_is_no_object_reads_as_no_claims(payload):
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    token = f"e30.{b64url(data)}.c2ln"
    try:
        is_object = isinstance(json.loads(data), dict) and _is_json(json.loads(data))
    except (ValueError, RecursionError):
        is_object = False
    assert (unverified_claims(token) is not None) == is_object


@FUZZ
@given(json_values | st.none() | st.lists(json_values | st.text(max_size=20), max_size=5))
def test_the_audiences_are_the_strings_aud_names(aud):
    want = [aud] if isinstance(aud, str) else [a for a in aud if isinstance(a, str)] if isinstance(aud, list) else []
    assert catchup._audiences({"aud": aud}) == want
    assert catchup._audiences({}) == []


@FUZZ
@given(json_values | st.integers(10**300, 10**400) | st.floats(allow_nan=True, allow_infinity=True))
def test_the_expiry_is_a_finite_number_or_none(exp):
    got = claims_expiry({"exp": exp})
    if isinstance(exp, float) and math.isfinite(exp) or type(exp) is int and abs(exp) <= 10**308:
        assert got == float(exp)
    elif not (type(exp) is int and abs(exp) < 2**1024):  # between the two, a float may round it up to infinity
        assert got is None
    # What the egress bounds its review cache with, from the token itself (json.dumps writes NaN and Infinity,
    # which are no JSON: such claims are no claims).
    token = _token_of({"exp": exp})
    assert unverified_expiry(token) in (got, None)


def test_a_deeply_nested_payload_reads_as_no_claims():
    deep = b64url(b"[" * 5000 + b"]" * 5000)
    assert unverified_claims(f"e30.{deep}.c2ln") is None and catchup.claims_of(f"e30.{deep}.c2ln") == {}
    deep_exp = b64url(b'{"exp": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    assert unverified_expiry(f"e30.{deep_exp}.c2ln") is None


_subs = st.sampled_from(["system:serviceaccount:mod:controller", "system:serviceaccount:mod:writer", "x"]) | json_values
_auds = st.sampled_from([AUD + "read-pods", AUD + "closed", AUD + "write", f"peering.deckhouse.io/{PEER.uuid}/closed",
                         f"peering.deckhouse.io/{PEER.uuid}/read-pods"]) | json_values


@FUZZ
@given(st.one_of(_texts, st.builds(lambda sub, aud: _token_of({"sub": sub, "aud": aud}), _subs,
                                   _auds | st.lists(_auds, max_size=3))),
       st.sampled_from([reasons.TOKEN_AUDIENCE_MISMATCH, reasons.PEER_ISSUER_UNKNOWN, reasons.PEER_NOT_FOUND,
                        reasons.PEER_NOT_CONNECTED, reasons.TOKEN_EXPIRED]),
       st.sampled_from([b"/peers/peer-a/api/v1/pods", b"/peers/nosuch/api", b"/peers/", b"/x"]))
def test_the_catch_up_decides_on_any_token(token, reason, target):
    refusal = Refusal(401, reason, "refused")
    assert catchup.entrance_may_lift(REGISTRY, PEER, refusal, token) in (True, False)
    assert catchup.egress_behind(REGISTRY, PEER, token) in (True, False)
    fields = [(b"Authorization", b"Bearer " + token.encode("utf-8", "surrogatepass"))]
    assert catchup.egress_peer_may_come(REGISTRY, refusal, target, fields, 16 * 1024) in (True, False)


def test_the_catch_up_waits_for_a_closed_capability_of_a_consumer_and_no_other():
    # The properties above must see both answers: a consumer's token for `closed` (opened, Accepted, not effective
    # yet) is waited for; the same token for a capability that does not exist here is not.
    lift = Refusal(401, reasons.TOKEN_AUDIENCE_MISMATCH, "refused")
    assert catchup.entrance_may_lift(REGISTRY, PEER, lift, peer_token(aud=[AUD + "closed"])) is True
    assert catchup.entrance_may_lift(REGISTRY, PEER, lift, peer_token(aud=[AUD + "nosuch"])) is False
    assert catchup.egress_behind(REGISTRY, PEER, _token_of(peer_claims(aud=f"peering.deckhouse.io/{PEER.uuid}/closed")))
