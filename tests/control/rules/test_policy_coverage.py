"""The capability policy has a class, and so a verdict with its reason, for every resource a real kube-apiserver
and a Deckhouse cluster serve.

A real kube-apiserver (lab/real, v1.37) is started with the module's CRDs and the lab's Deckhouse CRDs; its whole
discovery (every version of every group, subresources included) must be the table of contract/served_kubernetes.py
plus those CRDs, and every resource of it and of contract/served_deckhouse.py must be classified: by an entry of
its own, of its resource or of its group, never by the `unknown` default. A kube-apiserver of a newer version,
or a Deckhouse CRD added to the table, fails here until the policy says what it is.
"""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from contract import served
from control.rules import capabilities as caps
from control.rules import capability_policy as policy
from lab.testing import real_binaries_or_skip

ROOT = pathlib.Path(__file__).resolve().parents[3]
CRDS = [ROOT / "charts" / "peering" / "crds", ROOT / "lab" / "apiserver" / "crds"]
READS = {"get", "list", "watch"}


async def _discovery(plane) -> dict[tuple[str, str], bool]:
    """(group, resource or subresource) -> namespaced, from /api/v1 and every version of every group of /apis."""
    out: dict[tuple[str, str], bool] = {}
    async with plane.session() as s:
        async def get(path: str) -> dict:
            async with s.get(path) as r:
                assert r.status == 200, (path, r.status, await r.text())
                return await r.json()

        for r in (await get("/api/v1"))["resources"]:
            out[("", r["name"])] = r["namespaced"]
        for group in (await get("/apis"))["groups"]:
            for version in group["versions"]:
                for r in (await get(f"/apis/{version['groupVersion']}"))["resources"]:
                    out.setdefault((group["name"], r["name"]), r["namespaced"])
    return out


@pytest.fixture(scope="module")
def discovery(tmp_path_factory):
    from lab.real import RealControlPlane

    plane = RealControlPlane("a", tmp_path_factory.mktemp("policy-coverage"), binaries=real_binaries_or_skip())
    asyncio.run(plane.start(crds=CRDS))
    try:
        return asyncio.run(_discovery(plane))
    finally:
        asyncio.run(plane.stop())


def _scope(namespaced: bool) -> str:
    return served.NAMESPACED if namespaced else served.CLUSTER


def _installed() -> set[tuple[str, str]]:
    """(group, resource) of every resource and subresource the CRDs installed on the real backend define."""
    from lab.real.documents import load_documents

    out = set()
    for crd in load_documents(CRDS):
        if crd.get("kind") != "CustomResourceDefinition":
            continue  # the documentation's translations beside them
        spec = crd["spec"]
        out.add((spec["group"], spec["names"]["plural"]))
        for version in spec["versions"]:
            out |= {(spec["group"], f"{spec['names']['plural']}/{sub}") for sub in version.get("subresources") or {}}
    return out


@pytest.mark.real
def test_the_kubernetes_table_is_the_real_discovery(discovery):
    table = {(s.group, s.resource): s.scope for s in served.KUBERNETES if s.by_default}
    installed = _installed()
    real = {key: _scope(ns) for key, ns in discovery.items()}
    assert {k: v for k, v in real.items() if k not in installed} == table, (
        "contract/served_kubernetes.py is not what kube-apiserver serves: write its discovery there, and give "
        "every new resource a class in control/rules/capability_classes.py")
    # The module's own CRDs and the lab's Deckhouse ones are in the Deckhouse table as the API serves them.
    deckhouse = {(s.group, s.resource): s.scope for s in served.DECKHOUSE}
    assert {k: v for k, v in real.items() if k in installed} == {k: deckhouse.get(k) for k in installed}


@pytest.mark.real
def test_every_resource_the_real_api_serves_has_a_class(discovery):
    unclassified = sorted(key for key in discovery if policy.class_of(*key)[0].name == "unknown")
    assert unclassified == [], "resources the capability policy has no class for; add them to CLASSIFIED_TABLE"


@pytest.mark.real
def test_the_real_api_s_cluster_scoped_writes_are_refused(discovery):
    def namespaced(group: str, resource: str):
        return discovery.get((group, resource))

    writable = [key for key, ns in discovery.items() if not ns and not policy.refusals(*key, {"create"}, namespaced)]
    assert writable == []


@pytest.mark.parametrize("item", served.ALL, ids=lambda s: f"{s.group or 'core'}/{s.resource}")
def test_every_served_resource_has_a_class_and_a_verdict_with_its_reason(item):
    cls, row = policy.class_of(item.group, item.resource)
    assert cls.name not in ("unknown", "cluster-wide"), f"{item.group}/{item.resource} ({item.source}) has no class"
    for verbs in (READS, set(policy.WRITE_VERBS)):
        for refusal in policy.refusals(item.group, item.resource, verbs):
            reason = refusal.row.why if refusal.row else refusal.cls.why
            assert reason and refusal.cls.instead
    if item.scope == served.CLUSTER:
        assert policy.refusals(item.group, item.resource, {"patch"}), "a cluster-scoped write must be refused"


@pytest.mark.parametrize("item", [s for s in served.DECKHOUSE if s.scope is None],
                         ids=lambda s: f"{s.group}/{s.resource}")
def test_a_resource_whose_scope_was_not_read_has_a_verdict_that_does_not_depend_on_it(item):
    for answer in (True, False):
        def namespaced(group: str, resource: str, answer=answer):
            return answer

        assert policy.refusals(item.group, item.resource, {"create"}, namespaced), (item, answer)


def test_every_served_resource_is_judged_through_validate_as_the_table_says():
    consumers = [{"namespace": "d8-mod", "name": "controller"}]
    for item in served.ALL:
        for verbs in (["get", "list", "watch"], ["create", "patch", "delete"]):
            spec = {"version": "v1", "consumers": consumers,
                    "rules": [{"apiGroups": [item.group], "resources": [item.resource], "verbs": verbs}]}
            expected = not policy.refusals(item.group, item.resource, set(verbs))
            assert caps.validate(spec).accepted is expected, (item, verbs)
