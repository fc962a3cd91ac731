"""Grants: the RBAC objects per effective capability, their names, ownership, and the minimal diff."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.rules import capabilities as caps
from control.rules import ownership
from control.rules.effective import EffectiveCapability
from control.rules.grants import desired_grants, diff_objects, grant_name, subjects

CP = {"metadata": {"name": "cluster-b", "uid": "uid-1"}}
UUID = "b0000000-0000-0000-0000-000000000000"


def namespaced(group, resource):
    return {"configmaps": True, "nodes": False}.get(resource)


def _local(name, rules, consumers=(("d8-mod", "ctl"),)) -> caps.ValidatedCapability:
    obj = {
        "metadata": {"name": name},
        "spec": {
            "version": "v1",
            "rules": rules,
            "consumers": [{"namespace": ns, "name": n} for ns, n in consumers],
        },
    }
    lc = caps.validated_capability(obj, namespaced)
    assert lc.accepted
    return lc


CM = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}
NODES = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}
LOCAL = {
    "cm": _local("cm", [CM], consumers=(("d8-b", "two"), ("d8-a", "one"))),
    "nodes": _local("nodes", [NODES]),
    "both": _local("both", [CM, NODES]),
}


def eff(*names):
    return [EffectiveCapability(n, "v1", LOCAL[n].scope) for n in names]


def by_kind(objects):
    out = {}
    for o in objects:
        out.setdefault(o["kind"], []).append(o)
    return out


def test_project_scope_grants_every_paired_namespace():
    g = desired_grants(CP, UUID, eff("cm"), LOCAL, ["p1", "p1-extra", "p2", "p1"])
    kinds = by_kind(g.objects)
    assert set(kinds) == {"Role", "RoleBinding"}
    assert sorted(o["metadata"]["namespace"] for o in kinds["Role"]) == ["p1", "p1-extra", "p2"]
    role, binding = kinds["Role"][0], kinds["RoleBinding"][0]
    assert role["metadata"]["name"] == "d8:peering:cluster-b:cm"
    assert role["rules"] == [CM]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "d8:peering:cluster-b:cm"}
    assert [s["name"] for s in binding["subjects"]] == [
        f"peering:{UUID}:system:serviceaccount:d8-a:one",
        f"peering:{UUID}:system:serviceaccount:d8-b:two",
    ]
    assert role["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "peering",
        "peering.deckhouse.io/clusterpeer": "cluster-b",
        "peering.deckhouse.io/capability": "cm",
    }
    assert role["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "peering.deckhouse.io/v1alpha1",
            "kind": "ClusterPeer",
            "name": "cluster-b",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": False,
        }
    ]
    assert g.status == [{"capability": "cm", "namespaces": ["p1", "p1-extra", "p2"]}]


def test_cluster_scope_and_mixed():
    g = desired_grants(CP, UUID, eff("nodes", "both"), LOCAL, ["p1"])
    kinds = by_kind(g.objects)
    assert sorted(o["metadata"]["name"] for o in kinds["ClusterRole"]) == [
        "d8:peering:cluster-b:both",
        "d8:peering:cluster-b:nodes",
    ]
    assert all("namespace" not in o["metadata"] for o in kinds["ClusterRole"] + kinds["ClusterRoleBinding"])
    both_cr = next(o for o in kinds["ClusterRole"] if o["metadata"]["name"].endswith(":both"))
    assert both_cr["rules"] == [NODES]  # configmaps never in a ClusterRole
    assert [o["metadata"]["name"] for o in kinds["Role"]] == ["d8:peering:cluster-b:both"]
    assert kinds["ClusterRoleBinding"][0]["roleRef"]["kind"] == "ClusterRole"
    assert g.status == [{"capability": "both", "namespaces": ["p1"]}, {"capability": "nodes", "namespaces": []}]


def test_no_paired_projects_no_roles():
    g = desired_grants(CP, UUID, eff("cm"), LOCAL, [])
    assert g.objects == [] and g.status == [{"capability": "cm", "namespaces": []}]


def test_effective_without_local_object_grants_nothing():
    g = desired_grants(CP, UUID, [EffectiveCapability("gone", "v1", ("project",))], LOCAL, ["p1"])
    assert g.objects == [] and g.status == []


def test_long_names_are_bounded_and_distinct():
    a = grant_name("c" * 250, "cap-a")
    b = grant_name("c" * 250, "cap-b")
    assert len(a) == len(b) == 253 and a != b
    assert grant_name("x", "y") == "d8:peering:x:y"
    long_cp = {"metadata": {"name": "c" * 200, "uid": "u"}}
    g = desired_grants(long_cp, UUID, eff("cm"), LOCAL, ["p"])
    lbl = g.objects[0]["metadata"]["labels"]["peering.deckhouse.io/clusterpeer"]
    assert len(lbl) <= 63 and lbl == ownership.label_value("c" * 200)


def test_subjects_are_deduplicated():
    assert len(subjects("u", [("a", "b"), ("a", "b")])) == 1


def _existing(objects, rv="7"):
    out = copy.deepcopy(objects)
    for o in out:
        o["metadata"]["resourceVersion"] = rv
        o["metadata"]["uid"] = "server-set"
        o["metadata"].setdefault("labels", {})["extra-by-someone"] = "x"
        o["metadata"]["managedFields"] = [{"manager": "x"}]
    return out


def test_steady_state_writes_nothing():
    desired = desired_grants(CP, UUID, eff("cm", "nodes", "both"), LOCAL, ["p1", "p2"]).objects
    assert diff_objects(desired, _existing(desired), "cluster-b").empty


def test_diff_create_update_delete():
    old = desired_grants(CP, UUID, eff("cm", "nodes"), LOCAL, ["p1", "p2"]).objects
    existing = _existing(old)
    # The consumers of "cm" changed, p2 left the pairing, "nodes" is no longer effective, "both" became effective.
    local = {**LOCAL, "cm": _local("cm", [CM], consumers=(("d8-a", "one"),))}
    new = desired_grants(CP, UUID, eff("cm", "both"), local, ["p1"]).objects
    d = diff_objects(new, existing, "cluster-b")
    names = lambda objs: sorted((o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objs)
    assert names(d.create) == [
        ("ClusterRole", "", "d8:peering:cluster-b:both"),
        ("ClusterRoleBinding", "", "d8:peering:cluster-b:both"),
        ("Role", "p1", "d8:peering:cluster-b:both"),
        ("RoleBinding", "p1", "d8:peering:cluster-b:both"),
    ]
    assert names(d.update) == [("RoleBinding", "p1", "d8:peering:cluster-b:cm")]
    assert d.update[0]["metadata"]["resourceVersion"] == "7"
    assert names(d.delete) == [
        ("ClusterRole", "", "d8:peering:cluster-b:nodes"),
        ("ClusterRoleBinding", "", "d8:peering:cluster-b:nodes"),
        ("Role", "p2", "d8:peering:cluster-b:cm"),
        ("RoleBinding", "p2", "d8:peering:cluster-b:cm"),
    ]


def test_changed_role_ref_is_replaced():
    desired = desired_grants(CP, UUID, eff("cm"), LOCAL, ["p1"]).objects
    existing = _existing(desired)
    binding = next(o for o in existing if o["kind"] == "RoleBinding")
    binding["roleRef"]["name"] = "something-else"
    d = diff_objects(desired, existing, "cluster-b")
    assert [o["kind"] for o in d.delete] == ["RoleBinding"] and [o["kind"] for o in d.create] == ["RoleBinding"]
    assert d.update == []


@pytest.mark.parametrize(
    "labels",
    [
        {"app.kubernetes.io/managed-by": "someone-else", "peering.deckhouse.io/clusterpeer": "cluster-b"},
        {"app.kubernetes.io/managed-by": "peering", "peering.deckhouse.io/clusterpeer": "cluster-c"},
        {},
    ],
)
def test_foreign_objects_are_never_deleted(labels):
    foreign = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "x", "namespace": "p1", "labels": labels}}
    assert diff_objects([], [foreign], "cluster-b").empty


def test_label_or_owner_drift_is_repaired():
    desired = desired_grants(CP, UUID, eff("nodes"), LOCAL, []).objects
    existing = _existing(desired)
    existing[0]["metadata"]["ownerReferences"] = []
    d = diff_objects(desired, existing, "cluster-b")
    assert [o["kind"] for o in d.update] == ["ClusterRole"]


@settings(deadline=None)
@given(
    st.sets(st.sampled_from(["cm", "nodes", "both"])),
    st.sets(st.sampled_from(["p1", "p2", "p3"])),
    st.sets(st.sampled_from(["cm", "nodes", "both"])),
    st.sets(st.sampled_from(["p1", "p2", "p3"])),
)
def test_applying_the_diff_reaches_desired(caps_a, ns_a, caps_b, ns_b):
    """Whatever existed before, create+update+delete turns it into exactly the desired set, and then nothing."""
    from control.rules.grants import object_key

    before = _existing(desired_grants(CP, UUID, eff(*sorted(caps_a)), LOCAL, ns_a).objects)
    after = desired_grants(CP, UUID, eff(*sorted(caps_b)), LOCAL, ns_b).objects
    d = diff_objects(after, before, "cluster-b")
    world = {object_key(o): o for o in before}
    for o in d.delete:
        del world[object_key(o)]
    for o in d.update + d.create:
        world[object_key(o)] = o
    assert set(world) == {object_key(o) for o in after}
    assert diff_objects(after, list(world.values()), "cluster-b").empty
