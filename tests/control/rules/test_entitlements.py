"""Effective capabilities, pairs and grants derived once, from the ClusterPeer, the peer's offer and this cluster's
capabilities and projects: what the status shows is what the grants reconciler writes."""

from __future__ import annotations

from control.rules import capabilities as caps
from control.rules.entitlements import NONE, entitlements

CP = {"metadata": {"name": "to-b", "uid": "u-1"}, "spec": {"capabilities": ["cm", "nodes", "missing", 7]}}
UUID = "b0000000-0000-0000-0000-000000000000"


def namespaced(group, resource):
    return {"configmaps": True, "nodes": False}.get(resource)


def capability(name, resource):
    return {"metadata": {"name": name}, "spec": {
        "version": "v1", "consumers": [{"namespace": "d8-mod", "name": "ctl"}],
        "rules": [{"apiGroups": [""], "resources": [resource], "verbs": ["get"]}]}}


LOCAL = caps.validated_capabilities([capability("cm", "configmaps"), capability("nodes", "nodes")], namespaced)
PEER = {"clusterUUID": UUID, "capabilities": [{"name": "cm", "version": "v1", "scope": ["project"]},
                                              {"name": "nodes", "version": "v2", "scope": ["cluster"]}],
        "projects": [{"name": "shop", "namespaces": ["shop"]}, {"name": "other", "namespaces": ["other"]}]}
PROJECTS = {"shop": ["shop", "shop-eu"], "mine": ["mine"]}


def test_effective_then_pairs_then_grants():
    got = entitlements(CP, peer=PEER, local_capabilities=LOCAL, local_projects=PROJECTS)
    assert got.capability_names == ["cm"]  # nodes: the versions differ; missing: no such capability here
    assert set(got.effective.not_effective) == {"nodes", "missing"}
    assert [p.project for p in got.pairs] == ["shop"] and got.paired_count == 1
    assert got.grants.status == [{"capability": "cm", "namespaces": ["shop", "shop-eu"]}]
    roles = sorted((o["kind"], o["metadata"]["namespace"]) for o in got.grants.objects)
    assert roles == [("Role", "shop"), ("Role", "shop-eu"), ("RoleBinding", "shop"), ("RoleBinding", "shop-eu")]
    assert {s["name"] for o in got.grants.objects if o["kind"] == "RoleBinding" for s in o["subjects"]} == \
        {"peering:u-1:system:serviceaccount:d8-mod:ctl"}  # our ClusterPeer's uid, never the peer's UUID


def test_before_the_first_offer_nothing_is_effective_and_nothing_granted():
    got = entitlements(CP, peer=None, local_capabilities=LOCAL, local_projects=PROJECTS)
    assert got.capability_names == [] and got.pairs == () and got.grants.objects == []
    assert "has not arrived" in got.effective.not_effective["cm"]
    assert (NONE.capability_names, NONE.paired_count, NONE.grants.status) == ([], 0, [])
