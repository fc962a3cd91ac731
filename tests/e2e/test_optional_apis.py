"""A cluster without multitenancy-manager's Project API and without user-authn's TokenExchangeProvider API: the
module still issues invites, joins and syncs offers, says why pairing and the token exchange wait, and once the
APIs are installed it pairs projects and exchanges tokens without a restart."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
import pytest
import pytest_asyncio

from control.rules.access import audience
from lab.multitenancy import create_project
from lab.testing import apiserver_backends, lab_clusters
from peering_lab import GROUP, clusterpeer, condition, fast_peering_command, peer_with_capability, ready, until_equal

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROJECTS = "projects.deckhouse.io"
PROVIDERS = "tokenexchangeproviders.deckhouse.io"
CAP = "configmaps-reader"
PROJECT = "shop"


def command(cluster):
    cmd = fast_peering_command(cluster)
    return None if cmd is None else cmd + ["--optional-api-interval", "0.5"]


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=apiserver_backends())
async def lab(request, tmp_path_factory):
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["a", "b"], peering_command=command,
                            without_crds={"a": [PROJECTS, PROVIDERS]}, apiserver=request.param) as lab:
        a, b = lab["a"], lab["b"]
        create_project(b.api, PROJECT)
        await peer_with_capability(a, b, CAP, wait=False)
        yield lab


async def test_invite_join_and_sync_work_and_conditions_say_what_waits(lab):
    a, b = lab["a"], lab["b"]
    await until_equal(lambda: ready(clusterpeer(b, "to-a")), ("Active", "True", "PeeringReady"), timeout=30)
    # a cannot admit b's consumers (no provider API): ProviderRejected, which the reference makes Ready=False.
    await until_equal(lambda: ready(clusterpeer(a, "to-b")), ("Active", "False", "ProviderRejected"), timeout=30)
    te = condition(clusterpeer(a, "to-b"), "TokenExchangeReady")
    assert (te["status"], te["reason"]) == ("False", "ProviderRejected")
    assert PROVIDERS in te["message"] and "user-authn" in te["message"]
    message = condition(clusterpeer(a, "to-b"), "Ready")["message"]
    assert "projects cannot pair" in message and PROJECTS in message and "multitenancy-manager" in message
    # The rest works: effective capabilities on both sides, b's offer reached a, a offers no project.
    await until_equal(lambda: (clusterpeer(a, "to-b")["status"].get("effectiveCapabilities"),
                               clusterpeer(b, "to-a")["status"].get("effectiveCapabilities")), ([CAP], [CAP]))
    assert [p["name"] for p in clusterpeer(a, "to-b")["status"]["peer"]["projects"]] == [PROJECT]
    assert clusterpeer(b, "to-a")["status"]["peer"]["projects"] == []
    assert clusterpeer(a, "to-b")["status"]["pairedProjectsCount"] == 0


async def test_once_the_apis_are_installed_projects_pair_and_tokens_exchange_without_a_restart(lab):
    a, b = lab["a"], lab["b"]
    pid = a.process.pid
    a.install_crd(PROJECTS)
    a.install_crd(PROVIDERS)
    create_project(a.api, PROJECT)
    a.api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "prices", "namespace": PROJECT},
                  "data": {"cluster": "a"}})
    await until_equal(lambda: ready(clusterpeer(a, "to-b")), ("Active", "True", "PeeringReady"), timeout=30)
    await until_equal(lambda: condition(clusterpeer(a, "to-b"), "TokenExchangeReady").get("reason"), "ProviderReady",
                      timeout=30)
    # The Project API is noticed by its own poll (every 0.5 s here): the message loses its note once it is.
    await until_equal(lambda: condition(clusterpeer(a, "to-b"), "Ready")["message"], "the peering works", timeout=30)
    for cluster, name in ((a, "to-b"), (b, "to-a")):
        await until_equal(lambda: (cluster.api.get(GROUP, "projectpeers", name, PROJECT) or {}).get("status", {})
                          .get("state"), "Paired", timeout=30)
    assert a.process.pid == pid  # the same process picked the APIs up
    # b's consumer reads a's ConfigMap through both gateways: the exchange at a's Dex works now.
    sa = b.api.get("", "serviceaccounts", "app", "consumer")
    token, _ = b.api.sa_issuer.issue("consumer", "app", sa["metadata"]["uid"], [audience(a.info()["uuid"], CAP)], 600)
    access = clusterpeer(b, "to-a")["status"]["access"]
    ctx = ssl.create_default_context(cadata=access["caBundle"])
    from gateway.resolve import OverrideResolver
    resolver = OverrideResolver({"peering-gateway.d8-peering.svc": b.resolve_map()["peering-gateway.d8-peering.svc"]})
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=resolver, ssl=ctx)) as http:
            url = f"{access['endpoint']}/api/v1/namespaces/{PROJECT}/configmaps/prices"

            # The grants follow the pairing (their own reconciler): a refusal may precede them by moments.
            deadline = asyncio.get_running_loop().time() + 15
            while True:
                async with http.get(url, headers={"Authorization": f"Bearer {token}"}) as resp:
                    status, body = resp.status, await resp.json()
                if status == 200 or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert status == 200, (body.get("reason"), body.get("message"))
            assert body["data"] == {"cluster": "a"}
    finally:
        await resolver.close()
