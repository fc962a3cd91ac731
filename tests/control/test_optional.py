"""APIs of other modules that a cluster may not serve (Project, TokenExchangeProvider), and discovery with a
failing aggregated group: absent or failing means absent for that part only, and an API that appears later is
picked up without a restart."""

from __future__ import annotations

import asyncio

from control import kube as k
from control.informers import Informers
from control.optional import PROJECTS, TOKENEXCHANGEPROVIDERS, served_version
from control.facts import Discovery
from control.workqueue import Controller, Result, Watch
from tests.control.conftest import eventually, start_api

PROJECT_CRD = "projects.deckhouse.io"
PROVIDER_CRD = "tokenexchangeproviders.deckhouse.io"


def project(name: str, version: str = "v1alpha3") -> dict:
    return {"apiVersion": f"deckhouse.io/{version}", "kind": "Project", "metadata": {"name": name}, "spec": {}}


async def test_projects_are_read_at_the_served_version_never_v1alpha1(tmp_path):
    server, kubeconfig = await start_api(tmp_path)
    try:
        async with await KubeSessionFor(kubeconfig) as kube:
            assert await served_version(kube, PROJECTS) == "v1alpha3"
            with_v1 = type(PROJECTS)(PROJECTS.group, PROJECTS.plural, PROJECTS.kind, ("v1alpha1",), "x")
            assert await served_version(kube, with_v1) is None  # listed as a version of the group? never served
    finally:
        await server.stop()


def KubeSessionFor(kubeconfig):
    return k.KubeSession.connect(str(kubeconfig))


async def test_an_absent_api_is_an_empty_synced_cache_until_its_crd_appears_then_it_fills(tmp_path):
    server, kubeconfig = await start_api(tmp_path, without_crds=[PROJECT_CRD])
    try:
        async with await KubeSessionFor(kubeconfig) as kube:
            informers = Informers(kube, optional_recheck=0.05)
            projects = informers.get(PROJECTS)
            events: list[tuple[str, str]] = []
            projects.subscribe(lambda e, o: events.append((e, o["metadata"]["name"])))
            informers.start()
            try:
                async with asyncio.timeout(5):
                    await projects.synced.wait()
                assert projects.available is False and projects.items() == []
                server.install_crd(PROJECT_CRD)
                server.create(project("alpha", "v1alpha2"))  # written at v1alpha2, read at v1alpha3
                await eventually(lambda: projects.get("alpha") is not None, what="the new API's objects")
                assert projects.available is True and projects.resource.version == "v1alpha3"
                assert projects.get("alpha")["apiVersion"] == "deckhouse.io/v1alpha3"
                assert ("ADDED", "alpha") in events
                # The CRD removed (multitenancy-manager's CRDs deleted by hand): gone for real, objects with it.
                server.delete("apiextensions.k8s.io", "customresourcedefinitions", PROJECT_CRD)
                await eventually(lambda: projects.available is False, what="the API to go")
                assert projects.items() == [] and events[-1] == ("DELETED", "alpha")
            finally:
                await informers.stop()
    finally:
        await server.stop()


async def test_a_controller_starts_while_optional_apis_are_absent(tmp_path):
    """The bug this replaces: one never-syncing watch of an unserved API held every reconciler back."""
    server, kubeconfig = await start_api(tmp_path, without_crds=[PROJECT_CRD, PROVIDER_CRD])
    try:
        async with await KubeSessionFor(kubeconfig) as kube:
            informers = Informers(kube, optional_recheck=0.05)
            seen: list[str] = []

            class Probe:
                name = "probe"
                watches = (Watch(k.CLUSTERPEERS), Watch(PROJECTS, keys=lambda e, o: ["from-project"]),
                           Watch(TOKENEXCHANGEPROVIDERS))

                async def reconcile(self, key: str) -> Result:
                    seen.append(key)
                    return Result()

            controller = Controller(informers, [Probe()])
            informers.start()
            try:
                async with asyncio.timeout(5):
                    await controller.start()
                server.create({"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                               "metadata": {"name": "b"}, "spec": {"type": "Invite"}})
                await eventually(lambda: "b" in seen, what="a reconcile")
                server.install_crd(PROJECT_CRD)
                server.create(project("alpha"))
                await eventually(lambda: "from-project" in seen, what="a reconcile from the API that appeared")
            finally:
                await controller.stop()
                await informers.stop()
    finally:
        await server.stop()


async def test_a_failing_aggregated_group_spoils_no_other_group_of_discovery(tmp_path):
    server, kubeconfig = await start_api(tmp_path)
    try:
        server.add_unavailable_api("metrics.k8s.io")
        async with await KubeSessionFor(kubeconfig) as kube:
            discovery = Discovery(kube)
            await discovery.refresh()
            assert discovery.failed_groups == ["metrics.k8s.io"]
            # Cluster-scoped resources of healthy groups stay cluster-scoped (they used to become project scope).
            assert discovery.namespaced("rbac.authorization.k8s.io", "clusterroles") is False
            assert discovery.namespaced("peering.deckhouse.io", "clusterpeers") is False
            assert discovery.namespaced("", "configmaps") is True
            assert discovery.namespaced("metrics.k8s.io", "pods") is None  # unknown: fails closed as project
    finally:
        await server.stop()
