"""PeeringCapability validation and scope: every refusal a careful reviewer expects, and scope splitting."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.rules import capabilities as caps

CONSUMERS = [{"kind": "ServiceAccount", "namespace": "d8-mod", "name": "controller"}]
CLUSTER_SCOPED = {("", "nodes"), ("", "namespaces"), ("storage.k8s.io", "storageclasses"), ("deckhouse.io", "projects")}
NAMESPACED = {("", "configmaps"), ("", "pods"), ("apps", "deployments"), ("", "services"), ("", "secrets")}


def namespaced(group: str, resource: str) -> bool | None:
    if (group, resource) in CLUSTER_SCOPED:
        return False
    if (group, resource) in NAMESPACED:
        return True
    return None


def spec(*rules, consumers=CONSUMERS, version="v1") -> dict:
    return {"version": version, "rules": list(rules), "consumers": consumers}


def rule(groups=("",), resources=("configmaps",), verbs=("get", "list", "watch"), **extra) -> dict:
    out = {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}
    out.update(extra)
    return out


def test_accepted():
    v = caps.validate(spec(rule(), rule(groups=["apps"], resources=["deployments", "deployments/scale"])))
    assert (v.status, v.reason, v.accepted) == ("True", "Accepted", True)


def test_non_resource_urls_accepted():
    v = caps.validate(spec({"nonResourceURLs": ["/version", "/healthz"], "verbs": ["get"]}))
    assert v.accepted


@pytest.mark.parametrize(
    ("the_rule", "reason", "words"),
    [
        (rule(verbs=["*"]), "Wildcard", "verbs"),
        (rule(groups=["*"]), "Wildcard", "apiGroups"),
        (rule(resources=["*"]), "Wildcard", "resources"),
        (rule(resources=["pods/*"]), "Wildcard", "pods/*"),
        (rule(resources=["*/scale"]), "Wildcard", "*/scale"),
        ({"nonResourceURLs": ["/healthz/*"], "verbs": ["get"]}, "Wildcard", "nonResourceURLs"),
        ({"nonResourceURLs": ["*"], "verbs": ["get"]}, "Wildcard", "nonResourceURLs"),
        (rule(verbs=["escalate"]), "PrivilegeEscalation", "escalate"),
        (rule(verbs=["bind"]), "PrivilegeEscalation", "bind"),
        (rule(groups=[""], resources=["users"], verbs=["impersonate"]), "PrivilegeEscalation", "impersonate"),
        (rule(groups=["rbac.authorization.k8s.io"], resources=["roles"]), "PrivilegeEscalation", "RBAC"),
        (rule(groups=["rbac.authorization.k8s.io"], resources=["clusterrolebindings"], verbs=["get"]),
         "PrivilegeEscalation", "RBAC"),
        (rule(resources=["serviceaccounts/token"], verbs=["create"]), "PrivilegeEscalation", "tokens"),
        (rule(groups=["authentication.k8s.io"], resources=["tokenreviews"], verbs=["create"]),
         "PrivilegeEscalation", "token reviews"),
        (rule(groups=["authorization.k8s.io"], resources=["subjectaccessreviews"], verbs=["create"]),
         "PrivilegeEscalation", "access reviews"),
        (rule(groups=["certificates.k8s.io"], resources=["certificatesigningrequests/approval"], verbs=["update"]),
         "PrivilegeEscalation", "certificate"),
        (rule(groups=["certificates.k8s.io"], resources=["certificatesigningrequests"], verbs=["create"]),
         "PrivilegeEscalation", "certificate"),
        (rule(groups=["certificates.k8s.io"], resources=["signers"], verbs=["approve"]), "PrivilegeEscalation", "approve"),
        (rule(resources=["secrets"], verbs=["get"]), "PrivilegeEscalation", "Secrets"),
        (rule(resources=["secrets"], verbs=["create"]), "PrivilegeEscalation", "Secrets"),
        (rule(groups=["peering.deckhouse.io"], resources=["clusterpeers"]), "PrivilegeEscalation", "peering"),
        (rule(groups=["peering.deckhouse.io"], resources=["clusterpeers/sensitive"]), "PrivilegeEscalation", "peering"),
        (rule(groups=["deckhouse.io"], resources=["tokenexchangeproviders"]), "PrivilegeEscalation", "Dex"),
        (rule(groups=["admissionregistration.k8s.io"], resources=["mutatingwebhookconfigurations"]),
         "PrivilegeEscalation", "webhooks"),
        (rule(groups=["admissionregistration.k8s.io"], resources=["validatingwebhookconfigurations"]),
         "PrivilegeEscalation", "webhooks"),
        (rule(groups=["apiextensions.k8s.io"], resources=["customresourcedefinitions"]), "PrivilegeEscalation", "CRDs"),
        (rule(groups=["apiregistration.k8s.io"], resources=["apiservices"]), "PrivilegeEscalation", "API services"),
        (rule(resources=["nodes/proxy"], verbs=["get"]), "PrivilegeEscalation", "kubelet"),
        (rule(resources=["pods/exec"], verbs=["create"]), "PrivilegeEscalation", "commands"),
        (rule(resources=["pods/attach"], verbs=["create"]), "PrivilegeEscalation", "attaches"),
        (rule(resources=["pods/portforward"], verbs=["create"]), "PrivilegeEscalation", "ports"),
        (rule(resources=["pods/proxy"], verbs=["get"]), "PrivilegeEscalation", "proxies"),
        (rule(resources=["services/proxy"], verbs=["get"]), "PrivilegeEscalation", "proxies"),
        (rule(resources=["pods/ephemeralcontainers"], verbs=["patch"]), "PrivilegeEscalation", "shell"),
        (rule(resources=["namespaces"], verbs=["patch"]), "PrivilegeEscalation", "labels"),
        (rule(resources=["nodes"], verbs=["patch"]), "PrivilegeEscalation", "taints"),
        (rule(resources=["persistentvolumes"], verbs=["create"]), "PrivilegeEscalation", "file system"),
        (rule(groups=["deckhouse.io"], resources=["projects"], verbs=["create"]), "PrivilegeEscalation", "projects"),
        (rule(groups=["deckhouse.io"], resources=["moduleconfigs"], verbs=["get"]), "PrivilegeEscalation", "module"),
        (rule(groups=["deckhouse.io"], resources=["clusterauthorizationrules"]), "PrivilegeEscalation", "rules"),
        (rule(verbs=[]), "InvalidRule", "no verbs"),
        (rule(verbs=["Get"]), "InvalidRule", "unknown verbs"),
        (rule(verbs=["frobnicate"]), "InvalidRule", "unknown verbs"),
        (rule(groups=[]), "InvalidRule", "apiGroups"),
        (rule(resources=[]), "InvalidRule", "exactly one"),
        (rule(nonResourceURLs=["/version"]), "InvalidRule", "exactly one"),
        ({"nonResourceURLs": ["/version"], "apiGroups": [""], "verbs": ["get"]}, "InvalidRule", "mixes"),
        ({"nonResourceURLs": ["version"], "verbs": ["get"]}, "InvalidRule", "start with /"),
        ({"nonResourceURLs": ["/version"], "verbs": ["list"]}, "InvalidRule", "unknown verbs"),
        (rule(resources=[""]), "InvalidRule", "empty"),
        ({"apiGroups": [""], "resources": "configmaps", "verbs": ["get"]}, "InvalidRule", "lists of strings"),
        ("not a rule", "InvalidRule", "not an object"),
    ],
)
def test_refused_rules(the_rule, reason, words):
    v = caps.validate(spec(rule(), the_rule))
    assert (v.status, v.reason) == ("False", reason)
    assert words in v.message
    assert "rule 2" in v.message or "rules" in v.message


def test_reading_namespaces_nodes_and_volumes_is_fine():
    for resource in ("namespaces", "nodes", "persistentvolumes"):
        assert caps.validate(spec(rule(resources=[resource], verbs=["get", "list", "watch"]))).accepted


@pytest.mark.parametrize(
    ("the_spec", "reason"),
    [
        ({}, "InvalidVersion"),
        (None, "InvalidVersion"),
        (spec(version=""), "InvalidVersion"),
        (spec(rule(), version="  "), "InvalidVersion"),
        (spec(), "EmptyRules"),
        ({"version": "v1", "rules": "x", "consumers": CONSUMERS}, "InvalidRule"),
        (spec(rule(), consumers=[]), "NoConsumers"),
        (spec(rule(), consumers=[{"kind": "User", "name": "x", "namespace": "y"}]), "InvalidConsumer"),
        (spec(rule(), consumers=[{"name": "x"}]), "InvalidConsumer"),
        (spec(rule(), consumers=["x"]), "InvalidConsumer"),
        (spec(rule(), consumers="x"), "InvalidConsumer"),
    ],
)
def test_refused_specs(the_spec, reason):
    v = caps.validate(the_spec)
    assert (v.status, v.reason) == ("False", reason)
    assert "Fix spec" in v.message


def test_most_severe_reason_wins_and_message_is_bounded():
    v = caps.validate(spec(*(rule(verbs=["bind"]) for _ in range(9)), rule(verbs=["*"]), consumers=[]))
    assert v.reason == "Wildcard"
    assert "and 6 more" in v.message


def test_split_rules_keeps_namespaced_out_of_cluster_roles():
    rules = [
        rule(groups=["", "apps"], resources=["configmaps", "nodes", "deployments", "pods/log"], verbs=["get"]),
        {"nonResourceURLs": ["/version"], "verbs": ["get"]},
        rule(groups=["example.io"], resources=["widgets"], verbs=["list"], resourceNames=["a"]),
    ]
    split = caps.split_rules(rules, namespaced)
    # ("apps", "deployments") is namespaced and the rest of "apps" unknown: all of it stays in Roles.
    assert split["cluster"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"nonResourceURLs": ["/version"], "verbs": ["get"]},
    ]
    assert split["project"] == [
        {"apiGroups": [""], "resources": ["configmaps", "deployments", "pods/log"], "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["configmaps", "nodes", "deployments", "pods/log"], "verbs": ["get"]},
        {"apiGroups": ["example.io"], "resources": ["widgets"], "verbs": ["list"], "resourceNames": ["a"]},
    ]


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        ([rule()], {"project"}),
        ([rule(resources=["nodes"])], {"cluster"}),
        ([rule(resources=["namespaces"])], {"cluster"}),
        ([{"nonResourceURLs": ["/version"], "verbs": ["get"]}], {"cluster"}),
        ([rule(), rule(resources=["nodes"])], {"project", "cluster"}),
        ([rule(groups=["unknown.io"], resources=["things"])], {"project"}),  # unknown fails closed
        ([rule(resources=["pods/log"])], {"project"}),  # subresource takes its resource's scope
        ([], set()),
    ],
)
def test_scope(rules, expected):
    assert caps.scope(rules, namespaced) == expected


@settings(deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "apiGroups": st.lists(st.sampled_from(["", "apps", "storage.k8s.io", "x.io"]), min_size=1, max_size=3),
                "resources": st.lists(
                    st.sampled_from(["configmaps", "nodes", "pods", "deployments", "storageclasses", "things"]),
                    min_size=1,
                    max_size=4,
                ),
                "verbs": st.just(["get"]),
            }
        ),
        max_size=5,
    )
)
def test_split_never_puts_a_namespaced_resource_cluster_wide(rules):
    split = caps.split_rules(rules, namespaced)
    for r in split.get("cluster", []):
        for g in r.get("apiGroups", []):
            for res in r["resources"]:
                assert namespaced(g, res) is False
    pairs_in = {(g, res) for r in rules for g in r["apiGroups"] for res in r["resources"]}
    pairs_out = {(g, res) for rs in split.values() for r in rs for g in r["apiGroups"] for res in r["resources"]}
    assert pairs_in == pairs_out  # nothing lost, nothing added


def test_validated_capability():
    obj = {
        "metadata": {"name": "storage", "generation": 2},
        "spec": spec(rule(), rule(resources=["nodes"]), consumers=CONSUMERS + [{"namespace": "a", "name": "b"}]),
    }
    lc = caps.validated_capability(obj, namespaced)
    assert lc.name == "storage" and lc.version == "v1" and lc.accepted
    assert lc.scope == ("cluster", "project")
    assert lc.consumers == (("a", "b"), ("d8-mod", "controller"))
    assert lc.rules_for("cluster") == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    assert lc.rules_for("project")[0]["resources"] == ["configmaps"]
    assert lc.rules_for("other") == []
    hash(lc)  # frozen and hashable: usable in a registry snapshot


def test_refused_validated_capability_has_no_scope():
    lc = caps.validated_capability({"metadata": {"name": "x"}, "spec": spec(rule(verbs=["*"]))}, namespaced)
    assert not lc.accepted and lc.scope == () and lc.verdict.reason == "Wildcard"
