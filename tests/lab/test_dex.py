"""The lab's Dex answers token exchange exactly as upstream Dex does, over real TLS with the lab's PKI.

The strict points each have a test that the lenient stand-in of before failed: the form `audience` is ignored,
claims come only by scope, `aud` comes from cross-client scopes checked against trustedPeers (500 when not
trusted), and the token lives idTokensValidFor, not until the subject token's expiry."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import ssl
import time
from urllib.parse import quote_plus

import aiohttp
import pytest
from jwcrypto import jwk, jwt

from lab import certs
from lab.dex import (
    DEFAULT_ID_TOKENS_VALID_FOR, GRANT_TOKEN_EXCHANGE, TOKEN_TYPE_ACCESS, TOKEN_TYPE_ID, Dex, opaque_subject,
    parse_basic_auth,
)

PEER_ISSUER = "https://api.peer.lab"
PREFIX = "peering:1111-2222:"
SA_SUB = "system:serviceaccount:d8-example:controller"
CLIENT, CLIENT_SECRET = "dex-client-peering@d8-peering", "s3cret/+= %"
# The module's exchange, as the contract with the gateway fixes it.
CONTRACT_SCOPE = "openid email profile groups audience:server:client_id:kubernetes"


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
    d.add_client("kubernetes", "k8s-secret", trusted_peers=[CLIENT])
    d.add_client(CLIENT, CLIENT_SECRET)
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
    """The contract's exchange form; overrides replace fields (None removes one)."""
    f = {
        "grant_type": GRANT_TOKEN_EXCHANGE,
        "connector_id": "peering-b",
        "subject_token": token,
        "subject_token_type": TOKEN_TYPE_ID,
        "requested_token_type": TOKEN_TYPE_ID,
        "scope": CONTRACT_SCOPE,
    }
    f.update(overrides)
    return {k: v for k, v in f.items() if v is not None}


def basic(client_id: str, secret: str) -> str:
    # RFC 6749 §2.3.1: id and secret are form-urlencoded before Basic encoding; Dex decodes them.
    return "Basic " + base64.b64encode(f"{quote_plus(client_id)}:{quote_plus(secret)}".encode()).decode()


async def post_full(http, dex, pki, data, auth=(CLIENT, CLIENT_SECRET), authorization=None):
    headers = {}
    if authorization is not None:
        headers["Authorization"] = authorization
    elif auth is not None:
        headers["Authorization"] = basic(*auth)
    async with http.post(
        f"https://127.0.0.1:{dex.port}/token", data=data, headers=headers,
        ssl=certs.client_ssl_context(pki.public_ca.cert_pem), server_hostname="dex.t.lab",
    ) as r:
        return r.status, await r.json(), r.headers


async def post(http, dex, pki, data, auth=(CLIENT, CLIENT_SECRET), authorization=None):
    status, body, _ = await post_full(http, dex, pki, data, auth, authorization)
    return status, body


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


