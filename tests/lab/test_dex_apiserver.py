"""A lab cluster's Dex and API server together, as in Deckhouse: the module's Dex client is what user-authn makes
of the chart's DexClient, the exchange the gateway makes gives a token the API server accepts as the prefixed
user, and every weaker request gets a token the API server refuses with 401."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from urllib.parse import quote_plus

import aiohttp
import pytest
from jwcrypto import jwk, jwt

from lab import certs
from lab.cluster import DEX_CLIENT_ID, DEX_CLIENT_SECRET_NAME
from lab.dex import GRANT_TOKEN_EXCHANGE, TOKEN_TYPE_ID
from lab.testing import lab_clusters
from lab.userauthn import GROUP, PLURAL

PEER_KEY = jwk.JWK.generate(kty="RSA", size=2048, kid="peer-sa-key")
# Every default Deckhouse cluster has this issuer URL: the peer's, and ours too.
PEER_ISSUER = "https://kubernetes.default.svc.cluster.local"
PREFIX = "peering:2b1f-peer-uuid:"
SUB = "system:serviceaccount:d8-example:controller"
CONTRACT_SCOPE = "openid email profile groups audience:server:client_id:kubernetes"


def peer_sa_token(exp_in: int = 600) -> str:
    now = int(time.time())
    t = jwt.JWT(header={"alg": "RS256", "kid": PEER_KEY.kid},
                claims={"iss": PEER_ISSUER, "sub": SUB, "aud": ["peering.deckhouse.io/a-uuid/cap"], "iat": now,
                        "nbf": now, "exp": now + exp_in})
    t.make_signed_token(PEER_KEY)
    return t.serialize()


@pytest.fixture
async def cluster(tmp_path):
    async with lab_clusters(tmp_path, ["a"], peering_command=None) as lab:
        yield lab["a"]


async def wait_ready(api, name):
    async with asyncio.timeout(10):
        async for _, obj in api.watch(GROUP, PLURAL):
            conds = (obj.get("status") or {}).get("conditions", [])
            if obj["metadata"]["name"] == name and any(c["reason"] == "ProviderReady" for c in conds):
                return


def test_the_module_dex_client_is_what_user_authn_makes_of_the_dexclient():
    assert DEX_CLIENT_ID == "dex-client-peering@d8-peering"
    assert DEX_CLIENT_SECRET_NAME == "dex-client-peering"


async def test_the_dex_client_is_seeded_as_user_authn_makes_it(cluster):
    secret = cluster.api.get("", "secrets", DEX_CLIENT_SECRET_NAME, "d8-peering")
    assert set(secret["data"]) == {"clientSecret"}                 # no clientID: the ID is derived
    assert base64.b64decode(secret["data"]["clientSecret"]).decode() == cluster.dex_client_secret
    assert cluster.api.get("", "secrets", "dex-client", "d8-peering") is None
    assert cluster.dex.clients[DEX_CLIENT_ID].secret == cluster.dex_client_secret
    assert DEX_CLIENT_ID in cluster.dex.clients["kubernetes"].trusted_peers


async def ready_provider(api) -> None:
    """The peer's TokenExchangeProvider `peering-b`, applied by user-authn."""
    api.create({"apiVersion": "deckhouse.io/v1alpha1", "kind": "TokenExchangeProvider",
                "metadata": {"name": "peering-b"},
                "spec": {"issuer": PEER_ISSUER, "jwks": json.dumps({"keys": [PEER_KEY.export_public(as_dict=True)]}),
                         "usernamePrefix": PREFIX, "audiences": ["peering.deckhouse.io/a-uuid/cap"]}})
    await wait_ready(api, "peering-b")


def module_basic_auth(api) -> str:
    """The gateway's credentials, as it reads them: the Secret's clientSecret and the derived ID."""
    secret = api.get("", "secrets", DEX_CLIENT_SECRET_NAME, "d8-peering")
    client_secret = base64.b64decode(secret["data"]["clientSecret"]).decode()
    return "Basic " + base64.b64encode(f"{quote_plus(DEX_CLIENT_ID)}:{quote_plus(client_secret)}".encode()).decode()


