"""ServiceAccount token issuing and verifying: claims, audiences, expiry, keys, algorithms."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone

import pytest
from jwcrypto import jwk, jws

from lab.apiserver.auth.tokens import (
    ServiceAccountIssuer,
    TokenInvalid,
    audiences_of,
    intersect,
    parse_sa_username,
    sa_username,
    unverified_claims,
)

ISSUER = "https://api.a.lab:6443"


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture(scope="module")
def clock() -> Clock:
    return Clock()


@pytest.fixture(scope="module")
def issuer(clock) -> ServiceAccountIssuer:
    # One issuer for the module, the clock reset by each test that moves it.
    return ServiceAccountIssuer(ISSUER, clock=clock)


@pytest.fixture(autouse=True)
def _reset_clock(clock):
    start = clock.now
    yield
    clock.now = start


def _b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def _claims(token: str) -> dict:
    return unverified_claims(token)


def test_issued_token_has_kube_apiserver_claims(issuer, clock):
    token, expires_at = issuer.issue("d8-peering", "peering", "uid-1", ["aud-1", "aud-2"], 3600,
                                     bound_object={"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": "pod-uid"})
    claims = issuer.verify(token, ["aud-2"])
    assert expires_at == clock.now + timedelta(seconds=3600)
    assert claims["iss"] == ISSUER
    assert claims["sub"] == "system:serviceaccount:d8-peering:peering"
    assert claims["aud"] == ["aud-1", "aud-2"]
    assert claims["exp"] == int(expires_at.timestamp())
    assert claims["nbf"] == claims["iat"] == int(clock.now.timestamp())
    assert claims["kubernetes.io"] == {
        "namespace": "d8-peering",
        "serviceaccount": {"name": "peering", "uid": "uid-1"},
        "pod": {"name": "p", "uid": "pod-uid"},
    }
    assert claims["jti"]
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert header == {"alg": "ES256", "kid": issuer.key_id}


def test_default_audience_is_the_issuer_url(issuer):
    token, _ = issuer.issue("ns", "sa", "u", [], 600)
    assert _claims(token)["aud"] == [ISSUER]
    assert issuer.verify(token, None)["sub"] == "system:serviceaccount:ns:sa"


def test_audiences_must_intersect(issuer):
    token, _ = issuer.issue("ns", "sa", "u", ["peering.deckhouse.io/U/C"], 600)
    with pytest.raises(TokenInvalid, match="invalid for the target audiences"):
        issuer.verify(token, None)
    with pytest.raises(TokenInvalid):
        issuer.verify(token, ["other"])
    with pytest.raises(TokenInvalid):
        issuer.verify(token, [])
    assert issuer.verify(token, ["other", "peering.deckhouse.io/U/C"])


def test_expiry_with_leeway(issuer, clock):
    token, expires_at = issuer.issue("ns", "sa", "u", [], 600)
    clock.now = expires_at + timedelta(seconds=59)
    assert issuer.verify(token, None)
    clock.now = expires_at + timedelta(seconds=61)
    with pytest.raises(TokenInvalid, match="expired"):
        issuer.verify(token, None)


def test_not_yet_valid(issuer, clock):
    token, _ = issuer.issue("ns", "sa", "u", [], 600)
    clock.now -= timedelta(minutes=5)
    with pytest.raises(TokenInvalid, match="not valid yet"):
        issuer.verify(token, None)


def test_token_of_another_issuer_key_is_refused(issuer, clock):
    other = ServiceAccountIssuer(ISSUER, clock=clock)
    token, _ = other.issue("ns", "sa", "u", [], 600)
    with pytest.raises(TokenInvalid, match="unknown key"):
        issuer.verify(token, None)


def test_same_kid_with_another_key_fails_the_signature(issuer, clock):
    claims = _claims(issuer.issue("ns", "sa", "u", [], 600)[0])
    forged = jws.JWS(json.dumps(claims).encode())
    forged.add_signature(jwk.JWK.generate(kty="EC", crv="P-256"), alg="ES256",
                         protected=json.dumps({"alg": "ES256", "kid": issuer.key_id}))
    with pytest.raises(TokenInvalid, match="signature"):
        issuer.verify(forged.serialize(compact=True), None)


def test_tampered_payload_fails_the_signature(issuer):
    token, _ = issuer.issue("ns", "sa", "u", [], 600)
    header, payload, sig = token.split(".")
    claims = _claims(token)
    claims["sub"] = "system:serviceaccount:kube-system:admin"
    claims["kubernetes.io"]["namespace"] = "kube-system"
    claims["kubernetes.io"]["serviceaccount"]["name"] = "admin"
    with pytest.raises(TokenInvalid, match="signature"):
        issuer.verify(".".join([header, _b64(claims), sig]), None)


def test_alg_none_is_refused(issuer):
    claims = _claims(issuer.issue("ns", "sa", "u", [], 600)[0])
    unsigned = _b64({"alg": "none", "kid": issuer.key_id}) + "." + _b64(claims) + "."
    with pytest.raises(TokenInvalid, match="ES256"):
        issuer.verify(unsigned, None)


def test_hmac_with_the_public_key_as_secret_is_refused(issuer):
    claims = _claims(issuer.issue("ns", "sa", "u", [], 600)[0])
    public_pem = jwk.JWK(**issuer.jwks()["keys"][0]).export_to_pem()
    secret = jwk.JWK(kty="oct", k=base64.urlsafe_b64encode(public_pem).rstrip(b"=").decode())
    forged = jws.JWS(json.dumps(claims).encode())
    forged.add_signature(secret, alg="HS256", protected=json.dumps({"alg": "HS256", "kid": issuer.key_id}))
    with pytest.raises(TokenInvalid, match="ES256"):
        issuer.verify(forged.serialize(compact=True), None)


def test_other_issuer_url_is_refused(clock):
    one = ServiceAccountIssuer("https://one.lab", clock=clock)
    token, _ = one.issue("ns", "sa", "u", ["x"], 600)
    one.issuer_url = "https://two.lab"
    with pytest.raises(TokenInvalid, match="issuer"):
        one.verify(token, ["x"])


@pytest.mark.parametrize("garbage", ["", "abc", "a.b.c", "a.b", "..", "x" * 10])
def test_garbage_is_refused_without_echoing_it(issuer, garbage):
    with pytest.raises(TokenInvalid) as err:
        issuer.verify(garbage + "SECRETPART", None)
    assert "SECRETPART" not in str(err.value)


def test_refusal_never_contains_the_token(issuer, clock):
    token, expires_at = issuer.issue("ns", "sa", "u", ["only"], 600)
    refusals = []
    with pytest.raises(TokenInvalid) as wrong_audience:
        issuer.verify(token, None)
    refusals.append(wrong_audience.value)
    clock.now = expires_at + timedelta(hours=1)
    with pytest.raises(TokenInvalid) as expired:
        issuer.verify(token, ["only"])
    refusals.append(expired.value)
    for err in refusals:
        assert token not in str(err) and token.split(".")[2] not in str(err)


def test_api_audiences_are_configurable(clock):
    configured = ServiceAccountIssuer(ISSUER, api_audiences=["https://kubernetes.default.svc"], clock=clock)
    token, _ = configured.issue("ns", "sa", "u", [], 600)
    assert _claims(token)["aud"] == ["https://kubernetes.default.svc"]
    assert configured.verify(token, None)


def test_discovery_document_and_jwks_verify_tokens_independently(issuer):
    doc = issuer.discovery_document()
    assert doc["issuer"] == ISSUER
    assert doc["jwks_uri"] == ISSUER + "/openid/v1/jwks"
    assert doc["id_token_signing_alg_values_supported"] == ["ES256"]
    keys = issuer.jwks()["keys"]
    assert len(keys) == 1 and keys[0]["kid"] == issuer.key_id and keys[0]["use"] == "sig"
    assert "d" not in keys[0] and "p" not in keys[0], "private key material must never be published"
    # What a peer does with the published JWKS: verify a token with jwcrypto without our issuer object.
    token, _ = issuer.issue("ns", "sa", "u", ["peer"], 600)
    check = jws.JWS()
    check.deserialize(token)
    check.verify(jwk.JWKSet.from_json(json.dumps(issuer.jwks())).get_key(issuer.key_id))
    assert json.loads(check.payload)["sub"] == "system:serviceaccount:ns:sa"


def test_bad_bound_kind_and_expiry_are_programming_errors(issuer):
    with pytest.raises(ValueError, match="Pod, Secret, Node"):
        issuer.issue("ns", "sa", "u", [], 600, bound_object={"kind": "ConfigMap", "name": "x"})
    with pytest.raises(ValueError):
        issuer.issue("ns", "sa", "u", [], 0)


def test_helpers():
    assert sa_username("ns", "sa") == "system:serviceaccount:ns:sa"
    assert parse_sa_username("system:serviceaccount:ns:sa") == ("ns", "sa")
    assert parse_sa_username("system:serviceaccount:ns") is None
    assert parse_sa_username("peering:u:system:serviceaccount:ns:sa") is None
    assert audiences_of({"aud": "a"}) == ["a"] and audiences_of({}) == [] and audiences_of({"aud": ["a", 1]}) == ["a"]
    assert intersect(["a", "b", "c"], ["c", "x", "a", "c"]) == ["c", "a"]
    assert unverified_claims("not-a-jwt") is None


def test_a_token_in_the_json_serialization_is_refused_as_kube_apiserver_does(issuer):
    """jwcrypto also reads the JWS JSON serialization, whose members beside the signature are not signed; the real
    authenticators read compact tokens only."""
    token, _ = issuer.issue("ns", "sa", "u", [], 600)
    header, payload, sig = token.split(".")
    wrapped = json.dumps({"protected": header, "payload": payload, "signature": sig,
                          "header": {"kid": issuer.key_id}})
    assert jws.JWS().deserialize(wrapped) is None  # jwcrypto takes it
    with pytest.raises(TokenInvalid, match="compact"):
        issuer.verify(wrapped, None)
