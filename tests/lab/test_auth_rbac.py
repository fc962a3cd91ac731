"""RBAC evaluation table: what each user may do with a given set of roles and bindings, and escalation checks."""

from __future__ import annotations

import pytest

from lab.apiserver.auth.bootstrap import bootstrap_objects
from lab.apiserver.auth.rbac import (
    Authorizer,
    aggregate_cluster_roles,
    breakdown_rule,
    forbidden,
    forbidden_message,
    rule_covers,
    uncovered_rules,
)
from lab.apiserver.auth.types import Attributes, UserInfo

RBAC = "rbac.authorization.k8s.io"
PEERING = "peering.deckhouse.io"


def _list_objects(objects: list[dict]):
    """The core's list_objects over a plain list: (group, plural, namespace or None) -> objects."""
    plurals = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings", "Role": "roles",
               "RoleBinding": "rolebindings", "ServiceAccount": "serviceaccounts"}

    def list_objects(group: str, plural: str, namespace: str | None):
        for obj in objects:
            obj_group = obj["apiVersion"].rpartition("/")[0]
            if obj_group != group or plurals[obj["kind"]] != plural:
                continue
            if namespace is None or obj["metadata"].get("namespace") == namespace:
                yield obj

    return list_objects


def role(name: str, rules: list[dict], namespace: str | None = None, labels: dict | None = None,
         aggregate: list[dict] | None = None) -> dict:
    meta = {"name": name, "labels": labels or {}}
    if namespace:
        meta["namespace"] = namespace
    obj = {"apiVersion": f"{RBAC}/v1", "kind": "Role" if namespace else "ClusterRole", "metadata": meta,
           "rules": rules}
    if aggregate is not None:
        obj["aggregationRule"] = {"clusterRoleSelectors": aggregate}
    return obj


def binding(name: str, role_kind: str, role_name: str, subjects: list[dict], namespace: str | None = None) -> dict:
    meta = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
            "metadata": meta, "roleRef": {"apiGroup": RBAC, "kind": role_kind, "name": role_name},
            "subjects": subjects}


def user(name: str) -> dict:
    return {"kind": "User", "apiGroup": RBAC, "name": name}


def group(name: str) -> dict:
    return {"kind": "Group", "apiGroup": RBAC, "name": name}


def sa(name: str, namespace: str | None = None) -> dict:
    out = {"kind": "ServiceAccount", "name": name}
    if namespace:
        out["namespace"] = namespace
    return out


def rule(verbs, groups=("",), resources=(), names=None, urls=None) -> dict:
    if urls is not None:
        return {"verbs": list(verbs), "nonResourceURLs": list(urls)}
    out = {"verbs": list(verbs), "apiGroups": list(groups), "resources": list(resources)}
    if names:
        out["resourceNames"] = list(names)
    return out


def res(verb, resource, group="", namespace="", name="", subresource="") -> Attributes:
    return Attributes(verb=verb, resource_request=True, api_group=group, resource=resource,
                      subresource=subresource, namespace=namespace, name=name)


def url(verb, path) -> Attributes:
    return Attributes(verb=verb, resource_request=False, path=path)


ALICE = UserInfo("alice", ("system:authenticated",))
BOB = UserInfo("bob", ("team-b", "system:authenticated"))
ROOT = UserInfo("root", ("system:masters", "system:authenticated"))
NOBODY = UserInfo("system:anonymous", ("system:unauthenticated",))
PEERING_SA = UserInfo("system:serviceaccount:d8-peering:peering",
                      ("system:serviceaccounts", "system:serviceaccounts:d8-peering", "system:authenticated"))
OTHER_SA = UserInfo("system:serviceaccount:other:peering",
                    ("system:serviceaccounts", "system:serviceaccounts:other", "system:authenticated"))
EXCHANGED = UserInfo("peering:0b6c:system:serviceaccount:d8-x:ctl", ("system:authenticated",))