async def test_contract_exchange_gives_a_token_for_kubernetes(dex, http, pki, peer_key):
    doc = await get_json(http, dex, pki, "/.well-known/openid-configuration")
    assert doc["issuer"] == "https://dex.t.lab"
    assert doc["token_endpoint"] == "https://dex.t.lab/token"
    assert doc["jwks_uri"] == "https://dex.t.lab/keys"
    assert GRANT_TOKEN_EXCHANGE in doc["grant_types_supported"]
    keys = await get_json(http, dex, pki, "/keys")

    status, body, headers = await post_full(http, dex, pki, form(peer_token(peer_key)))
    assert status == 200, body
    assert headers["Cache-Control"] == "no-store"
    assert set(body) == {"access_token", "issued_token_type", "token_type", "expires_in"}
    assert body["issued_token_type"] == TOKEN_TYPE_ID
    assert body["token_type"] == "bearer"
    assert DEFAULT_ID_TOKENS_VALID_FOR - 5 <= body["expires_in"] <= DEFAULT_ID_TOKENS_VALID_FOR
    claims = verify_issued(keys, body["access_token"])
    assert claims["iss"] == "https://dex.t.lab"
    # Dex's getAudience: the named peer, then the requesting client, which becomes the authorizing party.
    assert claims["aud"] == ["kubernetes", CLIENT]
    assert claims["azp"] == CLIENT
    # The identity the assumed TokenExchangeProvider connector names (docs/user-authn-contract.md).
    assert claims["email"] == PREFIX + SA_SUB
    assert claims["email_verified"] is True
    assert claims["name"] == PREFIX + SA_SUB
    assert claims["preferred_username"] == SA_SUB
    assert "groups" not in claims          # no groups: Dex leaves the claim out when empty
    assert "federated_claims" not in claims
    assert claims["sub"] == opaque_subject(SA_SUB, "peering-b")
    assert SA_SUB not in claims["sub"]
    assert claims["exp"] - claims["iat"] == DEFAULT_ID_TOKENS_VALID_FOR
    assert dex.exchange_calls == 1 and dex.tokens_issued == 1


async def test_old_form_with_audience_gets_no_kubernetes_audience_and_no_email(dex, http, pki, peer_key):
    """The gateway's former request: `scope=openid` plus a form `audience`. Dex never reads `audience`."""
    status, body = await post(http, dex, pki, form(peer_token(peer_key), scope="openid", audience="kubernetes"))
    assert status == 200, body
    claims = verify_issued(dex.jwks(), body["access_token"])
    assert claims["aud"] == CLIENT and "azp" not in claims
    for absent in ("email", "email_verified", "name", "preferred_username", "groups"):
        assert absent not in claims


async def test_form_audience_is_ignored_even_when_untrusted(dex, http, pki, peer_key):
    status, body = await post(http, dex, pki, form(peer_token(peer_key), audience="outsider"))
    assert status == 200, body
    assert verify_issued(dex.jwks(), body["access_token"])["aud"] == ["kubernetes", CLIENT]


@pytest.mark.parametrize("scope, present, absent", [
    ("openid", set(), {"email", "email_verified", "name", "preferred_username", "groups", "federated_claims"}),
    ("openid email", {"email", "email_verified"}, {"name", "preferred_username"}),
    ("openid profile", {"name", "preferred_username"}, {"email", "email_verified"}),
    ("openid groups", set(), {"groups", "email", "name"}),
    ("openid federated:id", {"federated_claims"}, {"email", "name"}),
    ("", set(), {"email", "name"}),
    ("openid unknown-scope email", {"email"}, {"name"}),
])
async def test_claims_come_only_with_their_scope(dex, http, pki, peer_key, scope, present, absent):
    status, body = await post(http, dex, pki, form(peer_token(peer_key), scope=scope))
    assert status == 200, body
    claims = verify_issued(dex.jwks(), body["access_token"])
    assert present <= set(claims), claims
    assert not (absent & set(claims)), claims
    if "federated_claims" in present:
        assert claims["federated_claims"] == {"connector_id": "peering-b", "user_id": SA_SUB}


@pytest.mark.parametrize("auth, scope", [
    (("outsider", "other"), CONTRACT_SCOPE),                                      # kubernetes does not trust it
    ((CLIENT, CLIENT_SECRET), "openid email audience:server:client_id:nobody"),   # no such peer client
    ((CLIENT, CLIENT_SECRET), "openid audience:server:client_id:outsider"),       # a peer that trusts no one
    ((CLIENT, CLIENT_SECRET), "openid audience:server:client_id:"),               # an empty peer name
])
async def test_untrusted_cross_client_scope_is_500_server_error(dex, http, pki, peer_key, auth, scope):
    status, body = await post(http, dex, pki, form(peer_token(peer_key), scope=scope), auth=auth)
    assert (status, body) == (500, {"error": "server_error"})
    assert dex.tokens_issued == 0


