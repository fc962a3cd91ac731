"""user-authn against the API server emulator and Dex of a lab cluster: the Ready reasons it writes."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from jwcrypto import jwk

from lab import certs
from lab.apiserver.errors import ApiError
from lab.dex import Dex
from lab.testing import lab_clusters
from lab.userauthn import DELAY_ANNOTATION, FAIL_ANNOTATION, GROUP, PLURAL, UserAuthn

KEY = jwk.JWK.generate(kty="EC", crv="P-256", kid="peer")
JWKS = json.dumps({"keys": [KEY.export_public(as_dict=True)]})


@pytest.fixture
async def cluster(tmp_path):
    async with lab_clusters(tmp_path, ["u"], peering_command=None) as lab:
        yield lab["u"]


def provider(name, prefix="peering:1:", issuer="https://api.peer.lab", jwks=JWKS, annotations=None):
    return {"apiVersion": "deckhouse.io/v1alpha1", "kind": "TokenExchangeProvider",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"issuer": issuer, "jwks": jwks, "usernamePrefix": prefix, "audiences": ["kubernetes"]}}


def ready_of(obj: dict) -> dict | None:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "Ready"), None)


async def wait_for(api, name: str, reason: str, generation: int | None = None, timeout: float = 10) -> dict:
    """Wait on watch events until provider `name` has a Ready condition with `reason` for its generation."""
    def done(obj):
        cond = ready_of(obj)
        gen = obj["metadata"].get("generation")
        return (cond is not None and cond["reason"] == reason and cond["observedGeneration"] == gen
                and obj["status"].get("observedGeneration") == gen and (generation is None or gen == generation))

    current = api.get(GROUP, PLURAL, name)
    if current is not None and done(current):
        return current
    async with asyncio.timeout(timeout):
        async for _, obj in api.watch(GROUP, PLURAL):
            if obj["metadata"]["name"] == name and done(obj):
                return obj
    raise AssertionError("watch ended")


async def test_provider_ready_configures_dex(cluster):
    api, dex = cluster.api, cluster.dex
    api.create(provider("peering-b"))
    obj = await wait_for(api, "peering-b", "ProviderReady")
    cond = ready_of(obj)
    assert cond["status"] == "True" and "peering-b" in cond["message"]
    assert cond["lastTransitionTime"]
    assert dex.connectors["peering-b"].username_prefix == "peering:1:"
    assert dex.connectors["peering-b"].issuer == "https://api.peer.lab"
    assert dex.connectors["peering-b"].jwks == json.loads(JWKS)

    # A spec change is a new generation; its status says it was observed.
    obj["spec"]["issuer"] = "https://api.peer2.lab"
    updated = api.update(obj)
    assert updated["metadata"]["generation"] == 2
    await wait_for(api, "peering-b", "ProviderReady", generation=2)
    assert dex.connectors["peering-b"].issuer == "https://api.peer2.lab"

    # Deleting the provider removes the connector.
    api.delete(GROUP, PLURAL, "peering-b")
    async with asyncio.timeout(5):
        while "peering-b" in dex.connectors:
            await asyncio.sleep(0.02)


async def test_prefix_conflict_blames_the_newer_and_clears_when_the_older_goes(cluster):
    api, dex = cluster.api, cluster.dex
    api.create(provider("first", prefix="peering:1:"))
    await wait_for(api, "first", "ProviderReady")
    api.create(provider("second", prefix="peering:1:x"))  # starts with the first's prefix
    obj = await wait_for(api, "second", "PrefixConflict")
    assert ready_of(obj)["status"] == "False"
    assert "'first'" in ready_of(obj)["message"]
    assert "second" not in dex.connectors
    assert ready_of(api.get(GROUP, PLURAL, "first"))["reason"] == "ProviderReady"

    api.delete(GROUP, PLURAL, "first")
    await wait_for(api, "second", "ProviderReady")
    assert "second" in dex.connectors


async def test_jwks_that_is_not_a_jwk_set_is_invalid_spec(cluster):
    api = cluster.api
    api.create(provider("bad", jwks='{"kty": "EC"}'))
    obj = await wait_for(api, "bad", "InvalidSpec")
    assert "not a JWK Set" in ready_of(obj)["message"]
    assert "bad" not in cluster.dex.connectors


@pytest.mark.parametrize("reason", ["ApplyError", "DiscoveryFailed"])
async def test_failing_on_purpose_and_recovering(cluster, reason):
    api = cluster.api
    api.create(provider("p", annotations={FAIL_ANNOTATION: reason}))
    obj = await wait_for(api, "p", reason)
    assert "on purpose" in ready_of(obj)["message"]
    assert "p" not in cluster.dex.connectors
    # Annotations do not bump the generation; the condition still follows the change.
    del obj["metadata"]["annotations"][FAIL_ANNOTATION]
    api.update(obj)
    await wait_for(api, "p", "ProviderReady")
    assert "p" in cluster.dex.connectors


async def test_slow_provider_is_applied_after_its_delay(cluster):
    api = cluster.api
    start = time.monotonic()
    api.create(provider("slow", annotations={DELAY_ANNOTATION: "1"}))
    # Others are not held up by it.
    api.create(provider("quick", prefix="peering:2:"))
    await wait_for(api, "quick", "ProviderReady")
    assert ready_of(api.get(GROUP, PLURAL, "slow")) is None
    assert "slow" not in cluster.dex.connectors
    await wait_for(api, "slow", "ProviderReady")
    assert time.monotonic() - start >= 1.0


async def test_status_is_not_rewritten_when_nothing_changed(cluster):
    api = cluster.api
    api.create(provider("steady"))
    obj = await wait_for(api, "steady", "ProviderReady")
    rv = obj["metadata"]["resourceVersion"]
    # Another provider's event makes user-authn re-check this one; it must find nothing to write.
    api.create(provider("other", prefix="peering:9:"))
    await wait_for(api, "other", "ProviderReady")
    assert api.get(GROUP, PLURAL, "steady")["metadata"]["resourceVersion"] == rv


async def test_the_crd_refuses_what_user_authn_would_call_invalid(cluster):
    """The schema already refuses a provider without an issuer; user-authn's own check covers what gets past it."""
    body = provider("noissuer")
    del body["spec"]["issuer"]
    with pytest.raises(ApiError) as e:
        cluster.api.create(body)
    assert e.value.code == 422