POLICY = bootstrap_objects() + [
    # alice reads ClusterPeers cluster-wide but not their sensitive fields; she may see one by name in full.
    role("peers-reader", [rule(["get", "list", "watch"], [PEERING], ["clusterpeers"])]),
    role("one-peer-sensitive", [rule(["get"], [PEERING], ["clusterpeers/sensitive"], names=["cluster-b"])]),
    binding("alice-peers", "ClusterRole", "peers-reader", [user("alice")]),
    binding("alice-sensitive", "ClusterRole", "one-peer-sensitive", [user("alice")]),
    # bob's group may edit configmaps in ns-b only, through a RoleBinding to a ClusterRole.
    role("cm-editor", [rule(["get", "list", "create", "update", "patch", "delete"], [""], ["configmaps"])]),
    binding("team-b-cm", "ClusterRole", "cm-editor", [group("team-b")], namespace="ns-b"),
    # bob may read pods' status (only) in ns-b via a Role; and any resource's status via */status in ns-c.
    role("pod-status", [rule(["get"], [""], ["pods/status"])], namespace="ns-b"),
    binding("bob-pod-status", "Role", "pod-status", [user("bob")], namespace="ns-b"),
    role("all-status", [rule(["get"], ["*"], ["*/status"])], namespace="ns-c"),
    binding("bob-all-status", "Role", "all-status", [user("bob")], namespace="ns-c"),
    # The module's ServiceAccount, named with and without the subject namespace.
    role("peering", [rule(["*"], [PEERING], ["*"]), rule(["create"], [""], ["serviceaccounts/token"])]),
    binding("peering", "ClusterRole", "peering", [sa("peering", "d8-peering")]),
    role("lease", [rule(["get", "update"], ["coordination.k8s.io"], ["leases"], names=["peering-leader"])],
         namespace="d8-peering"),
    binding("lease", "Role", "lease", [sa("peering")], namespace="d8-peering"),
    # A Role bound from another namespace's RoleBinding does not exist there.
    binding("dangling", "Role", "pod-status", [user("alice")], namespace="ns-x"),
    # A grant to an exchanged peer identity, as the control loop writes them.
    role("cap-metrics", [rule(["get"], urls=["/metrics", "/logs/*"])]),
    binding("cap-metrics", "ClusterRole", "cap-metrics", [user(EXCHANGED.username)]),
    # Aggregation: a peering role shows up in the bootstrap "view" and "admin" roles through their labels.
    role("peering-view", [rule(["get", "list", "watch"], [PEERING], ["projectpeers"])],
         labels={"rbac.authorization.k8s.io/aggregate-to-view": "true"}),
    binding("bob-view", "ClusterRole", "view", [user("bob")], namespace="ns-v"),
    binding("alice-admin", "ClusterRole", "admin", [user("alice")], namespace="ns-a"),
]


@pytest.fixture(scope="module")
def authz() -> Authorizer:
    return Authorizer(_list_objects(POLICY))


