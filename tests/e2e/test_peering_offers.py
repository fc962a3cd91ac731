"""Two lab clusters, each with the real `peering run`: what the rule tables cover, seen end to end. A capability of
cluster scope becomes a ClusterRole and a ClusterRoleBinding; a peer offer whose JWKS is not a JWK Set, or that is
absurdly large, is refused with a reason and the previous offer is kept; TokenExchangeReady says AwaitingIssuer while
the peer publishes no keys and ProviderRejected while the API server refuses the provider. The tests of this module
share one peering and run in order; each puts back what it changed."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from lab.testing import apiserver_backends, lab_clusters
from peering_lab import (API_VERSION, GROUP, clusterpeer, condition, connection_string, fast_peering_command, ready,
                         until, until_equal)

pytestmark = pytest.mark.asyncio(loop_scope="module")

RBAC = "rbac.authorization.k8s.io"
PROJECT = "shop"
CAP = "configmaps-reader"
CLUSTER_CAP = "nodes-reader"
PROVIDERS = ("deckhouse.io", "tokenexchangeproviders")


def _setup(cluster) -> None:
    api = cluster.api
    for ns in ("consumer", PROJECT):
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    api.create({"apiVersion": "deckhouse.io/v1alpha3", "kind": "Project", "metadata": {"name": PROJECT}})
    consumers = [{"kind": "ServiceAccount", "namespace": "consumer", "name": "app"}]
    api.create({"apiVersion": API_VERSION, "kind": "PeeringCapability", "metadata": {"name": CAP},
                "spec": {"version": "v1", "consumers": consumers,
                         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}})
    api.create({"apiVersion": API_VERSION, "kind": "PeeringCapability", "metadata": {"name": CLUSTER_CAP},
                "spec": {"version": "v1", "consumers": consumers,
                         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]}})


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=apiserver_backends())
async def lab(request, tmp_path_factory):
    # api_front: b's published keys are replaced below; a real kube-apiserver's only in what the front answers.
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["a", "b"], peering_command=fast_peering_command,
                            apiserver=request.param, api_front=True) as lab:
        a, b = lab["a"], lab["b"]
        for cluster in (a, b):
            _setup(cluster)
        a.api.create({"apiVersion": API_VERSION, "kind": "ClusterPeer", "metadata": {"name": "to-b"},
                      "spec": {"type": "Invite", "capabilities": [CAP, CLUSTER_CAP]}})
        text = await connection_string(a, "to-b")
        b.api.create({"apiVersion": API_VERSION, "kind": "ClusterPeer", "metadata": {"name": "to-a"},
                      "spec": {"type": "Join", "capabilities": [CAP, CLUSTER_CAP],
                               "join": {"connectionString": text}}})
        yield lab


def _status(cluster, name: str) -> dict:
    return (clusterpeer(cluster, name) or {}).get("status") or {}


def _token_exchange(cluster, name: str) -> str:
    return condition(clusterpeer(cluster, name), "TokenExchangeReady").get("reason", "")


async def _works(cluster, name: str) -> None:
    await until_equal(lambda: (ready(clusterpeer(cluster, name)), _token_exchange(cluster, name)),
                      (("Active", "True", "PeeringReady"), "ProviderReady"), timeout=20)


async def test_a_capability_of_cluster_scope_is_granted_with_a_clusterrole_and_its_binding(lab):
    a, b = lab["a"], lab["b"]
    await _works(a, "to-b")
    await _works(b, "to-a")
    await until_equal(lambda: sorted(_status(a, "to-b").get("effectiveCapabilities") or []), sorted([CAP, CLUSTER_CAP]))
    offered = {c["name"]: c["scope"] for c in _status(b, "to-a")["offer"]["capabilities"]}
    assert offered == {CAP: ["project"], CLUSTER_CAP: ["cluster"]}
    name = f"d8:peering:to-b:{CLUSTER_CAP}"
    role = await until(lambda: a.api.get(RBAC, "clusterroles", name), what="the ClusterRole of the grant")
    binding = await until(lambda: a.api.get(RBAC, "clusterrolebindings", name), what="its ClusterRoleBinding")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]
    assert binding["roleRef"] == {"apiGroup": RBAC, "kind": "ClusterRole", "name": name}
    # The subject is named by the identity a assigned (its ClusterPeer's uid), never by the UUID b claims.
    owner = clusterpeer(a, "to-b")["metadata"]["uid"]
    assert [s["name"] for s in binding["subjects"]] == [f"peering:{owner}:system:serviceaccount:consumer:app"]
    for obj in (role, binding):
        assert [r["uid"] for r in obj["metadata"]["ownerReferences"]] == [owner]
    # A capability of cluster scope gives no Role in the project's namespaces, and one of project scope no
    # ClusterRole.
    assert a.api.get(RBAC, "roles", name, PROJECT) is None
    assert a.api.get(RBAC, "clusterroles", f"d8:peering:to-b:{CAP}") is None
    assert a.api.get(RBAC, "roles", f"d8:peering:to-b:{CAP}", PROJECT) is not None


async def test_a_jwks_that_is_not_a_jwk_set_is_refused_and_the_previous_offer_kept(lab):
    a, b = lab["a"], lab["b"]
    before = _status(a, "to-b")["peer"]
    # b's API server now publishes a symmetric key: not something a token may be verified with.
    b.api.sa_issuer.jwks = lambda: {"keys": [{"kty": "oct", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQ"}]}
    try:
        await until_equal(lambda: ready(clusterpeer(a, "to-b")), ("Active", "False", "OfferInvalid"), timeout=20)
        message = condition(clusterpeer(a, "to-b"), "Ready")["message"]
        assert "kty 'oct'" in message and "previous offer is kept" in message
        assert _status(a, "to-b")["peer"]["issuer"] == before["issuer"]
        assert _status(a, "to-b")["peer"]["projects"] == before["projects"]
        # The provider keeps the keys it had: the consumers of b keep working.
        assert _token_exchange(a, "to-b") == "ProviderReady"
    finally:
        del b.api.sa_issuer.jwks
    await _works(a, "to-b")


def _huge_project(cluster) -> None:
    for i in range(1001):
        cluster.api.create({"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": "huge" if i == 0 else f"huge-{i}",
                                         "labels": {"projects.deckhouse.io/project": "huge"}}})
    cluster.api.create({"apiVersion": "deckhouse.io/v1alpha3", "kind": "Project", "metadata": {"name": "huge"}})


async def test_an_offer_of_absurd_size_is_refused_and_the_previous_offer_kept(lab):
    a, b = lab["a"], lab["b"]
    before = _status(a, "to-b")["peer"]["projects"]
    # One project with more namespaces than an offer may carry for a project (the namespaces first, so that a
    # smaller offer with the project rarely goes out before; b's informers for namespaces and projects are apart,
    # so one may: a's last accepted offer then has "huge" with part of its namespaces).
    # A thousand writes to a real kube-apiserver take seconds: on a thread, since this loop serves the lab's front
    # of it too. The emulator is served by this loop and its store is the loop's alone: on the loop.
    if b.apiserver == "real":
        await asyncio.to_thread(_huge_project, b)
    else:
        _huge_project(b)
    try:
        await until_equal(lambda: ready(clusterpeer(a, "to-b")), ("Active", "False", "OfferTooLarge"), timeout=20)
        assert "more than 1000" in condition(clusterpeer(a, "to-b"), "Ready")["message"]
        kept = _status(a, "to-b")["peer"]["projects"]
        assert [p for p in kept if p["name"] != "huge"] == before
        assert all(len(p["namespaces"]) <= 1000 for p in kept)
        # The pairs of the kept offer stay.
        assert (a.api.get(GROUP, "projectpeers", "to-b", PROJECT) or {}).get("status", {}).get("state") == "Paired"
    finally:
        b.api.delete("deckhouse.io", "projects", "huge")
    await until_equal(lambda: _status(a, "to-b")["peer"]["projects"], before, timeout=20)
    await _works(a, "to-b")


async def test_awaiting_issuer_while_the_peer_publishes_no_keys(lab):
    a, b = lab["a"], lab["b"]
    b.api.sa_issuer.jwks = lambda: {"keys": []}
    try:
        await until_equal(lambda: _token_exchange(a, "to-b"), "AwaitingIssuer", timeout=20)
        # Waiting for the peer's issuer does not make the peering fail.
        assert ready(clusterpeer(a, "to-b")) == ("Active", "True", "PeeringReady")
    finally:
        del b.api.sa_issuer.jwks
    await _works(a, "to-b")


def _provider_rule(cluster) -> tuple[dict, dict]:
    """The chart's ClusterRole of the peering process, and its rule on TokenExchangeProviders."""
    for role in cluster.api.list(RBAC, "clusterroles"):
        for rule in role.get("rules") or ():
            if "tokenexchangeproviders" in (rule.get("resources") or ()):
                return role, rule
    raise AssertionError("the chart's ClusterRole has no rule on tokenexchangeproviders")


async def test_provider_rejected_while_the_api_server_refuses_the_provider(lab):
    a = lab["a"]
    role, rule = _provider_rule(a)
    verbs = list(rule["verbs"])
    rule["verbs"] = ["get", "list", "watch"]  # no create, update, patch or delete any more
    a.api.update(role)
    try:
        a.api.delete(*PROVIDERS, "peering-to-b")
        await until(lambda: a.api.get(*PROVIDERS, "peering-to-b") is None, what="the provider gone")
        await until_equal(lambda: (_token_exchange(a, "to-b"), ready(clusterpeer(a, "to-b"))[1:]),
                          ("ProviderRejected", ("False", "ProviderRejected")), timeout=20)
        assert a.api.get(*PROVIDERS, "peering-to-b") is None
    finally:
        role, rule = _provider_rule(a)
        rule["verbs"] = verbs
        a.api.update(role)
    await _works(a, "to-b")
    assert a.api.get(*PROVIDERS, "peering-to-b") is not None