async def test_cross_client_scope_naming_the_client_itself(dex, http, pki, peer_key):
    scope = f"openid audience:server:client_id:{CLIENT}"
    status, body = await post(http, dex, pki, form(peer_token(peer_key), scope=scope))
    assert status == 200, body
    claims = verify_issued(dex.jwks(), body["access_token"])
    assert claims["aud"] == CLIENT and "azp" not in claims
    scope = f"openid audience:server:client_id:{CLIENT} audience:server:client_id:kubernetes"
    status, body = await post(http, dex, pki, form(peer_token(peer_key), scope=scope))
    assert verify_issued(dex.jwks(), body["access_token"])["aud"] == [CLIENT, "kubernetes"]


async def test_exchanged_token_outlives_its_subject_token(dex, http, pki, peer_key):
    subject_exp = int(time.time()) + 30
    status, body = await post(http, dex, pki, form(peer_token(peer_key, exp=subject_exp)))
    assert status == 200, body
    claims = verify_issued(dex.jwks(), body["access_token"])
    assert claims["exp"] == claims["iat"] + DEFAULT_ID_TOKENS_VALID_FOR > subject_exp
    assert body["expires_in"] > 30
    # Nor is a long-lived subject token's lifetime passed on.
    status, body = await post(http, dex, pki, form(peer_token(peer_key, exp=int(time.time()) + 86400)))
    claims = verify_issued(dex.jwks(), body["access_token"])
    assert claims["exp"] - claims["iat"] == DEFAULT_ID_TOKENS_VALID_FOR


async def test_id_tokens_valid_for_is_a_setting(pki, peer_key, http):
    with pytest.raises(ValueError, match="positive"):
        Dex("https://dex.t.lab", id_tokens_valid_for=0)
    d = Dex("https://dex.t.lab", certs.server_ssl_context(pki.dex), id_tokens_valid_for=90)
    d.add_client(CLIENT, CLIENT_SECRET)
    d.set_connector("peering-b", PEER_ISSUER, jwks_of(peer_key), PREFIX)
    await d.start()
    try:
        status, body = await post(http, d, pki, form(peer_token(peer_key, exp=int(time.time()) + 3600), scope="openid"))
        assert status == 200, body
        claims = verify_issued(d.jwks(), body["access_token"])
        assert claims["exp"] - claims["iat"] == 90
        assert 85 <= body["expires_in"] <= 90
    finally:
        await d.stop()


async def test_requested_token_type_defaults_to_access_token(dex, http, pki, peer_key):
    status, body = await post(http, dex, pki, form(peer_token(peer_key), requested_token_type=None))
    assert status == 200, body
    assert body["issued_token_type"] == TOKEN_TYPE_ACCESS
    # Dex's access tokens are signed tokens with the same claims.
    assert verify_issued(dex.jwks(), body["access_token"])["aud"] == ["kubernetes", CLIENT]


async def test_form_client_authentication(dex, http, pki, peer_key):
    data = form(peer_token(peer_key), client_id=CLIENT, client_secret=CLIENT_SECRET)
    status, body = await post(http, dex, pki, data, auth=None)
    assert status == 200, body
    # A Basic header of another scheme is no Basic credential: the form is read, as Go's BasicAuth does.
    status, body = await post(http, dex, pki, data, authorization="Bearer xyz")
    assert status == 200, body


async def test_access_token_subject_cannot_be_verified_against_inline_keys(dex, http, pki, peer_key):
    status, body = await post(http, dex, pki, form(peer_token(peer_key), subject_token_type=TOKEN_TYPE_ACCESS))
    assert (status, body) == (401, {"error": "access_denied"})


async def test_audience_of_the_subject_token_is_not_checked(dex, http, pki, peer_key):
    status, body = await post(http, dex, pki, form(peer_token(peer_key, aud="somebody-else")))
    assert status == 200, body
    status, body = await post(http, dex, pki, form(peer_token(peer_key, aud=None)))
    assert status == 200, body