TABLE = [
    # who, what, allowed
    (ROOT, res("delete", "clusterpeers", PEERING, name="x"), True),
    (ROOT, url("post", "/anything"), True),
    (ALICE, res("list", "clusterpeers", PEERING), True),
    (ALICE, res("watch", "clusterpeers", PEERING), True),
    (ALICE, res("get", "clusterpeers", PEERING, name="cluster-b", subresource="sensitive"), True),
    (ALICE, res("get", "clusterpeers", PEERING, name="cluster-c", subresource="sensitive"), False),
    (ALICE, res("list", "clusterpeers", PEERING, subresource="sensitive"), False),  # names never match a list
    (ALICE, res("get", "clusterpeers", PEERING, name="a", subresource="status"), False),
    (ALICE, res("delete", "clusterpeers", PEERING, name="a"), False),
    (ALICE, res("get", "clusterpeers", "other.io", name="a"), False),
    (ALICE, res("get", "pods", namespace="ns-x", subresource="status"), False),  # dangling Role grants nothing
    (BOB, res("create", "configmaps", namespace="ns-b"), True),
    (BOB, res("create", "configmaps", namespace="ns-c"), False),
    (BOB, res("list", "configmaps"), False),  # a RoleBinding never grants cluster-wide
    (BOB, res("get", "pods", namespace="ns-b", subresource="status", name="p"), True),
    (BOB, res("get", "pods", namespace="ns-b", name="p"), False),
    (BOB, res("get", "deployments", "apps", namespace="ns-c", subresource="status", name="d"), True),
    (BOB, res("get", "deployments", "apps", namespace="ns-c", subresource="scale", name="d"), False),
    (BOB, res("get", "deployments", "apps", namespace="ns-c", name="d"), False),
    (PEERING_SA, res("update", "clusterpeers", PEERING, name="a", subresource="status"), True),
    (PEERING_SA, res("get", "clusterpeers", PEERING, name="a", subresource="sensitive"), True),
    (PEERING_SA, res("create", "serviceaccounts", namespace="d8-x", name="s", subresource="token"), True),
    (PEERING_SA, res("create", "serviceaccounts", namespace="d8-x"), False),
    (PEERING_SA, res("update", "leases", "coordination.k8s.io", namespace="d8-peering", name="peering-leader"),
     True),
    (PEERING_SA, res("update", "leases", "coordination.k8s.io", namespace="d8-peering", name="other"), False),
    (PEERING_SA, res("create", "leases", "coordination.k8s.io", namespace="d8-peering"), False),
    (OTHER_SA, res("get", "clusterpeers", PEERING, name="a"), False),
    (OTHER_SA, res("get", "leases", "coordination.k8s.io", namespace="d8-peering", name="peering-leader"), False),
    (EXCHANGED, url("get", "/metrics"), True),
    (EXCHANGED, url("get", "/metrics/extra"), False),
    (EXCHANGED, url("get", "/logs/kube.log"), True),
    (EXCHANGED, url("get", "/logs"), False),
    (EXCHANGED, url("post", "/metrics"), False),
    (EXCHANGED, res("get", "metrics"), False),  # a nonResourceURL rule grants no resource
    # Bootstrap roles: discovery and self-reviews for everyone authenticated, health for everyone.
    (ALICE, url("get", "/apis"), True),
    (ALICE, url("get", "/apis/peering.deckhouse.io/v1alpha1"), True),
    (ALICE, url("get", "/openapi/v3"), True),
    (ALICE, url("get", "/metrics"), False),
    (ALICE, res("create", "selfsubjectaccessreviews", "authorization.k8s.io"), True),
    (ALICE, res("create", "selfsubjectrulesreviews", "authorization.k8s.io"), True),
    (ALICE, res("create", "selfsubjectreviews", "authentication.k8s.io"), True),
    (ALICE, res("create", "subjectaccessreviews", "authorization.k8s.io"), False),
    (ALICE, res("create", "tokenreviews", "authentication.k8s.io"), False),
    (NOBODY, url("get", "/healthz"), True),
    (NOBODY, url("get", "/version"), True),
    (NOBODY, url("get", "/apis"), False),
    (NOBODY, res("create", "selfsubjectreviews", "authentication.k8s.io"), False),
    (PEERING_SA, url("get", "/openid/v1/jwks"), True),
    (ALICE, url("get", "/openid/v1/jwks"), False),
    # Aggregation: view gets the peering role's rules through its label, and admin gets view's through edit.
    (BOB, res("list", "projectpeers", PEERING, namespace="ns-v"), True),
    (BOB, res("list", "pods", namespace="ns-v"), True),
    (BOB, res("list", "secrets", namespace="ns-v"), False),
    (BOB, res("create", "pods", namespace="ns-v"), False),
    (ALICE, res("list", "projectpeers", PEERING, namespace="ns-a"), True),
    (ALICE, res("create", "serviceaccounts", namespace="ns-a", name="s", subresource="token"), True),
    (ALICE, res("create", "rolebindings", RBAC, namespace="ns-a"), True),
    (ALICE, res("create", "rolebindings", RBAC, namespace="ns-b"), False),
    (ALICE, res("list", "projectpeers", PEERING), False),
]


@pytest.mark.parametrize("who,attrs,allowed", TABLE,
                         ids=[f"{w.username}-{a.verb}-{a.resource or a.path}-{a.subresource}-{a.namespace}-{ok}"
                              for w, a, ok in TABLE])
def test_rbac_table(authz, who, attrs, allowed):
    decision = authz.authorize(who, attrs)
    assert decision.allowed is allowed, decision.reason


def test_allow_reason_names_binding_role_and_subject(authz):
    assert authz.authorize(BOB, res("create", "configmaps", namespace="ns-b")).reason == (
        'RBAC: allowed by RoleBinding "team-b-cm/ns-b" of ClusterRole "cm-editor" to Group "team-b"')
    assert authz.authorize(ALICE, url("get", "/apis")).reason == (
        'RBAC: allowed by ClusterRoleBinding "system:discovery" of ClusterRole "system:discovery" '
        'to Group "system:authenticated"')