@pytest.fixture
async def issuer_dex():
    """An OIDC issuer to discover: a Dex stand-in serves discovery and keys like any issuer."""
    pki = certs.cluster_pki("p")
    d = Dex("https://dex.p.lab", certs.server_ssl_context(pki.dex))
    await d.start()
    yield d, pki
    await d.stop()


async def test_discovery_when_jwks_is_empty(cluster, issuer_dex):
    dex_p, pki = issuer_dex
    ua = UserAuthn(cluster.api, cluster.dex, ssl_context=certs.client_ssl_context(pki.public_ca.cert_pem),
                   resolve={"dex.p.lab": f"127.0.0.1:{dex_p.port}"})
    try:
        ok = provider("disc", issuer="https://dex.p.lab", jwks="")
        outcome, keys = await ua.decide(ok)
        assert (outcome.ready, outcome.reason) == (True, "ProviderReady")
        assert keys == dex_p.jwks()

        # The document must name the issuer it was fetched for.
        outcome, _ = await ua.decide(provider("disc", issuer="https://dex.p.lab/other", jwks=""))
        assert outcome.reason == "DiscoveryFailed" and "HTTP 404" in outcome.message

        # Unreachable issuer.
        await dex_p.stop()
        outcome, keys = await ua.decide(ok)
        assert (outcome.ready, outcome.reason, keys) == (False, "DiscoveryFailed", None)
        assert "dex.p.lab" in outcome.message
    finally:
        await ua.stop()


async def test_discovery_refuses_an_untrusted_issuer_certificate(cluster, issuer_dex):
    dex_p, _ = issuer_dex
    other_ca = certs.CA("someone else")
    ua = UserAuthn(cluster.api, cluster.dex, ssl_context=certs.client_ssl_context(other_ca.cert_pem),
                   resolve={"dex.p.lab": f"127.0.0.1:{dex_p.port}"})
    try:
        outcome, _ = await ua.decide(provider("disc", issuer="https://dex.p.lab", jwks=""))
        assert outcome.reason == "DiscoveryFailed"
    finally:
        await ua.stop()


async def test_missing_issuer_is_invalid_spec_when_it_gets_past_the_schema(cluster):
    ua = UserAuthn(cluster.api, cluster.dex)
    body = provider("x")
    del body["spec"]["issuer"]
    outcome, _ = await ua.decide(body)
    assert (outcome.ready, outcome.reason) == (False, "InvalidSpec")
    assert "spec.issuer is required" in outcome.message
    await ua.stop()


async def test_without_the_crd_user_authn_waits_and_serves_once_it_is_installed(tmp_path):
    async with lab_clusters(tmp_path, ["w"], peering_command=None,
                            without_crds=["tokenexchangeproviders.deckhouse.io"]) as lab:
        cluster = lab["w"]
        api = cluster.api
        with pytest.raises(ApiError) as err:
            api.list(GROUP, PLURAL)
        assert err.value.code == 404
        assert not cluster.userauthn.synced.is_set()     # waiting for the API, not failing
        assert not cluster.userauthn._main.done()
        cluster.install_crd("tokenexchangeproviders.deckhouse.io")
        assert cluster.without_crds == []
        api.create(provider("late"))
        await wait_for(api, "late", "ProviderReady")
        assert "late" in cluster.dex.connectors

        # The CRD deleted (its providers with it): the connectors go, and user-authn waits for the CRD again.
        api.delete("apiextensions.k8s.io", "customresourcedefinitions", "tokenexchangeproviders.deckhouse.io")
        async with asyncio.timeout(10):
            while "late" in cluster.dex.connectors:
                await asyncio.sleep(0.02)
        cluster.install_crd("tokenexchangeproviders.deckhouse.io")
        api.create(provider("again"))
        await wait_for(api, "again", "ProviderReady")
        assert set(cluster.dex.connectors) == {"again"}


def test_the_connector_names_the_identity_of_the_user_authn_contract():
    from lab.dex import Connector, Identity

    connector = Connector("peering-b", "https://kubernetes.default.svc.cluster.local", {"keys": []}, "peering:u1:")
    assert connector.identity({"sub": "system:serviceaccount:ns:sa"}) == Identity(
        user_id="system:serviceaccount:ns:sa", username="peering:u1:system:serviceaccount:ns:sa",
        preferred_username="system:serviceaccount:ns:sa", email="peering:u1:system:serviceaccount:ns:sa",
        email_verified=True, groups=())
