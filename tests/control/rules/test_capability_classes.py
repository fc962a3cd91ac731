"""The capability policy decides by class: the rules a list of refusals let through are refused by the class of
what they name, a subresource or a kind that appears later in a classified group is judged by its resource's or
its group's class, a cluster-scoped write is refused whatever the class, and a kind no table knows is allowed in
namespaces only."""

from __future__ import annotations

import pytest

from contract import served
from control.rules import capabilities as caps
from control.rules import capability_classes as classes
from control.rules import capability_policy as policy

CONSUMERS = [{"kind": "ServiceAccount", "namespace": "d8-mod", "name": "controller"}]
READS = ["get", "list", "watch"]
BENIGN = {"apiGroups": [""], "resources": ["configmaps"], "verbs": READS}


def verdict(*rules, namespaced=None):
    return caps.validate({"version": "v1", "rules": [BENIGN, *rules], "consumers": CONSUMERS}, namespaced)


def rule(group: str, resource: str, verbs) -> dict:
    return {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}


def refused(v, cls: str, *words):
    assert (v.status, v.reason) == ("False", "PrivilegeEscalation"), v.message
    assert "rule 2 " in v.message and f"(class {cls})" in v.message, v.message
    assert classes.CLASSES[cls].why in v.message or any(r.why in v.message for r in policy.POLICY)
    for word in words:
        assert word in v.message, (word, v.message)


# Each was Accepted by the list of refusals this policy replaced; each is the mechanism of a refused row.
ATTACKS = [
    ("deckhouse.io", "dexclients", ["create"], "credentials"),
    ("deckhouse.io", "dexclients/allow-access-to-kubernetes", ["create"], "credentials"),
    ("networking.k8s.io", "ingresses", ["create"], "routing"),
    ("networking.k8s.io", "ingresses/status", ["update"], "routing"),
    ("cert-manager.io", "certificates", ["create"], "credentials"),
    ("cert-manager.io", "certificaterequests", ["create"], "credentials"),
    ("cert-manager.io", "issuers", ["create"], "credentials"),
    ("cert-manager.io", "clusterissuers", ["create"], "credentials"),
    ("snapshot.storage.k8s.io", "volumesnapshotcontents", ["create"], "storage"),
    ("deckhouse.io", "modulereleases", ["patch"], "releases"),
    ("deckhouse.io", "deckhousereleases", ["patch"], "releases"),
    ("deckhouse.io", "ingressnginxcontrollers", ["create"], "routing"),
    ("mutations.gatekeeper.sh", "assign", ["create"], "admission"),
    ("mutations.gatekeeper.sh", "assignmetadata", ["create"], "admission"),
    ("mutations.gatekeeper.sh", "modifyset", ["create"], "admission"),
    ("templates.gatekeeper.sh", "constrainttemplates", ["create"], "admission"),
    ("constraints.gatekeeper.sh", "k8sallowedrepos", ["delete"], "admission"),
    ("deckhouse.io", "instances", ["delete"], "machines"),
    # found by classifying every served resource
    ("", "pods/status", ["patch"], "routing"),
    ("", "resourcequotas", ["update"], "tenancy"),
    ("", "limitranges", ["delete"], "tenancy"),
    ("networking.k8s.io", "networkpolicies", ["create"], "routing"),
    ("networking.k8s.io", "ingressclasses", ["create"], "routing"),
    ("gateway.networking.k8s.io", "httproutes", ["create"], "routing"),
    ("networking.istio.io", "virtualservices", ["create"], "routing"),
    ("cilium.io", "ciliumnetworkpolicies", ["create"], "routing"),
    ("monitoring.coreos.com", "servicemonitors", ["create"], "observability"),
    ("deckhouse.io", "nodestaticpodrequests", ["create"], "machines"),
    ("deckhouse.io", "projectrolebindings", ["create"], "identity"),
    ("deckhouse.io", "projectnamespaces", ["create"], "tenancy"),
    ("infrastructure.cluster.x-k8s.io", "staticinstancecredentials", ["get"], "credentials"),
    ("storage.k8s.io", "volumeattributesclasses", ["create"], "storage"),
    ("resource.k8s.io", "deviceclasses", ["create"], "scheduling"),
    ("storagemigration.k8s.io", "storageversionmigrations", ["create"], "api-server"),
]