def test_deny_reason_names_missing_roles(authz):
    decision = authz.authorize(ALICE, res("get", "pods", namespace="ns-x", name="p"))
    assert not decision.allowed
    assert 'role.rbac.authorization.k8s.io "pod-status" not found' in decision.reason


def test_deleting_a_binding_revokes_at_once():
    objects = list(POLICY)
    authz = Authorizer(_list_objects(objects))
    attrs = res("list", "clusterpeers", PEERING)
    assert authz.authorize(ALICE, attrs).allowed
    objects[:] = [o for o in objects if o["metadata"]["name"] != "alice-peers"]
    assert not authz.authorize(ALICE, attrs).allowed


def test_aggregation_follows_label_selectors_and_survives_cycles():
    roles = [
        role("a", [rule(["get"], [""], ["pods"])], labels={"agg": "x", "tier": "1"}),
        role("b", [rule(["list"], [""], ["pods"])], labels={"agg": "y"}),
        role("c", [rule(["watch"], [""], ["pods"])], labels={"other": "z"}),
        role("union", [rule(["delete"], [""], ["pods"])], labels={"agg": "x"},
             aggregate=[{"matchExpressions": [{"key": "agg", "operator": "In", "values": ["x", "y"]}]}]),
        role("loop", [], labels={"agg": "y"}, aggregate=[{"matchLabels": {"agg": "x"}}]),
        role("nothing", [rule(["get"], [""], ["secrets"])],
             aggregate=[{"matchExpressions": [{"key": "agg", "operator": "Bogus"}]}]),
        role("nolabel", [], aggregate=[{"matchExpressions": [{"key": "agg", "operator": "DoesNotExist"}]}]),
    ]
    rules = aggregate_cluster_roles(roles)
    assert rules["a"] == [rule(["get"], [""], ["pods"])]
    # union's own rules are replaced by those it selects: a, b, and loop (which adds nothing new).
    assert rule(["delete"], [""], ["pods"]) not in rules["union"]
    assert rule(["get"], [""], ["pods"]) in rules["union"] and rule(["list"], [""], ["pods"]) in rules["union"]
    assert rule(["watch"], [""], ["pods"]) not in rules["union"]
    # loop selects a and union, and union selects b: aggregation is transitive, the cycle adds nothing twice.
    assert rules["loop"] == [rule(["get"], [""], ["pods"]), rule(["list"], [""], ["pods"])]
    assert rules["nothing"] == []
    # nolabel selects c and nothing; nothing is aggregated itself, so its stored rule counts for nothing.
    assert rules["nolabel"] == [rule(["watch"], [""], ["pods"])]


def test_bootstrap_objects_are_well_formed_and_view_has_no_secrets():
    objects = bootstrap_objects()
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for expected in ("cluster-admin", "admin", "edit", "view", "system:discovery", "system:basic-user",
                     "system:public-info-viewer"):
        assert ("ClusterRole", expected) in names
    for expected in ("cluster-admin", "system:discovery", "system:basic-user", "system:public-info-viewer"):
        assert ("ClusterRoleBinding", expected) in names
    for obj in objects:
        assert obj["apiVersion"] == "rbac.authorization.k8s.io/v1"
        assert obj["metadata"]["labels"]["kubernetes.io/bootstrapping"] == "rbac-defaults"
    view = next(o for o in objects if o["metadata"]["name"] == "view")
    assert all("secrets" not in r.get("resources", ()) for r in view["rules"])
    # Each call gives fresh objects: the core may add metadata to what it stores.
    objects[0]["metadata"]["name"] = "changed"
    assert bootstrap_objects()[0]["metadata"]["name"] == "cluster-admin"


def test_rules_for_lists_cluster_and_namespace_rules(authz):
    cluster_only, incomplete = authz.rules_for(BOB, "")
    assert rule(["get"], [""], ["pods/status"]) not in cluster_only and not incomplete
    in_ns, _ = authz.rules_for(BOB, "ns-b")
    assert rule(["get"], [""], ["pods/status"]) in in_ns
    assert any("configmaps" in r.get("resources", ()) for r in in_ns)
    assert any("/apis/*" in r.get("nonResourceURLs", ()) for r in in_ns)
    _, incomplete = authz.rules_for(ALICE, "ns-x")
    assert incomplete