async def test_exchanged_token_authenticates_to_the_api_server(cluster):
    api = cluster.api
    await ready_provider(api)
    ctx = certs.client_ssl_context(cluster.pki.public_ca.cert_pem)
    basic = module_basic_auth(api)

    async with aiohttp.ClientSession() as http:
        async def exchange(**fields):
            form = {"grant_type": GRANT_TOKEN_EXCHANGE, "connector_id": "peering-b", "subject_token": peer_sa_token(),
                    "subject_token_type": TOKEN_TYPE_ID, "requested_token_type": TOKEN_TYPE_ID,
                    "scope": CONTRACT_SCOPE, **fields}
            async with http.post(f"https://127.0.0.1:{cluster.dex.port}/token", data=form,
                                 headers={"Authorization": basic}, ssl=ctx, server_hostname="dex.a.lab") as r:
                assert r.status == 200, await r.text()
                return (await r.json())["access_token"]

        async def whoami(token):
            review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
            async with http.post(f"{api.url}/apis/authentication.k8s.io/v1/selfsubjectreviews", json=review,
                                 headers={"Authorization": f"Bearer {token}"}, ssl=ctx,
                                 server_hostname="api.a.lab") as r:
                return r.status, await r.json()

        status, body = await whoami(await exchange())
        assert status == 201, body
        user = body["status"]["userInfo"]
        assert user["username"] == PREFIX + SUB
        assert user["groups"] == ["system:authenticated"]
        assert user["extra"]["user-authn.deckhouse.io/name"] == [PREFIX + SUB]
        assert user["extra"]["user-authn.deckhouse.io/preferred_username"] == [SUB]

        # The peer's user holds no RBAC here yet: authenticated, then forbidden.
        token = await exchange()
        async with http.get(f"{api.url}/api/v1/namespaces/default/configmaps", ssl=ctx, server_hostname="api.a.lab",
                            headers={"Authorization": f"Bearer {token}"}) as r:
            assert r.status == 403
            assert PREFIX + SUB in (await r.json())["message"]

        # Every weaker exchange gets a token Deckhouse's kube-apiserver refuses.
        for fields in (
            {"scope": "openid", "audience": "kubernetes"},                      # the old form: no kubernetes aud
            {"scope": "openid email groups audience:server:client_id:kubernetes"},   # no profile: no name
            {"scope": "openid profile audience:server:client_id:kubernetes"},   # no email: no username
            {"scope": "openid email profile groups"},                           # no cross-client scope
        ):
            status, body = await whoami(await exchange(**fields))
            assert (status, body.get("reason")) == (401, "Unauthorized"), fields


async def test_a_peer_prefixed_like_a_system_user_is_refused_by_user_authn(cluster):
    api = cluster.api
    api.create({"apiVersion": "deckhouse.io/v1alpha1", "kind": "TokenExchangeProvider",
                "metadata": {"name": "peering-system"},
                "spec": {"issuer": PEER_ISSUER, "jwks": json.dumps({"keys": [PEER_KEY.export_public(as_dict=True)]}),
                         "usernamePrefix": "system:"}})
    async with asyncio.timeout(10):
        async for _, obj in api.watch(GROUP, PLURAL):
            conds = (obj.get("status") or {}).get("conditions", [])
            if obj["metadata"]["name"] == "peering-system" and conds:
                assert conds[0]["reason"] == "InvalidSpec" and "system:" in conds[0]["message"]
                break
    assert "peering-system" not in cluster.dex.connectors


async def until(predicate, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "not within the time"
        await asyncio.sleep(0.05)   # bounded poll: the module manager applies a ModuleConfig on its next pass


async def test_without_publish_api_dex_has_no_kubernetes_client_and_answers_500(cluster):
    """user-authn renders Dex's `kubernetes` client only with publishAPI (or the kubeconfig generator): without
    it every exchange asking for the `kubernetes` audience is Dex's 500 server_error, while the module's client
    still authenticates and an exchange without the audience still works."""
    api = cluster.api
    await ready_provider(api)
    config = api.get("deckhouse.io", "moduleconfigs", "user-authn")
    assert config["spec"]["settings"]["publishAPI"]["enabled"] is True, "the lab's clusters start with publishAPI"
    basic = module_basic_auth(api)
    ctx = certs.client_ssl_context(cluster.pki.public_ca.cert_pem)

    async def exchange(scope: str) -> tuple[int, dict]:
        form = {"grant_type": GRANT_TOKEN_EXCHANGE, "connector_id": "peering-b", "subject_token": peer_sa_token(),
                "subject_token_type": TOKEN_TYPE_ID, "requested_token_type": TOKEN_TYPE_ID, "scope": scope}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"https://127.0.0.1:{cluster.dex.port}/token", data=form, ssl=ctx,
                                 headers={"Authorization": basic}, server_hostname="dex.a.lab") as r:
                return r.status, await r.json()

    config["spec"]["settings"] = {"publishAPI": {"enabled": False}}
    api.update(config)
    await until(lambda: "kubernetes" not in cluster.dex.clients)
    assert await exchange(CONTRACT_SCOPE) == (500, {"error": "server_error"})
    status, body = await exchange("openid email profile groups")
    assert status == 200 and "access_token" in body

    # The kubeconfig generator renders it too; publishAPI back on, and the exchange works again.
    config = api.get("deckhouse.io", "moduleconfigs", "user-authn")
    config["spec"]["settings"] = {"kubeconfigGenerator": [{"id": "direct", "masterURI": "https://10.0.0.1:6443"}]}
    api.update(config)
    await until(lambda: "kubernetes" in cluster.dex.clients)
    assert cluster.dex.clients["kubernetes"].trusted_peers == (DEX_CLIENT_ID,)
    status, body = await exchange(CONTRACT_SCOPE)
    assert status == 200, body