@pytest.mark.parametrize(("group", "resource", "verbs", "cls"), ATTACKS,
                         ids=[f"{g or 'core'}/{r}:{v[0]}" for g, r, v, _ in ATTACKS])
def test_a_rule_the_list_of_refusals_accepted_is_refused_by_its_class(group, resource, verbs, cls):
    refused(verdict(rule(group, resource, verbs)), cls, resource)


@pytest.mark.parametrize(("group", "resource"), [
    ("cert-manager.io", "clusterissuers2"), ("mutations.gatekeeper.sh", "assignsomething"),
    ("constraints.gatekeeper.sh", "anyconstraintkind"), ("gateway.networking.x-k8s.io", "xlistenersets"),
])
def test_a_kind_that_appears_later_in_a_classified_group_has_its_group_s_class(group, resource):
    assert not served.known(group, resource)
    cls, row = policy.class_of(group, resource)
    assert row is None and cls is classes.CLASSIFIED[group][None]
    assert not verdict(rule(group, resource, ["create"])).accepted


def test_a_subresource_takes_its_resource_s_class_and_an_entry_of_its_own_wins():
    assert policy.class_of("networking.k8s.io", "ingresses/status")[0].name == "routing"
    assert policy.class_of("", "pods/log")[0].name == "workloads"
    pod_status = next(row for row in policy.POLICY if row.resource == "pods/status")
    assert policy.class_of("", "pods/status") == (classes.CLASSES["routing"], pod_status)
    assert policy.class_of("snapshot.storage.k8s.io", "volumesnapshots")[0].name == "workloads"
    assert policy.class_of("snapshot.storage.k8s.io", "volumesnapshots/status")[0].name == "storage"
    assert verdict(rule("", "pods/log", ["get"]), rule("snapshot.storage.k8s.io", "volumesnapshots", ["create"]),
                   rule("apps", "deployments/scale", ["patch"])).accepted


def test_a_class_refuses_reads_only_when_it_refuses_every_verb():
    refused(verdict(rule("cert-manager.io", "certificates", ["get"])), "credentials", "names certificates")
    assert verdict(rule("networking.k8s.io", "ingresses", READS), rule("deckhouse.io", "instances", READS)).accepted


def test_one_refusal_per_class_names_every_resource_of_the_rule_it_hits():
    v = verdict({"apiGroups": ["networking.k8s.io"], "resources": ["ingresses", "ingresses/status", "networkpolicies"],
                 "verbs": ["patch"]})
    refused(v, "routing", "writes ingresses.networking.k8s.io, ingresses/status.networking.k8s.io, "
                          "networkpolicies.networking.k8s.io (class routing)")
    assert v.message.count("(class routing)") == 1


def test_a_row_of_its_own_is_in_a_class_and_never_weaker_than_it():
    for row in policy.POLICY:
        cls = classes.CLASSES[row.cls]
        assert cls.name not in ("unknown", "cluster-wide", "workloads", "cluster-state"), row
        assert cls.refuses != classes.NONE and (cls.refuses == classes.WRITES or row.verbs == policy.ALL), row


def test_an_unknown_kind_is_allowed_in_namespaces_and_its_cluster_scoped_writes_are_refused():
    mine = rule("example.mymodule.io", "widgets", ["create", "patch"])
    assert verdict(mine).accepted  # no discovery: it goes into Roles, where it reaches the paired namespaces
    assert verdict(mine, namespaced=lambda g, r: True).accepted
    refused(verdict(mine, namespaced=lambda g, r: False), "cluster-wide", "widgets.example.mymodule.io",
            "make your kind namespaced")
    assert verdict(rule("example.mymodule.io", "widgets", READS), namespaced=lambda g, r: False).accepted


def test_a_known_cluster_scoped_kind_of_an_allowed_class_has_its_writes_refused():
    assert policy.class_of("", "componentstatuses")[0].refuses == classes.NONE
    assert verdict(rule("", "componentstatuses", READS)).accepted
    refused(verdict(rule("", "componentstatuses", ["update"])), "cluster-wide")