# --- escalation --------------------------------------------------------------------------------------------------

def test_breakdown_and_cover():
    parts = breakdown_rule(rule(["get", "list"], ["", "apps"], ["pods"], names=["a"]))
    assert len(parts) == 4 and all(p["resourceNames"] == ["a"] for p in parts)
    assert breakdown_rule(rule(["get"], urls=["/a", "/b"])) == [rule(["get"], urls=["/a"]), rule(["get"], urls=["/b"])]
    # `*/status` covers pods/status but not pods; a named owner rule does not cover an unnamed grant.
    assert rule_covers(rule(["get"], [""], ["*/status"]), rule(["get"], [""], ["pods/status"]))
    assert not rule_covers(rule(["get"], [""], ["*/status"]), rule(["get"], [""], ["pods"]))
    assert not rule_covers(rule(["get"], [""], ["pods"], names=["a"]), rule(["get"], [""], ["pods"]))
    assert rule_covers(rule(["get"], [""], ["pods"]), rule(["get"], [""], ["pods"], names=["a"]))
    assert rule_covers(rule(["get"], urls=["/logs/*"]), rule(["get"], urls=["/logs/x"]))
    assert not rule_covers(rule(["get"], [""], ["*"]), rule(["get"], urls=["/logs"]))
    # Holding get does not cover the wildcard verb even though `*` includes get.
    assert uncovered_rules([rule(["get"], [""], ["pods"])], [rule(["*"], [""], ["pods"])]) == [
        rule(["*"], [""], ["pods"])]


def test_escalation_check_within_held_rules(authz):
    ok = authz.escalation_check(BOB, [rule(["get", "create"], [""], ["configmaps"])], namespace="ns-b")
    assert ok.allowed
    denied = authz.escalation_check(BOB, [rule(["get", "create"], [""], ["configmaps"])], namespace="ns-c")
    assert not denied.allowed
    assert 'user "bob"' in denied.reason and "configmaps" in denied.reason and "not currently held" in denied.reason
    # Cluster-wide, bob holds no configmap rule at all: a RoleBinding's rules stay in its namespace.
    assert not authz.escalation_check(BOB, [rule(["get"], [""], ["configmaps"])]).allowed
    assert authz.escalation_check(ROOT, [rule(["*"], ["*"], ["*"])]).allowed


def test_role_write_needs_held_rules_or_escalate():
    objects = POLICY + [
        role("escalator", [rule(["escalate"], [RBAC], ["roles"]), rule(["create"], [RBAC], ["roles"])],
             namespace="ns-e"),
        binding("bob-escalator", "Role", "escalator", [user("bob")], namespace="ns-e"),
    ]
    authz = Authorizer(_list_objects(objects))
    wants_secrets = role("r", [rule(["get"], [""], ["secrets"])], namespace="ns-b")
    assert not authz.check_role_write(BOB, wants_secrets).allowed
    assert authz.check_role_write(BOB, role("r", [rule(["get"], [""], ["configmaps"])], namespace="ns-b")).allowed
    assert authz.check_role_write(BOB, role("r", [rule(["get"], [""], ["secrets"])], namespace="ns-e")).allowed
    # An aggregated ClusterRole needs escalate, whatever its (empty) rules say.
    aggregated = role("agg", [], aggregate=[{"matchLabels": {"x": "y"}}])
    denied = authz.check_role_write(ALICE, aggregated)
    assert not denied.allowed and "aggregationRule" in denied.reason
    assert authz.check_role_write(ROOT, aggregated).allowed


