"""RBAC of the module in Deckhouse's layout: the process (rbac-for-us.yaml, d8:peering:*) gets exactly the calls it
makes, with no wildcard anywhere; the roles for people (user-authz d8:user-authz:peering:<level> and RBACv2) nest
user < cluster-editor < cluster-admin, only the admin-level roles read the connection strings
(get/list/watch on clusterpeers/sensitive, the verbs the masking checks), and no role has clusterpeers/status."""

from __future__ import annotations

import helm_python as helm
import pytest
import yaml

from chart_paths import CHART_DIR
from module_values import BASE_MODULES, OPTIONAL, objects as render_objects, values

SA = ("d8-peering", "peering")
CLUSTER = "*"
PEERING = "peering.deckhouse.io"
RBAC = "rbac.authorization.k8s.io"
READ = ("get", "list", "watch")
ALL = (*READ, "create", "update", "patch", "delete")
COORDINATION = "coordination.k8s.io"


def grants(scope: str, groups, resources, verbs, names=(None,)) -> set[tuple]:
    return {(scope, g, r, v, n) for g in groups for r in resources for v in verbs for n in names}


# What every role for people reads besides the module's objects: the module's Lease, which `peering check` judges
# the leader by, and nothing else of coordination.k8s.io.
LEASE = grants(CLUSTER, [COORDINATION], ["leases"], ("get",), ("peering",))


# What the process calls, as the issue lists it: every (where, group, resource, verb, resourceName).
PROCESS = (
    grants(CLUSTER, [PEERING], ["clusterpeers"], (*READ, "update", "patch"))
    | grants(CLUSTER, [PEERING], ["clusterpeers/sensitive"], (*READ, "update", "patch"))
    | grants(CLUSTER, [PEERING], ["clusterpeers/status", "peeringcapabilities/status", "projectpeers/status"],
             ("get", "update", "patch"))
    | grants(CLUSTER, [PEERING], ["peeringcapabilities"], READ)
    | grants(CLUSTER, [PEERING], ["projectpeers"], ALL)
    | grants(CLUSTER, [RBAC], ["roles", "rolebindings", "clusterroles", "clusterrolebindings"], ALL)
    | grants(CLUSTER, [RBAC], ["roles", "clusterroles"], ("escalate", "bind"))
    | grants(CLUSTER, ["deckhouse.io"], ["projects"], READ)
    | grants(CLUSTER, [""], ["namespaces"], READ)
    | grants(CLUSTER, ["deckhouse.io"], ["tokenexchangeproviders"], ALL)
    | grants(CLUSTER, ["authentication.k8s.io"], ["tokenreviews"], ("create",))
    | grants(CLUSTER, ["", "events.k8s.io"], ["events"], ("create", "patch"))
    | {(CLUSTER, "nonResourceURL", url, "get", None) for url in ("/.well-known/openid-configuration",
                                                                   "/openid/v1/jwks")}
    | grants("d8-peering", [""], ["secrets"], ALL)
    | grants("d8-peering", ["coordination.k8s.io"], ["leases"], ALL)
    | grants("kube-system", [""], ["configmaps"], ("get",), ("d8-cluster-uuid",))
)


# Deckhouse's common ClusterRole for kube-rbac-proxy, which the module binds and does not render.
EXTERNAL_ROLES = {("ClusterRole", "d8:rbac-proxy", None): [
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
]}
RBAC_PROXY = (grants(CLUSTER, ["authentication.k8s.io"], ["tokenreviews"], ("create",))
              | grants(CLUSTER, ["authorization.k8s.io"], ["subjectaccessreviews"], ("create",)))


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    with helm.Chart.load(CHART_DIR) as chart:
        return render_objects(chart, values(enabled_modules=BASE_MODULES + OPTIONAL))


