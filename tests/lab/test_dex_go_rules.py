"""The rules the lab's Dex takes from Go and go-oidc (lab/dex_request.py, lab/dex_connector.py, lab/dex_claims.py),
without servers: each was found by the differential test against upstream Dex
(tests/lab/differential/test_dex_differential.py), and is pinned here so that it is held where upstream Dex is not
built."""

from __future__ import annotations

import base64
import json
import time

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding
from jwcrypto import jwk, jwt

from lab.dex import ExchangeRequest, id_token_claims, opaque_subject
from lab.dex_claims import at_hash
from lab.dex_connector import Connector, Identity, SubjectTokenRefused, verify_subject_token
from lab.dex_request import FormError, media_type, parse_basic_auth, parse_form, parse_query, reads_body

FORM = "application/x-www-form-urlencoded"
ISSUER = "https://api.peer.lab"


# --- Go's ParseForm -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (FORM, FORM), (FORM.upper(), FORM), (FORM + "; charset=utf-8", FORM), (FORM + '; charset="utf-8";', FORM),
    (FORM + "; a=1; a=1", FORM), ("text/plain", "text/plain"),
    ("multipart/form-data; boundary=x", "multipart/form-data"),
])
def test_media_types_go_takes(value, expected):
    assert media_type(value) == expected


@pytest.mark.parametrize("value", ["; charset=utf-8", FORM + "; charset", FORM + "; a=1; a=2", "a/b/c", "a/",
                                   FORM + "; ;", FORM + '; a="unterminated'])
def test_media_types_go_refuses(value):
    with pytest.raises(FormError, match="mime: "):
        media_type(value)


def test_only_a_form_urlencoded_body_is_read():
    assert reads_body(FORM) and reads_body(FORM + "; charset=utf-8")
    assert not reads_body(None)              # no Content-Type is application/octet-stream
    assert not reads_body("multipart/form-data; boundary=x")
    form = parse_form("multipart/form-data; boundary=x", None, "grant_type=x")
    assert form.post_value("grant_type") == "" and form.value("grant_type") == "x"


def test_the_query_is_parsed_as_go_does():
    assert parse_query(b"a=1&&b&c=%41+%2B&a=2&=") == [("a", "1"), ("b", ""), ("c", "A +"), ("a", "2"), ("", "")]
    for bad, why in ((b"a=%zz", "invalid URL escape"), (b"a=1;b=2", "semicolon"), (b"%", "invalid URL escape")):
        with pytest.raises(FormError, match=why):
            parse_query(bad)
    assert len(parse_query(b"&".join([b"x"] * 10000))) == 10000
    with pytest.raises(FormError, match="exceeded limit"):
        parse_query(b"&".join([b"x"] * 10001))
    # Values are their bytes: invalid UTF-8 survives, and compares equal only to the same bytes.
    assert parse_query(b"s=%FF")[0][1].encode("utf-8", "surrogateescape") == b"\xff"


def test_the_body_comes_before_the_query_and_only_the_body_is_post_form():
    form = parse_form(FORM, b"connector_id=a&connector_id=b", "connector_id=c&client_id=q")
    assert form.value("connector_id") == "a" and form.value("client_id") == "q"
    assert form.post_value("client_id") == ""
    with pytest.raises(FormError):
        parse_form(FORM, b"a=1", "b=%zz")


def test_basic_credentials_as_go_and_dex_read_them():
    raw = base64.b64encode(b"dex-client-peering%40d8-peering:s3cret%2F%2B%3D+x:y").decode()
    assert parse_basic_auth("bAsIc " + raw) == ("dex-client-peering@d8-peering", "s3cret/+= x:y")
    for header in ("Bearer x", "Basic !!!", "Basic " + base64.b64encode(b"no-colon").decode(), None, "Basic"):
        assert parse_basic_auth(header) is None
    with pytest.raises(FormError, match="client_secret improperly encoded"):
        parse_basic_auth("Basic " + base64.b64encode(b"id:50%").decode())


def test_scopes_split_on_gos_spaces_only():
    scopes = ExchangeRequest.from_form(parse_form(FORM, b"scope=openid%1Femail%09profile%C2%A0groups", "")).scopes
    assert scopes == ["openid\x1femail", "profile", "groups"]


# --- go-oidc's Verify, as the connector applies it -------------------------------------------------------------

@pytest.fixture(scope="module")
def key() -> jwk.JWK:
    return jwk.JWK.generate(kty="RSA", size=2048, kid="k")