@pytest.mark.parametrize(
    "auth, extra",
    [
        (None, {}),                                                   # no client authentication at all
        ((CLIENT, "wrong"), {}),                                      # wrong secret
        ((CLIENT, ""), {}),                                           # empty secret
        (("nobody", CLIENT_SECRET), {}),                              # unknown client
        (("peering", CLIENT_SECRET), {}),                             # the DexClient's name is not its ID
        (None, {"client_id": CLIENT}),                                # id without secret
        (None, {"client_id": CLIENT, "client_secret": "wrong"}),      # wrong secret in the form
    ],
)
async def test_client_authentication_failures_are_invalid_client_401(dex, http, pki, peer_key, auth, extra):
    status, body = await post(http, dex, pki, form(peer_token(peer_key), **extra), auth=auth)
    assert (status, body) == (401, {"error": "invalid_client", "error_description": "Invalid client credentials."})
    assert dex.tokens_issued == 0


@pytest.mark.parametrize("raw, what", [("dex%zz:x", "client_id"), (f"{CLIENT}:bad%", "client_secret")])
async def test_badly_escaped_basic_credentials_are_invalid_request(dex, http, pki, peer_key, raw, what):
    header = "Basic " + base64.b64encode(raw.encode()).decode()
    status, body = await post(http, dex, pki, form(peer_token(peer_key)), authorization=header)
    assert (status, body) == (400, {"error": "invalid_request", "error_description": f"{what} improperly encoded"})


@pytest.mark.parametrize("connector", [None, "", "peering-unknown"])
async def test_missing_or_unknown_connector_is_invalid_request(dex, http, pki, peer_key, connector):
    status, body = await post(http, dex, pki, form(peer_token(peer_key), connector_id=connector))
    assert (status, body) == (400, {"error": "invalid_request",
                                    "error_description": "Requested connector does not exist."})


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
                                  "hs256 key confusion", "not yet valid", "no sub"])
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
        "no sub": lambda: peer_token(peer_key, sub=None),
    }[case]()
    status, body = await post(http, dex, pki, form(token))
    assert (status, body) == (401, {"error": "access_denied"})
    assert dex.tokens_issued == 0 and dex.exchange_calls == 1


async def test_nbf_within_go_oidc_leeway_is_accepted(dex, http, pki, peer_key):
    status, body = await post(http, dex, pki, form(peer_token(peer_key, nbf=int(time.time()) + 200)))
    assert status == 200, body


async def test_missing_subject_token_and_bad_types(dex, http, pki, peer_key):
    status, body = await post(http, dex, pki, form(None))
    assert (status, body) == (400, {"error": "invalid_request", "error_description": "Missing subject_token"})
    status, body = await post(http, dex, pki, form(peer_token(peer_key), subject_token_type="urn:x"))
    assert (status, body) == (400, {"error": "request_not_supported",
                                    "error_description": "Invalid subject_token_type."})
    status, body = await post(http, dex, pki, form(peer_token(peer_key), requested_token_type="urn:x"))
    assert (status, body) == (400, {"error": "request_not_supported",
                                    "error_description": "Invalid requested_token_type."})
    status, body = await post(http, dex, pki, form(peer_token(peer_key), grant_type="password"))
    assert (status, body) == (400, {"error": "unsupported_grant_type"})


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
    claims = verify_issued(dex.jwks(), body["access_token"])
    assert (claims["email"], claims["name"], claims["preferred_username"]) == (
        "other:" + SA_SUB, "other:" + SA_SUB, SA_SUB)


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
    raw = base64.b64encode(b"dex-client-peering%40d8-peering:s3cret%2F%2B%3D+x").decode()
    assert parse_basic_auth("Basic " + raw) == ("dex-client-peering@d8-peering", "s3cret/+= x")
    assert parse_basic_auth("basic " + raw) == ("dex-client-peering@d8-peering", "s3cret/+= x")
    assert parse_basic_auth("Bearer x") is None
    assert parse_basic_auth("Basic !!!") is None
    assert parse_basic_auth("Basic " + base64.b64encode(b"no-colon").decode()) is None


