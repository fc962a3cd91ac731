"""OIDC bearer authentication against a real HTTPS issuer (discovery + JWKS) with ID tokens signed in the test,
and Deckhouse's AuthenticationConfiguration for Dex: what its claim mappings and validation rules refuse."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
from dataclasses import dataclass, field

import pytest
import trustme
from aiohttp import web
from jwcrypto import jwk, jws

from gateway.resolve import OverrideResolver
from lab.apiserver.auth.oidc import (
    JWKSFetchError, OIDCAuthenticator, deckhouse_dex_authenticator, discovery_jwks_fetcher,
)
from lab.apiserver.auth.tokens import TokenInvalid
from lab.apiserver.auth.types import UserInfo

ISSUER = "https://dex.test.lab"
CLIENT = "kubernetes"


@dataclass
class Issuer:
    """A Dex stand-in: serves its discovery document and key set; counts how often each is fetched."""

    keys: list[jwk.JWK]
    advertised_issuer: str = ISSUER
    requests: list[str] = field(default_factory=list)
    gate: asyncio.Event | None = None
    resolver: OverrideResolver | None = None

    def sign(self, claims: dict, key: jwk.JWK | None = None, header: dict | None = None) -> str:
        key = key or self.keys[0]
        token = jws.JWS(json.dumps(claims).encode())
        token.add_signature(key, alg="RS256", protected=json.dumps(header or {"alg": "RS256", "kid": key.get("kid")}))
        return token.serialize(compact=True)

    async def discovery(self, request: web.Request) -> web.Response:
        self.requests.append(request.path)
        return web.json_response({"issuer": self.advertised_issuer, "jwks_uri": ISSUER + "/keys",
                                  "id_token_signing_alg_values_supported": ["RS256"]})

    async def jwks(self, request: web.Request) -> web.Response:
        self.requests.append(request.path)
        if self.gate is not None:
            await self.gate.wait()
        return web.json_response({"keys": [k.export_public(as_dict=True) for k in self.keys]})


def _rsa(kid: str) -> jwk.JWK:
    return jwk.JWK.generate(kty="RSA", size=2048, kid=kid)


@pytest.fixture(scope="module")
def rsa_keys() -> list[jwk.JWK]:
    return [_rsa("k1"), _rsa("k2")]


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def issuer(ca, rsa_keys):
    state = Issuer(keys=[rsa_keys[0]])
    app = web.Application()
    app.router.add_get("/.well-known/openid-configuration", state.discovery)
    app.router.add_get("/keys", state.jwks)
    runner = web.AppRunner(app)
    await runner.setup()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("dex.test.lab").configure_cert(context)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    state.resolver = OverrideResolver({"dex.test.lab": f"127.0.0.1:{port}"})
    try:
        yield state
    finally:
        if state.gate is not None:
            state.gate.set()
        await runner.cleanup()


class Monotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _authenticator(ca, issuer, **kwargs) -> OIDCAuthenticator:
    return OIDCAuthenticator(ISSUER, [CLIENT], ca_pem=ca.cert_pem.bytes(), resolver=issuer.resolver, **kwargs)


def _claims(**overrides) -> dict:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": CLIENT, "sub": "CiQwOGE4Njg0Yi", "email": "jane@example.com",
              "email_verified": True, "groups": ["admins", "developers"], "iat": now, "exp": now + 600}
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


async def test_valid_id_token_gives_user_and_groups(ca, issuer):
    authn = _authenticator(ca, issuer)
    user = await authn.authenticate_token(issuer.sign(_claims()))
    assert user == UserInfo("jane@example.com", ("admins", "developers"))
    assert issuer.requests == ["/.well-known/openid-configuration", "/keys"]
    # Cached: a second token needs no fetch.
    assert await authn.authenticate_token(issuer.sign(_claims(email="joe@example.com", groups="ops"))) == UserInfo(
        "joe@example.com", ("ops",))
    assert len(issuer.requests) == 2


async def test_prefixes_and_other_claims(ca, issuer):
    authn = _authenticator(ca, issuer, username_claim="sub", groups_claim="roles",
                           username_prefix="oidc:", groups_prefix="oidc:")
    token = issuer.sign(_claims(roles=["a"], email=None))
    assert await authn.authenticate_token(token) == UserInfo("oidc:CiQwOGE4Njg0Yi", ("oidc:a",))


@pytest.mark.parametrize("overrides,reason", [
    ({"aud": "other-client"}, "expected audience"),
    ({"aud": ["other", "another"]}, "expected audience"),
    ({"exp": int(time.time()) - 1}, "expired"),
    ({"exp": None}, "no expiry"),
    ({"nbf": int(time.time()) + 3600}, "not valid yet"),
    ({"email_verified": False}, "oidc: email not verified"),
    ({"email_verified": "true"}, "boolean"),
    ({"email": None}, "'email'"),
    ({"email": ""}, "'email'"),
    ({"groups": [1, 2]}, "array of strings"),
])
async def test_invalid_claims_are_refused(ca, issuer, overrides, reason):
    authn = _authenticator(ca, issuer)
    token = issuer.sign(_claims(**overrides))
    with pytest.raises(TokenInvalid, match=reason) as err:
        await authn.verify(token)
    assert token not in str(err.value)
    assert await authn.authenticate_token(token) is None


async def test_audience_list_containing_the_client_is_accepted(ca, issuer):
    authn = _authenticator(ca, issuer)
    assert await authn.authenticate_token(issuer.sign(_claims(aud=["other", CLIENT])))


async def test_token_of_another_issuer_is_not_ours_and_fetches_nothing(ca, issuer):
    authn = _authenticator(ca, issuer)
    assert await authn.authenticate_token(issuer.sign(_claims(iss="https://elsewhere.lab"))) is None
    assert await authn.authenticate_token("not a token") is None
    assert issuer.requests == []


async def test_alg_none_and_foreign_keys_are_refused(ca, issuer, rsa_keys):
    authn = _authenticator(ca, issuer)
    claims = _claims()
    none_token = issuer.sign(claims).split(".")
    none_header = base64.urlsafe_b64encode(b'{"alg":"none","kid":"k1"}').rstrip(b"=").decode()
    with pytest.raises(TokenInvalid, match="RS256"):
        await authn.verify(f"{none_header}.{none_token[1]}.")
    # Signed by a key the issuer does not publish, under a published kid: the signature fails.
    stranger = _rsa("k1")
    with pytest.raises(TokenInvalid, match="signature"):
        await authn.verify(issuer.sign(claims, key=stranger))


async def test_unknown_kid_refetches_once_per_interval(ca, issuer, rsa_keys):
    clock = Monotonic()
    authn = _authenticator(ca, issuer, monotonic=clock, refetch_interval=5.0)
    assert await authn.authenticate_token(issuer.sign(_claims()))
    assert authn.fetch_count == 1
    # The issuer rotates to k2 right after our fetch: within the interval the new kid is not fetched for.
    issuer.keys = [rsa_keys[1]]
    rotated = issuer.sign(_claims(), key=rsa_keys[1])
    assert await authn.authenticate_token(rotated) is None
    assert authn.fetch_count == 1
    clock.now += 5.0
    assert await authn.authenticate_token(rotated) == UserInfo("jane@example.com", ("admins", "developers"))
    assert authn.fetch_count == 2
    # Made-up kids in a flood cause no more fetches inside the interval.
    for i in range(5):
        assert await authn.authenticate_token(issuer.sign(_claims(), key=_rsa_cached(i))) is None
    assert authn.fetch_count == 2
    assert issuer.requests.count("/keys") == 2


_STRANGERS: dict[int, jwk.JWK] = {}


def _rsa_cached(i: int) -> jwk.JWK:
    if i not in _STRANGERS:
        _STRANGERS[i] = _rsa(f"made-up-{i}")
    return _STRANGERS[i]


async def test_concurrent_cold_requests_share_one_fetch(ca, issuer):
    issuer.gate = asyncio.Event()
    authn = _authenticator(ca, issuer)
    token = issuer.sign(_claims())
    calls = [asyncio.create_task(authn.authenticate_token(token)) for _ in range(20)]
    # Wait until the one fetch has reached the issuer, then let it answer.
    for _ in range(200):
        if "/keys" in issuer.requests:
            break
        await asyncio.sleep(0.01)
    issuer.gate.set()
    users = await asyncio.gather(*calls)
    assert all(u == UserInfo("jane@example.com", ("admins", "developers")) for u in users)
    assert authn.fetch_count == 1 and issuer.requests.count("/keys") == 1


async def test_discovery_issuer_mismatch_refuses(ca, issuer):
    issuer.advertised_issuer = "https://dex.test.lab/"
    with pytest.raises(JWKSFetchError, match="must match exactly"):
        await discovery_jwks_fetcher(ISSUER, ca.cert_pem.bytes(), resolver=issuer.resolver)()
    authn = _authenticator(ca, issuer)
    assert await authn.authenticate_token(issuer.sign(_claims())) is None


async def test_untrusted_issuer_certificate_refuses(issuer):
    other_ca = trustme.CA()
    with pytest.raises(JWKSFetchError, match="chains to the CA bundle"):
        await discovery_jwks_fetcher(ISSUER, other_ca.cert_pem.bytes(), resolver=issuer.resolver)()
    authn = OIDCAuthenticator(ISSUER, [CLIENT], ca_pem=other_ca.cert_pem.bytes(), resolver=issuer.resolver)
    assert await authn.authenticate_token(issuer.sign(_claims())) is None
    assert issuer.requests == []


async def test_custom_fetcher_and_failing_fetcher():
    key = _rsa_cached(99)
    calls = []

    async def fetch():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("issuer down")
        return {"keys": [key.export_public(as_dict=True)]}

    clock = Monotonic()
    authn = OIDCAuthenticator(ISSUER, [CLIENT], jwks_fetcher=fetch, monotonic=clock)
    signer = Issuer(keys=[key])
    token = signer.sign(_claims())
    assert await authn.authenticate_token(token) is None
    clock.now += 10
    assert await authn.authenticate_token(token) == UserInfo("jane@example.com", ("admins", "developers"))


def test_configuration_errors():
    with pytest.raises(ValueError, match="https"):
        OIDCAuthenticator("http://dex.lab", [CLIENT])
    with pytest.raises(ValueError, match="audiences"):
        OIDCAuthenticator(ISSUER, [])
    with pytest.raises(ValueError, match="audiences"):
        OIDCAuthenticator(ISSUER, [""])
    with pytest.raises(ValueError, match="not a valid CEL expression"):
        OIDCAuthenticator(ISSUER, [CLIENT], extra=[("k", "claims.(")])
    with pytest.raises(ValueError, match="not a valid CEL expression"):
        OIDCAuthenticator(ISSUER, [CLIENT], user_validation_rules=[("user.username.startsWith(", "m")])


async def test_any_of_several_audiences_matches(ca, issuer):
    authn = OIDCAuthenticator(ISSUER, ["kubernetes", "other"], ca_pem=ca.cert_pem.bytes(), resolver=issuer.resolver)
    assert await authn.authenticate_token(issuer.sign(_claims(aud="other")))
    assert await authn.authenticate_token(issuer.sign(_claims(aud="third"))) is None


# --- Deckhouse's AuthenticationConfiguration for Dex ---------------------------------------------------------

PEER_USER = "peering:2b1f-peer-uuid:system:serviceaccount:d8-example:controller"


def _dex_claims(**overrides) -> dict:
    """What Dex issues for the module's exchange (scopes openid email profile groups and the kubernetes peer)."""
    return _claims(**{"aud": ["kubernetes", "dex-client-peering@d8-peering"], "azp": "dex-client-peering@d8-peering",
                      "email": PEER_USER, "email_verified": True, "name": PEER_USER,
                      "preferred_username": "system:serviceaccount:d8-example:controller", "groups": None,
                      **overrides})