@pytest.fixture(scope="module")
def connector(key) -> Connector:
    return Connector("peering-b", ISSUER, {"keys": [key.export_public(as_dict=True)]})


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed(key: jwk.JWK, payload: str, header: dict | None = None) -> str:
    """RS256 over exactly this payload text."""
    signing_input = f"{_b64(json.dumps(header or {'alg': 'RS256', 'kid': 'k'}).encode())}.{_b64(payload.encode())}"
    sig = key.get_op_key("sign").sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64(sig)}"


def claims_text(**literals: str) -> str:
    """A good subject token's claims, then `literals` as members whose JSON text is given as it is."""
    now = int(time.time())
    base = json.dumps({"iss": ISSUER, "sub": "system:serviceaccount:a:b", "iat": now, "exp": now + 600})
    return base[:-1] + "".join(f", {json.dumps(k)}: {v}" for k, v in literals.items()) + "}"


def test_a_good_token_and_its_forms_go_accepts(key, connector):
    now = time.time()
    assert verify_subject_token(connector, signed(key, claims_text()), now)["sub"] == "system:serviceaccount:a:b"
    for literals in ({"exp": f'"{int(now) + 600}"'}, {"exp": f"{int(now) + 600}.9"}, {"nbf": "null"},
                     {"aud": '["a", null]'}, {"aud": "null"}, {"nbf": str(int(now) + 200)},
                     {"EXP": str(int(now) + 60)},  # names match case-insensitively; the last one counts
                     {"_claim_names": '{"groups": "s"}', "_claim_sources": '{"s": {"endpoint": "https://x"}}'}):
        assert verify_subject_token(connector, signed(key, claims_text(**literals)), now), literals


@pytest.mark.parametrize("literals", [
    {"exp": "NaN"}, {"exp": "Infinity"}, {"exp": "1e300"}, {"exp": "1e400"}, {"exp": "99999999999999999999"},
    {"exp": "null"}, {"exp": "true"}, {"exp": '"soon"'}, {"iat": "null"}, {"iat": '"now"'}, {"nbf": '"later"'},
    {"aud": "7"}, {"aud": '["a", 7]'}, {"aud": '{"a": 1}'}, {"nonce": "1"}, {"at_hash": '["x"]'},
    {"\u017fub": "5"}, {"ISS": '"https://elsewhere.lab"'}, {"sub": '""'}, {"sub": "12"},
    {"_claim_names": '{"groups": "s"}'}, {"_claim_names": '{"groups": ""}'}, {"_claim_names": '["groups"]'},
    {"_claim_names": '{"groups": "s"}', "_claim_sources": '{"s": "https://x"}'},
])
def test_claims_go_oidc_refuses(key, connector, literals):
    with pytest.raises(SubjectTokenRefused):
        verify_subject_token(connector, signed(key, claims_text(**literals)), time.time())


def test_segments_must_be_unpadded_base64url(key, connector):
    token = signed(key, claims_text())
    header, payload, sig = token.split(".")
    for bad in (f"{header}.{payload}==.{sig}", f"{header}.{payload}.{sig}=", f"{header}+.{payload}.{sig}",
                f"{header}.{payload}", f"{token}.x", "not-a-token"):
        with pytest.raises(SubjectTokenRefused, match="malformed jwt"):
            verify_subject_token(connector, bad, time.time())


# --- what Dex puts into the token ------------------------------------------------------------------------------

def test_an_access_token_carries_an_at_hash_and_an_id_token_none():
    who = Identity("u", "u", "u", "u", True)
    args = ({}, "client", who, "conn", ["openid"], "https://dex", 1000.0, 60)
    assert "at_hash" not in id_token_claims(*args)
    claims = id_token_claims(*args, access_token=True)
    assert len(claims["at_hash"]) == 22 and claims["at_hash"] != id_token_claims(*args, access_token=True)["at_hash"]
    assert at_hash("abc") == "ungWv48Bz-pBQUDeXa4iIw"  # the OIDC example's form: left half of SHA-256


def test_the_opaque_subject_leaves_an_empty_field_out_as_proto3_does():
    assert base64.urlsafe_b64decode(opaque_subject("", "c") + "==") == b"\x12\x01c"
    assert opaque_subject("u", "c") == _b64(b"\x0a\x01u\x12\x01c")


def test_the_hand_signed_tokens_are_valid_jws(key):
    # The helper `signed` makes what jwcrypto verifies (a sanity check of the test's own signing).
    t = jwt.JWT(jwt=signed(key, claims_text()), key=key, algs=["RS256"], check_claims=False)
    assert json.loads(t.claims)["iss"] == ISSUER
