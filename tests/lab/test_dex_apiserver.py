"""A token Dex issues by exchange is accepted by the lab's API server as the prefixed user, as in Deckhouse."""

from __future__ import annotations

import base64
import json
import time

import aiohttp
import pytest
from jwcrypto import jwk, jwt

from lab import certs
from lab.dex import GRANT_TOKEN_EXCHANGE, TOKEN_TYPE_ID
from lab.testing import lab_clusters
from lab.userauthn import GROUP, PLURAL

PEER_KEY = jwk.JWK.generate(kty="RSA", size=2048, kid="peer-sa-key")
PEER_ISSUER = "https://api.b.lab"
PREFIX = "peering:2b1f-peer-uuid:"
SUB = "system:serviceaccount:d8-example:controller"


def peer_sa_token() -> str:
    now = int(time.time())
    t = jwt.JWT(header={"alg": "RS256", "kid": PEER_KEY.kid},
                claims={"iss": PEER_ISSUER, "sub": SUB, "aud": ["peering.deckhouse.io/a-uuid/cap"], "iat": now,
                        "nbf": now, "exp": now + 600})
    t.make_signed_token(PEER_KEY)
    return t.serialize()


@pytest.fixture
async def cluster(tmp_path):
    async with lab_clusters(tmp_path, ["a"], peering_command=None) as lab:
        yield lab["a"]


async def wait_ready(api, name):
    import asyncio

    async with asyncio.timeout(10):
        async for _, obj in api.watch(GROUP, PLURAL):
            conds = (obj.get("status") or {}).get("conditions", [])
            if obj["metadata"]["name"] == name and any(c["reason"] == "ProviderReady" for c in conds):
                return


async def test_exchanged_token_authenticates_to_the_api_server(cluster):
    api = cluster.api
    api.create({"apiVersion": "deckhouse.io/v1alpha1", "kind": "TokenExchangeProvider",
                "metadata": {"name": "peering-b"},
                "spec": {"issuer": PEER_ISSUER, "jwks": json.dumps({"keys": [PEER_KEY.export_public(as_dict=True)]}),
                         "usernamePrefix": PREFIX, "audiences": ["peering.deckhouse.io/a-uuid/cap"]}})
    await wait_ready(api, "peering-b")

    # The gateway's credentials, as it reads them.
    secret = api.get("", "secrets", "dex-client", "d8-peering")
    client_id = base64.b64decode(secret["data"]["clientID"]).decode()
    client_secret = base64.b64decode(secret["data"]["clientSecret"]).decode()
    ctx = certs.client_ssl_context(cluster.pki.public_ca.cert_pem)

    async with aiohttp.ClientSession() as http:
        async def exchange(**extra):
            form = {"grant_type": GRANT_TOKEN_EXCHANGE, "connector_id": "peering-b", "subject_token": peer_sa_token(),
                    "subject_token_type": TOKEN_TYPE_ID, "requested_token_type": TOKEN_TYPE_ID, "scope": "openid",
                    **extra}
            async with http.post(f"https://127.0.0.1:{cluster.dex.port}/token", data=form,
                                 headers={"Authorization": "Basic " + base64.b64encode(
                                     f"{client_id}:{client_secret}".encode()).decode()}, ssl=ctx,
                                 server_hostname="dex.a.lab") as r:
                assert r.status == 200, await r.text()
                return (await r.json())["access_token"]

        async def whoami(token):
            review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
            async with http.post(f"{api.url}/apis/authentication.k8s.io/v1/selfsubjectreviews", json=review,
                                 headers={"Authorization": f"Bearer {token}"}, ssl=ctx,
                                 server_hostname="api.a.lab") as r:
                return r.status, await r.json()

        status, body = await whoami(await exchange(audience="kubernetes"))
        assert status == 201, body
        user = body["status"]["userInfo"]
        assert user["username"] == PREFIX + SUB
        assert "system:authenticated" in user["groups"]

        # The peer's user holds no RBAC here yet: authenticated, then forbidden.
        token = await exchange(audience="kubernetes")
        async with http.get(f"{api.url}/api/v1/namespaces/default/configmaps", ssl=ctx, server_hostname="api.a.lab",
                            headers={"Authorization": f"Bearer {token}"}) as r:
            assert r.status == 403
            assert PREFIX + SUB in (await r.json())["message"]

        # A token for another audience than `kubernetes` is not accepted by the API server.
        status, _ = await whoami(await exchange())
        assert status == 401