def test_opaque_subject_is_dex_protobuf_encoding():
    sub = opaque_subject("u" * 200, "c")
    raw = base64.urlsafe_b64decode(sub + "=" * (-len(sub) % 4))
    # field 1, length 200 as a two-byte varint, then field 2.
    assert raw[:3] == bytes([0x0A, 0xC8, 0x01])
    assert raw[3:203] == b"u" * 200
    assert raw[203:] == bytes([0x12, 1]) + b"c"


async def test_an_issuer_with_a_trailing_slash_as_deckhouse_configures_it(pki, peer_key, http):
    d = Dex("https://dex.t.lab/", certs.server_ssl_context(pki.dex))
    d.add_client(CLIENT, CLIENT_SECRET)
    d.set_connector("peering-b", PEER_ISSUER, jwks_of(peer_key), PREFIX)
    await d.start()
    try:
        doc = await get_json(http, d, pki, "/.well-known/openid-configuration")
        assert doc["issuer"] == "https://dex.t.lab/"
        assert (doc["token_endpoint"], doc["jwks_uri"]) == ("https://dex.t.lab/token", "https://dex.t.lab/keys")
        status, body = await post(http, d, pki, form(peer_token(peer_key), scope="openid"))
        assert status == 200, body
        assert verify_issued(d.jwks(), body["access_token"])["iss"] == "https://dex.t.lab/"
    finally:
        await d.stop()


async def test_a_stopped_dex_has_closed_the_connections_its_clients_kept_open(pki):
    """kube-apiserver keeps its connection to its issuer open, and outlives a Dex whose control plane is kept for
    the next lab cluster: stop() returns once that connection is closed, not leaving it to the event loop's end."""
    d = Dex("https://dex.t.lab", certs.server_ssl_context(pki.dex))
    await d.start()
    ctx = certs.client_ssl_context(pki.public_ca.cert_pem)
    reader, writer = await asyncio.open_connection("127.0.0.1", d.port, ssl=ctx, server_hostname="dex.t.lab")
    try:
        writer.write(b"GET /.well-known/openid-configuration HTTP/1.1\r\nHost: dex.t.lab\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        # Kept alive; then Dex stops.
        await d.stop()
        assert not d.running
        async with asyncio.timeout(5):
            assert await reader.read() == b""
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


async def test_a_client_that_never_answers_close_notify_is_aborted_before_stop_returns(pki, monkeypatch):
    """Left to the event loop, such a connection stays open for asyncio's 30 s TLS shutdown timeout, or past the
    loop's end (an unclosed transport)."""
    import socket

    import lab.dex

    monkeypatch.setattr(lab.dex, "CLOSE_GRACE", 0.2)
    d = Dex("https://dex.t.lab", certs.server_ssl_context(pki.dex))
    await d.start()
    ctx = certs.client_ssl_context(pki.public_ca.cert_pem)

    def connect() -> ssl.SSLSocket:
        tls = ctx.wrap_socket(socket.create_connection(("127.0.0.1", d.port), timeout=5), server_hostname="dex.t.lab")
        tls.sendall(b"GET /keys HTTP/1.1\r\nHost: dex.t.lab\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            data += tls.recv(65536)
        return tls

    tls = await asyncio.to_thread(connect)
    try:
        await d.stop()

        def tcp_end() -> bytes:
            # Past the TLS layer: the server's close_notify is read and not answered, then the socket's end.
            plain = socket.socket(fileno=os.dup(tls.fileno()))
            plain.settimeout(1.0)
            try:
                out = b""
                while chunk := plain.recv(65536):
                    out += chunk
                return out
            except ConnectionResetError:
                return b"reset"
            finally:
                plain.close()
        await asyncio.to_thread(tcp_end)  # returns, not socket.timeout: the server side is gone
    finally:
        tls.close()