def roles(objects: list[dict]) -> dict[tuple[str, str, str | None], list[dict]]:
    return {
        (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")): o.get("rules", [])
        for o in objects if o["kind"] in ("Role", "ClusterRole")
    }


def expand(rules: list[dict], scope: str) -> set[tuple]:
    out: set[tuple] = set()
    for rule in rules:
        if "nonResourceURLs" in rule:
            out |= {(scope, "nonResourceURL", u, v, None) for u in rule["nonResourceURLs"] for v in rule["verbs"]}
        else:
            out |= grants(scope, rule["apiGroups"], rule["resources"], rule["verbs"],
                          rule.get("resourceNames") or (None,))
    return out


def granted_to(objects: list[dict], subject: tuple[str, str]) -> set[tuple]:
    """Everything the bindings of the chart give the ServiceAccount `subject` (namespace, name)."""
    by_ref = {**EXTERNAL_ROLES, **roles(objects)}
    out: set[tuple] = set()
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and (s["namespace"], s["name"]) == subject
                   for s in binding["subjects"]):
            continue
        namespace = binding["metadata"].get("namespace")
        ref = binding["roleRef"]
        role_namespace = namespace if ref["kind"] == "Role" else None
        rules = by_ref[(ref["kind"], ref["name"], role_namespace)]
        out |= expand(rules, namespace or CLUSTER)
    return out


def test_no_rule_has_a_wildcard(objects) -> None:
    for key, rules in roles(objects).items():
        for rule in rules:
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert not any("*" in item for item in rule.get(field, [])), (key, rule)


def test_the_process_gets_exactly_what_it_calls(objects) -> None:
    got = granted_to(objects, SA)
    assert got - PROCESS - RBAC_PROXY == set(), "granted but not needed"
    assert PROCESS - got == set(), "needed but not granted"


def test_escalate_and_bind_only_on_roles_and_clusterroles(objects) -> None:
    risky = {(g, r) for (_, g, r, v, _) in granted_to(objects, SA) if v in ("escalate", "bind", "impersonate")}
    assert risky == {(RBAC, "roles"), (RBAC, "clusterroles")}


def test_the_cluster_uuid_is_the_only_thing_read_in_kube_system(objects) -> None:
    assert {t for t in granted_to(objects, SA) if t[0] == "kube-system"} == {
        ("kube-system", "", "configmaps", "get", "d8-cluster-uuid")
    }


def test_the_expansion_sees_a_missing_permission(objects) -> None:
    """The comparison above must notice a dropped rule: remove the lease rule and it is gone from the grant."""
    trimmed = [
        {**o, "rules": [r for r in o["rules"] if "leases" not in r.get("resources", [])]} if o["kind"] == "Role"
        else o
        for o in objects
    ]
    assert PROCESS - granted_to(trimmed, SA) == grants("d8-peering", ["coordination.k8s.io"], ["leases"], ALL)


def cluster_role(objects: list[dict], name: str) -> set[tuple]:
    return expand(roles(objects)[("ClusterRole", name, None)], CLUSTER)


def test_the_process_rbac_is_in_rbac_for_us_with_deckhouse_names() -> None:
    text = (CHART_DIR / "templates" / "rbac-for-us.yaml").read_text()
    assert "kind: ServiceAccount" in text
    assert "d8:peering:controller" in text


def test_user_roles_nest_and_only_admin_sees_connection_strings(objects) -> None:
    user, editor, admin = (cluster_role(objects, f"d8:user-authz:peering:{n}")
                           for n in ("user", "cluster-editor", "cluster-admin"))
    assert user < editor < admin
    for role in (user, editor, admin):
        assert {g for (_, g, _, _, _) in role} == {PEERING, COORDINATION}
        assert {t for t in role if t[1] == COORDINATION} == LEASE
    # Only the verbs the masking checks: writes are never gated by clusterpeers/sensitive.
    assert {t for t in admin if t[2] == "clusterpeers/sensitive"} == grants(
        CLUSTER, [PEERING], ["clusterpeers/sensitive"], READ)
    assert not {t for t in editor | user if t[2].endswith("/sensitive")}
    assert user == grants(CLUSTER, [PEERING], ["clusterpeers", "peeringcapabilities", "projectpeers"], READ) | LEASE
    assert editor - user == grants(CLUSTER, [PEERING], ["clusterpeers"], ("create", "update", "patch", "delete"))
    # ProjectPeers are the module's to write; nobody edits them by hand.
    assert not {t for t in admin if t[2] == "projectpeers" and t[3] not in READ}


