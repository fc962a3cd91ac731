"""The lab's Dex answers token exchange as Dex does, over real TLS with the lab's PKI."""

from __future__ import annotations

import base64
import json
import time

import aiohttp
import pytest
from jwcrypto import jwk, jwt

from lab import certs
from lab.dex import (
    GRANT_TOKEN_EXCHANGE, TOKEN_TYPE_ACCESS, TOKEN_TYPE_ID, Dex, opaque_subject, parse_basic_auth,
)

PEER_ISSUER = "https://api.peer.lab"
PREFIX = "peering:1111-2222:"
SA_SUB = "system:serviceaccount:d8-example:controller"


@pytest.fixture(scope="module")
def pki() -> certs.ClusterPKI:
    return certs.cluster_pki("t")


@pytest.fixture(scope="module")
def peer_key() -> jwk.JWK:
    return jwk.JWK.generate(kty="RSA", size=2048, kid="peer-key")


def peer_token(key: jwk.JWK, **overrides) -> str:
    now = int(time.time())
    claims = {"iss": PEER_ISSUER, "sub": SA_SUB, "aud": ["peering.deckhouse.io/x/cap"], "iat": now, "nbf": now,
              "exp": now + 600}
    claims.update(overrides)
    claims = {k: v for k, v in claims.items() if v is not None}
    token = jwt.JWT(header={"alg": "RS256", "kid": key.kid}, claims=claims)
    token.make_signed_token(key)
    return token.serialize()


def jwks_of(key: jwk.JWK) -> dict:
    return {"keys": [key.export_public(as_dict=True)]}


@pytest.fixture
async def dex(pki, peer_key):
    d = Dex("https://dex.t.lab", certs.server_ssl_context(pki.dex))
    d.add_client("kubernetes", "k8s-secret", trusted_peers=["peering"])
    d.add_client("peering", "s3cret/+=")
    d.add_client("outsider", "other")
    d.set_connector("peering-b", PEER_ISSUER, jwks_of(peer_key), PREFIX)
    await d.start()
    yield d
    await d.stop()


@pytest.fixture
async def http(pki):
    async with aiohttp.ClientSession() as s:
        yield s


def form(token: str, **overrides) -> dict:
    f = {
        "grant_type": GRANT_TOKEN_EXCHANGE,
        "connector_id": "peering-b",
        "subject_token": token,
        "subject_token_type": TOKEN_TYPE_ID,
        "requested_token_type": TOKEN_TYPE_ID,
        "audience": "kubernetes",
        "scope": "openid",
    }
    f.update(overrides)
    return {k: v for k, v in f.items() if v is not None}


async def post(http, dex, pki, data, auth=("peering", "s3cret/+=")):
    headers = {}
    if auth is not None:
        # RFC 6749 §2.3.1: id and secret are form-urlencoded before Basic encoding; Dex decodes them.
        from urllib.parse import quote_plus
        raw = f"{quote_plus(auth[0])}:{quote_plus(auth[1])}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
    async with http.post(
        f"https://127.0.0.1:{dex.port}/token", data=data, headers=headers,
        ssl=certs.client_ssl_context(pki.public_ca.cert_pem), server_hostname="dex.t.lab",
    ) as r:
        return r.status, await r.json()


def verify_issued(dex_jwks: dict, token: str) -> dict:
    keys = jwk.JWKSet.from_json(json.dumps(dex_jwks))
    return json.loads(jwt.JWT(jwt=token, key=keys, algs=["RS256"], check_claims=False).claims)


async def get_json(http, dex, pki, path):
    async with http.get(
        f"https://127.0.0.1:{dex.port}{path}", ssl=certs.client_ssl_context(pki.public_ca.cert_pem),
        server_hostname="dex.t.lab",
    ) as r:
        assert r.status == 200
        return await r.json()