def _deckhouse(ca, issuer) -> OIDCAuthenticator:
    return deckhouse_dex_authenticator(ISSUER, ca_pem=ca.cert_pem.bytes(), resolver=issuer.resolver)


async def test_deckhouse_accepts_the_exchanged_token_with_its_extras(ca, issuer):
    user = await _deckhouse(ca, issuer).authenticate_token(issuer.sign(_dex_claims()))
    assert user == UserInfo(PEER_USER, (), extra={
        "user-authn.deckhouse.io/name": (PEER_USER,),
        "user-authn.deckhouse.io/preferred_username": ("system:serviceaccount:d8-example:controller",)})
    # The connector id lands in an extra only when Dex was asked for federated claims.
    user = await _deckhouse(ca, issuer).authenticate_token(issuer.sign(_dex_claims(
        federated_claims={"connector_id": "peering-b", "user_id": "x"}, preferred_username=None)))
    assert user.extra == {"user-authn.deckhouse.io/name": (PEER_USER,),
                          "user-authn.deckhouse.io/dex-provider": ("peering-b",)}


@pytest.mark.parametrize("overrides, reason", [
    ({"name": None}, "claims.name"),                                     # no `profile` scope: the CEL fails
    ({"email_verified": False}, "oidc: email not verified"),
    ({"email": None}, "'email'"),                                        # no `email` scope
    ({"aud": "dex-client-peering@d8-peering", "azp": None}, "expected audience"),   # no cross-client scope
    ({"email": "system:serviceaccount:d8-example:controller"}, "username cannot used reserved system: prefix"),
    ({"email": "system:admin"}, "username cannot used reserved system: prefix"),
    ({"groups": ["ops", "system:masters"]}, "groups cannot used reserved system: prefix"),
    ({"groups": "system:nodes"}, "groups cannot used reserved system: prefix"),
])
async def test_deckhouse_refuses(ca, issuer, overrides, reason):
    authn = _deckhouse(ca, issuer)
    token = issuer.sign(_dex_claims(**overrides))
    with pytest.raises(TokenInvalid, match=reason):
        await authn.verify(token)
    assert await authn.authenticate_token(token) is None


async def test_deckhouse_allows_system_inside_a_name_and_ordinary_groups(ca, issuer):
    user = await _deckhouse(ca, issuer).authenticate_token(issuer.sign(_dex_claims(groups=["dev", "ops:system:"])))
    assert user.username == PEER_USER and user.groups == ("dev", "ops:system:")


async def test_a_token_in_the_json_serialization_is_refused(ca, issuer):
    """Its members beside the signature are not signed; kube-apiserver reads compact tokens only."""
    authn = _authenticator(ca, issuer)
    header, payload, sig = issuer.sign(_claims()).split(".")
    wrapped = json.dumps({"protected": header, "payload": payload, "signature": sig, "header": {"kid": "k1"}})
    with pytest.raises(TokenInvalid, match="compact"):
        await authn.verify(wrapped)