def test_a_capability_granted_with_discovery_is_not_accepted_for_a_cluster_scoped_write_of_an_unknown_kind():
    obj = {"metadata": {"name": "widgets"},
           "spec": {"version": "v1", "consumers": CONSUMERS,
                    "rules": [rule("example.mymodule.io", "widgets", ["create"])]}}
    granted = caps.validated_capability(obj, lambda g, r: False)
    assert not granted.accepted and granted.verdict.reason == "PrivilegeEscalation" and granted.scope == ()
    assert caps.validated_capability(obj, lambda g, r: True).scope == ("project",)


@pytest.mark.parametrize(("table", "error"), [
    ('"" pods', "is not `group resource|* class`"),
    ('"" pods nosuchclass', "is not `group resource|* class`"),
    ('"" pods unknown', "is not `group resource|* class`"),
    ('"" pods workloads\n"" pods routing', '"" pods is listed twice'),
])
def test_the_class_table_refuses_a_line_it_cannot_read_naming_it(table, error):
    with pytest.raises(ValueError, match="CLASSIFIED_TABLE line") as e:
        classes._parse(table)
    assert error in str(e.value)


def test_peering_capability_policy_prints_the_verdict_on_every_served_resource(capsys):
    from control import cli

    assert cli.main(["capability-policy", "--resources"]) == 0
    out = capsys.readouterr().out
    assert out == policy.resources_table()
    assert len(out.splitlines()) == len(served.ALL) + 2
    assert ("| `networking.k8s.io` | `ingresses` | Namespaced | `routing` | allowed | refused (routing) | "
            "kube-apiserver v1.37.2 |") in out


def test_a_clusterpeer_says_why_a_capability_granted_with_discovery_is_not_effective():
    from control.rules.effective import effective_capabilities

    obj = {"metadata": {"name": "widgets"},
           "spec": {"version": "v1", "consumers": CONSUMERS,
                    "rules": [rule("example.mymodule.io", "widgets", ["create"])]}}
    local = {"widgets": caps.validated_capability(obj, lambda g, r: False)}
    result = effective_capabilities(["widgets"], [{"name": "widgets", "version": "v1", "scope": ["cluster"]}], local)
    assert result.names == []
    assert "PrivilegeEscalation" in result.summary() and "(class cluster-wide)" in result.summary()


@pytest.mark.parametrize(("module", "table", "error"), [
    ("served_kubernetes", '"" pods Somewhere', "is not `group resource Namespaced|Cluster [all-apis]`"),
    ("served_kubernetes", '"" pods Cluster extra', "is not `group resource Namespaced|Cluster [all-apis]`"),
    ("served_deckhouse", "deckhouse.io things Cluster - things.yaml", "below a `[folder]` line"),
    ("served_deckhouse", "[crds]\ndeckhouse.io things Global - things.yaml", "Namespaced|Cluster|-"),
])
def test_a_served_table_refuses_a_line_it_cannot_read_naming_it(monkeypatch, module, table, error):
    monkeypatch.setattr(getattr(served, module), "TABLE", table)
    with pytest.raises(ValueError, match=f"{module}.TABLE line") as e:
        served._kubernetes() if module == "served_kubernetes" else served._deckhouse()
    assert error in str(e.value)


def test_the_deckhouse_table_expands_subresources_and_keeps_where_each_row_comes_from():
    rows = {(s.group, s.resource): s for s in served.DECKHOUSE}
    assert rows[("deckhouse.io", "nodegroups/status")].scope == served.CLUSTER
    assert rows[("deckhouse.io", "nodegroups")].source == (
        "deckhouse/deckhouse@30543731e7df modules/040-node-manager/crds/node_group.yaml")
    assert rows[("deckhouse.io", "projectrolebindings")].source.endswith("projectrolebindings.yaml@4acb58ac2b39")
    assert rows[("peering.deckhouse.io", "clusterpeers")].source == "charts/peering/crds/clusterpeer.yaml"
    assert served.scope("deckhouse.io", "projectrolebindings/status") == served.NAMESPACED
    assert served.scope("example.io", "things") is None and not served.known("example.io", "things")