async def test_discovery_and_keys_verify_the_issued_token(dex, http, pki, peer_key):
    doc = await get_json(http, dex, pki, "/.well-known/openid-configuration")
    assert doc["issuer"] == "https://dex.t.lab"
    assert doc["token_endpoint"] == "https://dex.t.lab/token"
    assert doc["jwks_uri"] == "https://dex.t.lab/keys"
    assert GRANT_TOKEN_EXCHANGE in doc["grant_types_supported"]
    keys = await get_json(http, dex, pki, "/keys")

    subject_exp = int(time.time()) + 600
    status, body = await post(http, dex, pki, form(peer_token(peer_key, exp=subject_exp)))
    assert status == 200, body
    assert body["issued_token_type"] == TOKEN_TYPE_ID
    assert body["token_type"] == "bearer"
    assert 0 < body["expires_in"] <= 600
    claims = verify_issued(keys, body["access_token"])
    assert claims["iss"] == "https://dex.t.lab"
    assert claims["aud"] == "kubernetes"
    assert claims["azp"] == "peering"
    assert claims["email"] == PREFIX + SA_SUB
    assert claims["email_verified"] is True
    assert claims["groups"] == []
    assert claims["exp"] <= subject_exp
    assert claims["sub"] == opaque_subject(SA_SUB, "peering-b")
    assert SA_SUB not in claims["sub"]
    assert dex.exchange_calls == 1 and dex.tokens_issued == 1


async def test_lifetime_is_capped_at_one_hour(dex, http, pki, peer_key):
    status, body = await post(http, dex, pki, form(peer_token(peer_key, exp=int(time.time()) + 86400)))
    assert status == 200, body
    assert body["expires_in"] <= 3600
    claims = verify_issued(dex.jwks(), body["access_token"])
    assert claims["exp"] - claims["iat"] <= 3600


async def test_form_client_auth_and_access_token_subject_type(dex, http, pki, peer_key):
    data = form(peer_token(peer_key), subject_token_type=TOKEN_TYPE_ACCESS, client_id="peering",
                client_secret="s3cret/+=")
    status, body = await post(http, dex, pki, data, auth=None)
    assert status == 200, body


async def test_audience_of_the_subject_token_is_not_checked(dex, http, pki, peer_key):
    status, body = await post(http, dex, pki, form(peer_token(peer_key, aud="somebody-else")))
    assert status == 200, body
    status, body = await post(http, dex, pki, form(peer_token(peer_key, aud=None)))
    assert status == 200, body


@pytest.mark.parametrize(
    "auth, extra",
    [
        (None, {}),                                                   # no client authentication at all
        (("peering", "wrong"), {}),                                   # wrong secret
        (("nobody", "s3cret/+="), {}),                                # unknown client
        (None, {"client_id": "peering"}),                             # id without secret
        (None, {"client_id": "peering", "client_secret": "wrong"}),   # wrong secret in the form
    ],
)
async def test_client_authentication_failures_are_invalid_client_401(dex, http, pki, peer_key, auth, extra):
    status, body = await post(http, dex, pki, form(peer_token(peer_key), **extra), auth=auth)
    assert (status, body["error"]) == (401, "invalid_client")
    assert body["error_description"] == "Invalid client credentials."
    assert dex.tokens_issued == 0


@pytest.mark.parametrize("connector", [None, "", "peering-unknown"])
async def test_missing_or_unknown_connector_is_invalid_request(dex, http, pki, peer_key, connector):
    status, body = await post(http, dex, pki, form(peer_token(peer_key), connector_id=connector))
    assert (status, body["error"]) == (400, "invalid_request")
    assert body["error_description"] == "Requested connector does not exist."


