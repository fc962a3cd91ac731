"""Two lab clusters, each with the real `peering run`: the guide from "Opening capabilities" to "Disabling the
module", in the order an administrator meets it. The tests of this module share one peering and run in order."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import ssl
import time

import aiohttp
import pytest
import pytest_asyncio

from control import pki
from control.rules.access import audience
from lab.testing import apiserver_backends
from peering_lab import (GROUP, clusterpeer, condition, connection_string, create_invite, create_join, peered_lab,
                         ready, ready_message, until, until_equal, WriteCounter)

pytestmark = pytest.mark.asyncio(loop_scope="module")

CAP = "configmaps-reader"
PROJECT = "shop"


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=apiserver_backends())
async def lab(request, tmp_path_factory):
    # Both administrators open the capability (the guide's "Opening capabilities").
    async with peered_lab(tmp_path_factory.mktemp("lab"), CAP, PROJECT, apiserver=request.param, wait=False) as lab:
        # Every test starts from a working peering, whichever runs first (or alone).
        for cluster, name in ((lab["a"], "to-b"), (lab["b"], "to-a")):
            await _active_ready(cluster, name)
        yield lab


def _status(cluster, name: str) -> dict:
    return (clusterpeer(cluster, name) or {}).get("status") or {}


async def _active_ready(cluster, name: str, timeout: float = 20.0) -> None:
    await until_equal(lambda: (*ready(clusterpeer(cluster, name)), ready_message(clusterpeer(cluster, name))),
                      ("Active", "True", "PeeringReady", "the peering works"), timeout=timeout)


def _project_peer(cluster, name: str) -> dict:
    return cluster.api.get(GROUP, "projectpeers", name, PROJECT) or {}


async def test_capability_accepted_and_effective_on_both_sides(lab):
    a, b = lab["a"], lab["b"]
    for cluster, name in ((a, "to-b"), (b, "to-a")):
        await _active_ready(cluster, name)
        cap = cluster.api.get(GROUP, "peeringcapabilities", CAP)
        accepted = condition(cap, "Accepted")
        assert (accepted["status"], accepted["reason"]) == ("True", "Accepted")
        assert accepted["observedGeneration"] == cap["metadata"]["generation"]
        await until_equal(lambda: _status(cluster, name).get("effectiveCapabilities"), [CAP])
        status = _status(cluster, name)
        assert status["grants"] == [{"capability": CAP, "namespaces": [PROJECT]}]
        peer_uuid = status["peer"]["clusterUUID"]
        # The audience is announced once this side's egress serves it (control/rules/access.py): in the pass after
        # the one that made the capability effective, when the registry serving it was published in between.
        await until_equal(lambda: (_status(cluster, name).get("access") or {}).get("audiences"),
                          [{"capability": CAP, "audience": audience(peer_uuid, CAP)}],
                          what=f"the audience of {CAP} announced on {cluster.name}")
        status = _status(cluster, name)
        assert status["access"]["endpoint"] == f"https://peering-gateway.d8-peering.svc/peers/{name}"
        # The grants follow the status (their own reconciler): wait for them, then check them.
        role = await until(lambda: cluster.api.get("rbac.authorization.k8s.io", "roles", f"d8:peering:{name}:{CAP}",
                                                   PROJECT), what="the Role of the grant")
        binding = await until(lambda: cluster.api.get("rbac.authorization.k8s.io", "rolebindings",
                                                      f"d8:peering:{name}:{CAP}", PROJECT), what="its RoleBinding")
        assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]
        # The identity this cluster assigned (its ClusterPeer's uid), never the UUID the peer claims.
        identity = clusterpeer(cluster, name)["metadata"]["uid"]
        assert binding["subjects"][0]["name"] == f"peering:{identity}:system:serviceaccount:consumer:app"
        await until_equal(lambda: (condition(clusterpeer(cluster, name), "TokenExchangeReady").get("reason"),
                                   condition(clusterpeer(cluster, name), "ClientCertEnforced").get("reason"),
                                   condition(clusterpeer(cluster, name), "ServerCertOurs").get("reason")),
                          ("ProviderReady", "ClientCertRequired", "PeeringRootCert"))


async def test_same_named_projects_are_paired(lab):
    a, b = lab["a"], lab["b"]
    for cluster, name, other in ((a, "to-b", b), (b, "to-a", a)):
        await until_equal(lambda: (_project_peer(cluster, name).get("status") or {}).get("state"), "Paired")
        status = _project_peer(cluster, name)["status"]
        assert status["clusterUUID"] == other.info()["uuid"]
        assert status["remoteNamespaces"] == [PROJECT]
        assert status["capabilities"] == [{"name": CAP, "version": "v1", "scope": ["project"]}]
        assert _status(cluster, name)["pairedProjectsCount"] == 1


async def test_offer_change_reaches_the_peer_within_a_second(lab):
    a, b = lab["a"], lab["b"]
    await until_equal(lambda: (_project_peer(b, "to-a").get("status") or {}).get("remoteNamespaces"), [PROJECT])
    start = time.monotonic()
    a.api.create({"apiVersion": "v1", "kind": "Namespace",
                  "metadata": {"name": "shop-eu", "labels": {"projects.deckhouse.io/project": PROJECT}}})
    await until_equal(lambda: (_project_peer(b, "to-a").get("status") or {}).get("remoteNamespaces"),
                      [PROJECT, "shop-eu"], timeout=5)
    assert time.monotonic() - start < 1.5
    projects = _status(b, "to-a")["peer"]["projects"]
    assert projects == [{"name": PROJECT, "namespaces": [PROJECT, "shop-eu"]}]


async def test_a_consumer_crosses_egress_and_entrance(lab):
    a, b = lab["a"], lab["b"]
    sa = b.api.get("", "serviceaccounts", "app", "consumer")
    token, _ = b.api.sa_issuer.issue("consumer", "app", sa["metadata"]["uid"], [audience(a.info()["uuid"], CAP)],
                                     600)
    access = _status(b, "to-a")["access"]
    ctx = ssl.create_default_context(cadata=access["caBundle"])
    host, port = b.resolve_map()["peering-gateway.d8-peering.svc"].rsplit(":", 1)
    resolver = __import__("gateway.resolve", fromlist=["OverrideResolver"]).OverrideResolver(
        {"peering-gateway.d8-peering.svc": f"{host}:{port}"})
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=resolver, ssl=ctx)) as http:
            url = f"{access['endpoint']}/api/v1/namespaces/{PROJECT}/configmaps/prices"
            # Right after Ready, a's gateway may not have published b's token issuer yet (its registry follows the
            # status within moments): that one refusal is waited out, any other answer counts.
            for _ in range(100):
                async with http.get(url, headers={"Authorization": f"Bearer {token}"}) as resp:
                    body = await resp.json()
                if resp.status != 401 or body.get("reason") != "PeerIssuerUnknown":
                    break
                await asyncio.sleep(0.05)
            assert resp.status == 200, (body.get("reason"), body.get("message"))
            assert body["data"] == {"cluster": "a"}
            # Outside the paired project's namespaces the grant gives nothing.
            async with http.get(f"{access['endpoint']}/api/v1/namespaces/consumer/configmaps",
                                headers={"Authorization": f"Bearer {token}"}) as resp:
                assert resp.status == 403
    finally:
        await resolver.close()


async def test_steady_state_makes_no_api_writes(lab):
    a, b = lab["a"], lab["b"]
    for cluster, name in ((a, "to-b"), (b, "to-a")):
        await _active_ready(cluster, name)
    counters = [WriteCounter(a), WriteCounter(b)]
    try:
        # Let the last writes of the previous tests settle: a quiet stretch of several sync intervals.
        deadline = time.monotonic() + 20
        while True:
            seen = [c.total for c in counters]
            await asyncio.sleep(2.5)
            if [c.total for c in counters] == seen or time.monotonic() > deadline:
                break
        for c in counters:
            c.counts.clear()
        # Over several more pulls (every second), self-checks and requeues: nothing written anywhere.
        await asyncio.sleep(4)
        assert [c.counts for c in counters] == [{}, {}]
        # The counter does see writes: a change to the spec is written (by the test) and reconciled.
        obj = clusterpeer(a, "to-b")
        obj["spec"]["capabilities"] = [CAP, "not-declared-here"]
        a.api.update(obj)
        await until(lambda: counters[0].counts.get("update clusterpeers", 0) >= 2, what="the change reconciled")
        obj = clusterpeer(a, "to-b")
        obj["spec"]["capabilities"] = [CAP]
        a.api.update(obj)
    finally:
        for c in counters:
            c.close()


async def test_peer_down_is_unreachable_not_revoked_and_recovers(lab):
    a, b = lab["a"], lab["b"]
    await b.stop_peering()
    try:
        await until_equal(lambda: ready(clusterpeer(a, "to-b")), ("Active", "False", "PeerUnreachable"), timeout=10)
        await until_equal(lambda: (_project_peer(a, "to-b").get("status") or {}).get("state"), "PeerUnreachable")
        # Nothing is taken away: grants and effective capabilities stay.
        assert _status(a, "to-b")["effectiveCapabilities"] == [CAP]
        assert a.api.get("rbac.authorization.k8s.io", "roles", f"d8:peering:to-b:{CAP}", PROJECT) is not None
    finally:
        await b.start_peering()
    await _active_ready(a, "to-b")
    await until_equal(lambda: (_project_peer(a, "to-b").get("status") or {}).get("state"), "Paired")


async def test_a_pair_goes_when_a_side_loses_the_project_and_comes_back_with_it(lab):
    a, b = lab["a"], lab["b"]
    await until(lambda: (_status(a, "to-b").get("grants") or [{}])[0].get("namespaces"), what="the pair's grants")
    paired = _status(a, "to-b")["grants"]
    b.api.delete("deckhouse.io", "projects", PROJECT)
    await until(lambda: a.api.get(GROUP, "projectpeers", "to-b", PROJECT) is None, what="a's ProjectPeer gone")
    await until_equal(lambda: _status(a, "to-b").get("pairedProjectsCount"), 0)
    await until_equal(lambda: _status(a, "to-b").get("grants"), [{"capability": CAP, "namespaces": []}])
    await until(lambda: a.api.get("rbac.authorization.k8s.io", "roles", f"d8:peering:to-b:{CAP}", PROJECT) is None,
                what="the Role of the lost pair gone")
    b.api.create({"apiVersion": "deckhouse.io/v1alpha3", "kind": "Project", "metadata": {"name": PROJECT}})
    await until_equal(lambda: (_project_peer(a, "to-b").get("status") or {}).get("state"), "Paired")
    await until_equal(lambda: _status(a, "to-b").get("grants"), paired)


def _secret_values(cluster, name: str) -> dict[str, str]:
    secret = cluster.api.get("", "secrets", name, "d8-peering") or {}
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def _put_secret_values(cluster, name: str, values: dict[str, str]) -> None:
    secret = cluster.api.get("", "secrets", name, "d8-peering")
    secret["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
    cluster.api.update(secret)


async def test_client_certificate_is_renewed_before_expiry(lab):
    """b's client certificate toward a is made old (issued by a's CA three quarters of its lifetime ago, as if time
    passed): b renews it over /peering/v1/certificate with a CSR for the same key, and the peering stays Ready."""
    a, b = lab["a"], lab["b"]
    await _active_ready(b, "to-a")
    a_ca = _secret_values(a, "peering-ca")
    b_values = _secret_values(b, "peer-to-a")
    b_uuid = b.info()["uuid"]
    past = datetime.datetime.now(datetime.timezone.utc) - pki.CLIENT_CERT_LIFETIME * 3 / 4
    old = pki.issue_client_cert(pki.CertAndKey(a_ca["tls.crt"], a_ca["tls.key"]),
                                pki.csr_for_key(b_values["client.key"], b_uuid), b_uuid, now=past)
    a_values = _secret_values(a, "peer-to-b")
    _put_secret_values(a, "peer-to-b", {**a_values, "issued.crt": old})
    _put_secret_values(b, "peer-to-a", {**b_values, "client.crt": old})
    renewed = await until(lambda: (_secret_values(b, "peer-to-a").get("client.crt") or old) != old and
                          _secret_values(b, "peer-to-a")["client.crt"], what="a renewed certificate", timeout=10)
    assert not pki.needs_renewal(renewed, datetime.datetime.now(datetime.timezone.utc))
    assert pki.public_key_fingerprint(renewed) == pki.public_key_fingerprint(old)
    issued = _secret_values(a, "peer-to-b")["issued.crt"]
    assert issued.startswith(renewed.strip()[:60]) and old.strip() in issued
    await _active_ready(b, "to-a")


async def test_revocation_by_deleting_the_clusterpeer(lab):
    a, b = lab["a"], lab["b"]
    a.api.delete(GROUP, "clusterpeers", "to-b")
    # The other side is refused and says why; it keeps its own objects until its administrator deletes it.
    await until_equal(lambda: ready(clusterpeer(b, "to-a")), ("Active", "False", "PeerRefusedCertificate"),
                      timeout=10)
    assert "revoked" in ready_message(clusterpeer(b, "to-a"))
    # What the ClusterPeer owned is gone with it (garbage collection).
    await until(lambda: a.api.get("", "secrets", "peer-to-b", "d8-peering") is None, what="peer Secret gone")
    await until(lambda: a.api.get(GROUP, "projectpeers", "to-b", PROJECT) is None, what="ProjectPeer gone")
    await until(lambda: a.api.get("rbac.authorization.k8s.io", "roles", f"d8:peering:to-b:{CAP}", PROJECT) is None,
                what="Role gone")
    await until(lambda: a.api.get("deckhouse.io", "tokenexchangeproviders", "peering-to-b") is None,
                what="provider gone")


async def _unpeer(cluster, name: str) -> None:
    """Delete a ClusterPeer (when it is there) and wait until it and its peer Secret are gone."""
    if clusterpeer(cluster, name) is not None:
        cluster.api.delete(GROUP, "clusterpeers", name)
    await until(lambda: clusterpeer(cluster, name) is None
                and cluster.api.get("", "secrets", f"peer-{name}", "d8-peering") is None, what=f"{name} gone")


async def test_provider_name_taken_by_someone_else_is_foreign_and_fails_ready(lab):
    a, b = lab["a"], lab["b"]
    # Two clusters peer once (ClusterUUIDInUse): b's administrator first deletes the peering a revoked above (and
    # a's, when this test runs without the revocation before it, on a worker of its own).
    await _unpeer(a, "to-b")
    await _unpeer(b, "to-a")
    a.api.create({"apiVersion": "deckhouse.io/v1alpha1", "kind": "TokenExchangeProvider",
                  "metadata": {"name": "peering-taken"},
                  "spec": {"issuer": "https://elsewhere.example", "jwks": json.dumps(a.api.sa_issuer.jwks()),
                           "usernamePrefix": "someone:",
                           "audiences": []}})
    create_invite(a, "taken")
    text = await connection_string(a, "taken")
    create_join(b, "taken", text)
    await until_equal(lambda: (ready(clusterpeer(a, "taken")),
                               condition(clusterpeer(a, "taken"), "TokenExchangeReady").get("reason")),
                      (("Active", "False", "ForeignProvider"), "ForeignProvider"), timeout=20)
    # The foreign object is left alone.
    assert a.api.get("deckhouse.io", "tokenexchangeproviders", "peering-taken")["spec"]["usernamePrefix"] == "someone:"
    await _active_ready(b, "taken")


async def test_module_reenabled_with_a_new_ca_marks_old_peerings_error(lab):
    a, b = lab["a"], lab["b"]
    # The clusters peer once: the peerings of the tests before go first (whichever of them ran on this worker).
    for cluster, name in ((a, "taken"), (b, "taken"), (a, "to-b"), (b, "to-a")):
        await _unpeer(cluster, name)
    create_invite(a, "second")
    text = await connection_string(a, "second")
    create_join(b, "second", text)
    await _active_ready(a, "second")
    await a.stop_peering()
    for name in ("peering-ca", "peering-gateway-tls", "peering-egress-tls"):
        a.api.delete("", "secrets", name, "d8-peering")
    await a.start_peering()
    await until_equal(lambda: ready(clusterpeer(a, "second")), ("Error", "False", "CredentialsFromOtherCA"))
    assert "establish the peering anew" in ready_message(clusterpeer(a, "second"))