def test_user_authz_roles_carry_their_access_level() -> None:
    with helm.Chart.load(CHART_DIR) as chart:
        objs = render_objects(chart, values())
    levels = {o["metadata"]["name"]: o["metadata"]["annotations"]["user-authz.deckhouse.io/access-level"]
              for o in objs if o["metadata"]["name"].startswith("d8:user-authz:")}
    assert levels == {"d8:user-authz:peering:user": "User", "d8:user-authz:peering:cluster-editor": "ClusterEditor",
                      "d8:user-authz:peering:cluster-admin": "ClusterAdmin"}


def test_rbacv2_roles_are_capabilities_of_the_current_scheme(objects) -> None:
    """Deckhouse 1.78's capability scheme: d8:system-capability:peering:{view,edit} aggregated into the networking
    subsystem's viewer and manager, d8:namespace-capability:peering:view into the namespace viewer, each labelled
    kind: capability with its scope and capability name, and titled and described in English and Russian. The
    retired experimental scheme (kind manage/use, level, aggregate-to-kubernetes-as) is gone."""
    by_name = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
    expected = {
        "d8:system-capability:peering:view": ("system", "system-capability.peering.view",
                                              "rbac.deckhouse.io/aggregate-to-networking-as", "viewer"),
        "d8:system-capability:peering:edit": ("system", "system-capability.peering.edit",
                                              "rbac.deckhouse.io/aggregate-to-networking-as", "manager"),
        "d8:namespace-capability:peering:view": ("namespace", "namespace-capability.peering.view",
                                                 "rbac.deckhouse.io/aggregate-to-namespace-as", "viewer"),
    }
    for name, (scope, capability, aggregate, level) in expected.items():
        role = by_name[name]
        labels = role["metadata"]["labels"]
        assert labels["rbac.deckhouse.io/kind"] == "capability", name
        assert labels["rbac.deckhouse.io/scope"] == scope, name
        assert labels["rbac.deckhouse.io/capability"] == capability, name
        assert labels[aggregate] == level, name
        assert (labels["heritage"], labels["module"]) == ("deckhouse", "peering"), name
        assert not {k for k in labels if k in ("rbac.deckhouse.io/level", "rbac.deckhouse.io/aggregate-to-kubernetes-as")}
        annotations = role["metadata"]["annotations"]
        for lang in ("en", "ru"):
            assert annotations[f"{lang}.meta.deckhouse.io/title"].startswith(("Module peering", "Модуль peering"))
            assert annotations[f"{lang}.meta.deckhouse.io/description"], (name, lang)
    assert by_name["d8:system-capability:peering:view"]["metadata"]["labels"]["rbac.deckhouse.io/namespace"] == (
        "d8-peering")
    assert not [n for n in by_name if n.startswith(("d8:manage:", "d8:use:"))]
    view, edit = (expand(by_name[f"d8:system-capability:peering:{a}"]["rules"], CLUSTER) for a in ("view", "edit"))
    namespaced = expand(by_name["d8:namespace-capability:peering:view"]["rules"], CLUSTER)
    assert namespaced == grants(CLUSTER, [PEERING], ["projectpeers"], READ)
    assert view < edit
    # `peering check` reads the Lease for the leader: what a viewer may run, it may read.
    assert {t for t in view if t[1] == COORDINATION} == {t for t in edit if t[1] == COORDINATION} == LEASE
    assert {t for t in edit if t[2] == "clusterpeers/sensitive"} == grants(
        CLUSTER, [PEERING], ["clusterpeers/sensitive"], READ)
    assert not {t for t in view if t[2].endswith("/sensitive")}


def test_module_yaml_asks_for_the_deckhouse_release_of_the_capability_scheme() -> None:
    module = yaml.safe_load((CHART_DIR / "module.yaml").read_text())
    floor = module["requirements"]["deckhouse"]
    assert floor.startswith(">= ")
    assert tuple(int(x) for x in floor[3:].split(".")) >= (1, 78)


def test_no_role_for_people_has_the_status_subresource(objects) -> None:
    """Deckhouse's masking does not cover clusterpeers/status: its GET shows the invitation in clear."""
    for key, rules in roles(objects).items():
        if key[1].startswith(("d8:user-authz:", "d8:system-capability:", "d8:namespace-capability:")):
            assert not {t for t in expand(rules, CLUSTER) if t[2].endswith("/status")}, key