def _unsigned(claims: dict) -> str:
    def b64(d: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    return f"{b64({'alg': 'none', 'kid': 'peer-key'})}.{b64(claims)}."


def _hs256_with_public_key(key: jwk.JWK) -> str:
    """The classic key confusion: an HMAC token keyed with the issuer's public key."""
    secret = jwk.JWK(kty="oct", k=base64.urlsafe_b64encode(key.export_to_pem()).rstrip(b"=").decode(), kid=key.kid)
    t = jwt.JWT(header={"alg": "HS256", "kid": key.kid},
                claims={"iss": PEER_ISSUER, "sub": SA_SUB, "exp": int(time.time()) + 600})
    t.make_signed_token(secret)
    return t.serialize()


@pytest.mark.parametrize("case", ["wrong key", "wrong issuer", "expired", "no exp", "not a jwt", "alg none",
                                  "hs256 key confusion", "not yet valid"])
async def test_bad_subject_token_is_access_denied_401(dex, http, pki, peer_key, case):
    other = jwk.JWK.generate(kty="RSA", size=2048, kid=peer_key.kid)  # same kid, different key
    token = {
        "wrong key": lambda: peer_token(other),
        "wrong issuer": lambda: peer_token(peer_key, iss="https://api.elsewhere.lab"),
        "expired": lambda: peer_token(peer_key, exp=int(time.time()) - 1),
        "no exp": lambda: peer_token(peer_key, exp=None),
        "not a jwt": lambda: "not-a-token",
        "alg none": lambda: _unsigned({"iss": PEER_ISSUER, "sub": SA_SUB, "exp": int(time.time()) + 600}),
        "hs256 key confusion": lambda: _hs256_with_public_key(peer_key),
        "not yet valid": lambda: peer_token(peer_key, nbf=int(time.time()) + 3600),
    }[case]()
    status, body = await post(http, dex, pki, form(token))
    assert (status, body["error"]) == (401, "access_denied")
    assert dex.tokens_issued == 0 and dex.exchange_calls == 1


async def test_missing_subject_token_and_bad_types(dex, http, pki, peer_key):
    status, body = await post(http, dex, pki, form(None))
    assert (status, body["error"], body["error_description"]) == (400, "invalid_request", "Missing subject_token")
    status, body = await post(http, dex, pki, form(peer_token(peer_key), subject_token_type="urn:x"))
    assert (status, body["error"]) == (400, "request_not_supported")
    status, body = await post(http, dex, pki, form(peer_token(peer_key), requested_token_type="urn:x"))
    assert (status, body["error"]) == (400, "request_not_supported")
    status, body = await post(http, dex, pki, form(peer_token(peer_key), grant_type="password"))
    assert (status, body["error"]) == (400, "unsupported_grant_type")


async def test_audience_client_must_trust_the_requesting_client(dex, http, pki, peer_key):
    status, body = await post(http, dex, pki, form(peer_token(peer_key)), auth=("outsider", "other"))
    assert (status, body["error"]) == (400, "invalid_client")
    assert "does not trust" in body["error_description"]
    # Cross-client by scope, as Dex's other flows spell it.
    data = form(peer_token(peer_key), audience=None, scope="openid audience:server:client_id:kubernetes")
    status, body = await post(http, dex, pki, data)
    assert status == 200, body
    assert verify_issued(dex.jwks(), body["access_token"])["aud"] == "kubernetes"
    # Without an audience the token is for the requesting client itself.
    status, body = await post(http, dex, pki, form(peer_token(peer_key), audience=None))
    assert status == 200, body
    claims = verify_issued(dex.jwks(), body["access_token"])
    assert claims["aud"] == "peering" and "azp" not in claims


async def test_get_on_token_endpoint_is_refused(dex, http, pki):
    async with http.get(f"https://127.0.0.1:{dex.port}/token", ssl=certs.client_ssl_context(pki.public_ca.cert_pem),
                        server_hostname="dex.t.lab") as r:
        assert r.status == 400
        assert (await r.json())["error"] == "invalid_request"


async def test_connector_removal_and_reconfiguration(dex, http, pki, peer_key):
    dex.remove_connector("peering-b")
    status, body = await post(http, dex, pki, form(peer_token(peer_key)))
    assert (status, body["error"]) == (400, "invalid_request")
    dex.set_connector("peering-b", PEER_ISSUER, jwks_of(peer_key), "other:")
    status, body = await post(http, dex, pki, form(peer_token(peer_key)))
    assert status == 200
    assert verify_issued(dex.jwks(), body["access_token"])["email"] == "other:" + SA_SUB


async def test_stop_and_start_again_on_the_same_port(dex, http, pki, peer_key):
    port = dex.port
    await dex.stop()
    assert not dex.running
    with pytest.raises(aiohttp.ClientConnectionError):
        await post(http, dex, pki, form(peer_token(peer_key)))
    await dex.start()
    assert dex.port == port
    status, _ = await post(http, dex, pki, form(peer_token(peer_key)))
    assert status == 200


async def test_tls_name_is_checked(dex, http, pki):
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        async with http.get(f"https://127.0.0.1:{dex.port}/keys",
                            ssl=certs.client_ssl_context(pki.public_ca.cert_pem), server_hostname="api.t.lab"):
            pass


def test_basic_auth_is_url_decoded():
    raw = base64.b64encode(b"peering:s3cret%2F%2B%3D").decode()
    assert parse_basic_auth("Basic " + raw) == ("peering", "s3cret/+=")
    assert parse_basic_auth("Bearer x") is None
    assert parse_basic_auth("Basic !!!") is None


def test_opaque_subject_is_dex_protobuf_encoding():
    sub = opaque_subject("u" * 200, "c")
    raw = base64.urlsafe_b64decode(sub + "=" * (-len(sub) % 4))
    # field 1, length 200 as a two-byte varint, then field 2.
    assert raw[:3] == bytes([0x0A, 0xC8, 0x01])
    assert raw[3:203] == b"u" * 200
    assert raw[203:] == bytes([0x12, 1]) + b"c"