def test_binding_write_needs_bind_or_the_role_rules():
    objects = POLICY + [
        role("binder", [rule(["bind"], [RBAC], ["clusterroles"], names=["edit"])], namespace="ns-b"),
        binding("bob-binder", "Role", "binder", [user("bob")], namespace="ns-b"),
    ]
    authz = Authorizer(_list_objects(objects))
    # bob holds cm-editor's rules in ns-b, so he may hand them out there but not elsewhere or cluster-wide.
    assert authz.check_binding_write(BOB, binding("x", "ClusterRole", "cm-editor", [user("carol")], "ns-b")).allowed
    assert not authz.check_binding_write(BOB, binding("x", "ClusterRole", "cm-editor", [user("carol")], "ns-c")).allowed
    assert not authz.check_binding_write(BOB, binding("x", "ClusterRole", "cm-editor", [user("carol")])).allowed
    # bind on edit lets him bind edit in ns-b though he does not hold its rules.
    assert authz.check_binding_write(BOB, binding("x", "ClusterRole", "edit", [user("carol")], "ns-b")).allowed
    assert not authz.check_binding_write(BOB, binding("x", "ClusterRole", "admin", [user("carol")], "ns-b")).allowed
    # Role references resolve in the binding's namespace; a missing role is named.
    assert authz.check_binding_write(BOB, binding("x", "Role", "pod-status", [user("carol")], "ns-b")).allowed
    missing = authz.check_binding_write(BOB, binding("x", "Role", "nope", [user("carol")], "ns-b"))
    assert not missing.allowed and '"nope" not found' in missing.reason
    bad = authz.check_binding_write(ROOT, binding("x", "Role", "pod-status", [user("carol")]))
    assert not bad.allowed and "ClusterRole" in bad.reason
    assert authz.check_binding_write(ROOT, binding("x", "ClusterRole", "cluster-admin", [user("carol")])).allowed


# --- messages ----------------------------------------------------------------------------------------------------

def test_forbidden_messages_match_kube_apiserver():
    assert forbidden_message(ALICE, res("list", "pods", namespace="ns")) == (
        'User "alice" cannot list resource "pods" in API group "" in the namespace "ns"')
    assert forbidden_message(ALICE, res("get", "clusterpeers", PEERING, name="a", subresource="sensitive")) == (
        'User "alice" cannot get resource "clusterpeers/sensitive" in API group "peering.deckhouse.io" '
        'at the cluster scope')
    assert forbidden_message(ALICE, url("get", "/metrics")) == 'User "alice" cannot get path "/metrics"'
    err = forbidden(ALICE, res("get", "clusterpeers", PEERING, name="a"))
    assert err.code == 403 and err.reason == "Forbidden"
    assert err.message.startswith('clusterpeers.peering.deckhouse.io "a" is forbidden: User "alice" cannot get')
    assert err.status()["details"] == {"group": PEERING, "kind": "clusterpeers", "name": "a"}
    assert forbidden(ALICE, res("list", "pods")).message.startswith("pods is forbidden: ")
    assert forbidden(ALICE, url("get", "/metrics")).message == 'forbidden: User "alice" cannot get path "/metrics"'


def test_cached_cluster_roles_follow_every_change():
    """Stored objects carry resourceVersions, which let the authorizer reuse its ClusterRole index safely."""
    objects = [dict(o) for o in POLICY]
    for i, obj in enumerate(objects):
        obj["metadata"] = dict(obj["metadata"], uid=f"uid-{i}", resourceVersion=str(i + 1))
    authz = Authorizer(_list_objects(objects))
    attrs = res("list", "clusterpeers", PEERING)
    assert authz.authorize(ALICE, attrs).allowed
    reader = next(o for o in objects if o["metadata"]["name"] == "peers-reader")
    # An update (new resourceVersion) that drops the rule revokes at once.
    updated = dict(reader, rules=[], metadata=dict(reader["metadata"], resourceVersion="1000"))
    objects[objects.index(reader)] = updated
    assert not authz.authorize(ALICE, attrs).allowed
    # Re-created under the same name with a new uid and the rule back: granted again.
    objects[objects.index(updated)] = dict(reader, metadata=dict(reader["metadata"], uid="new", resourceVersion="1001"))
    assert authz.authorize(ALICE, attrs).allowed
    # A new ClusterRole labelled for aggregation reaches the aggregated role it is selected by.
    bob_ns = res("list", "widgets", "example.io", namespace="ns-v")
    assert not authz.authorize(BOB, bob_ns).allowed
    objects.append(role("widgets-view", [rule(["list"], ["example.io"], ["widgets"])],
                        labels={"rbac.authorization.k8s.io/aggregate-to-view": "true"}))
    objects[-1]["metadata"].update(uid="w", resourceVersion="1002")
    assert authz.authorize(BOB, bob_ns).allowed
