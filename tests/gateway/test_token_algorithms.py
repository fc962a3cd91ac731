"""A JWK's `alg`, when set, binds the algorithm a token signed with that key may use: a token whose
JWK says RS256 does not verify as PS256; a JWK without `alg` allows what its kty allows."""

from __future__ import annotations

import time

import pytest
from jwcrypto import jwk

from contract.errors import Refusal
from gateway.tokens import KeySets, verify_peer_token
from tests.gateway.support import make_token, registry_for


@pytest.fixture(scope="module")
def rsa_key():
    return jwk.JWK.generate(kty="RSA", size=2048, kid="rsa-1")


def _verify(pki, key: jwk.JWK, token: str):
    reg = registry_for(pki, key)
    return verify_peer_token(token, reg.peers["peer"], reg, KeySets(), now=time.time(), skew=30, max_bytes=16384)


def _reason(pki, key: jwk.JWK, token: str) -> str:
    with pytest.raises(Refusal) as err:
        _verify(pki, key, token)
    return err.value.reason


def test_a_jwk_that_says_rs256_never_verifies_ps256(pki, rsa_key):
    bound = jwk.JWK(**{**rsa_key.export(as_dict=True), "alg": "RS256"})
    assert _verify(pki, bound, make_token(bound, alg="RS256")).capabilities == {"read-pods"}
    for alg in ("PS256", "RS512", "PS512"):
        assert _reason(pki, bound, make_token(bound, alg=alg)) == "TokenAlgorithmRefused", alg


def test_a_jwk_without_alg_allows_the_algorithms_of_its_kty(pki, rsa_key, issuer_key):
    assert rsa_key.get("alg") is None and issuer_key.get("alg") is None
    for alg in ("RS256", "PS256", "RS384", "PS512"):
        assert _verify(pki, rsa_key, make_token(rsa_key, alg=alg)).capabilities == {"read-pods"}, alg
    assert _verify(pki, issuer_key, make_token(issuer_key, alg="ES256")).capabilities == {"read-pods"}
    # An EC key does not verify an RSA algorithm's token, whatever its signature: refused for the algorithm.
    forged = make_token(rsa_key, alg="RS256", kid=issuer_key.get("kid"))
    assert _reason(pki, issuer_key, forged) == "TokenAlgorithmRefused"


def test_the_refusal_says_what_the_key_allows(pki, rsa_key):
    bound = jwk.JWK(**{**rsa_key.export(as_dict=True), "alg": "RS256"})
    with pytest.raises(Refusal) as err:
        _verify(pki, bound, make_token(bound, alg="PS256"))
    assert err.value.code == 401 and "PS256" in err.value.message and "RS256" in err.value.message
