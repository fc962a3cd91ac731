"""The RBAC objects kube-apiserver bootstraps (its default ClusterRoles and bindings), as far as the module and
the lab's clients meet them."""

from __future__ import annotations

import copy

from lab.apiserver.auth.rbac import (ALL, AUTHENTICATED, MASTERS, RBAC_GROUP, READ, SERVICEACCOUNTS, UNAUTHENTICATED,
                                     WRITE, aggregate_cluster_roles, object_name)


# --- bootstrap policy ----------------------------------------------------------------------------------------

_BOOTSTRAP_META = {
    "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
    "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
}


def _rule(verbs: list[str], groups: list[str] | None = None, resources: list[str] | None = None,
          urls: list[str] | None = None) -> dict:
    if urls is not None:
        return {"verbs": list(verbs), "nonResourceURLs": list(urls)}
    return {"verbs": list(verbs), "apiGroups": list(groups or [""]), "resources": list(resources or [])}


def _cluster_role(name: str, rules: list[dict], labels: dict | None = None, aggregate_to: str | None = None) -> dict:
    meta = copy.deepcopy(_BOOTSTRAP_META)
    meta["name"] = name
    meta["labels"].update(labels or {})
    role = {"apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRole", "metadata": meta, "rules": rules}
    if aggregate_to:
        role["aggregationRule"] = {"clusterRoleSelectors": [
            {"matchLabels": {f"rbac.authorization.k8s.io/aggregate-to-{aggregate_to}": "true"}}]}
    return role


def _cluster_role_binding(name: str, role: str, groups: list[str]) -> dict:
    meta = copy.deepcopy(_BOOTSTRAP_META)
    meta["name"] = name
    return {
        "apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRoleBinding", "metadata": meta,
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": g} for g in groups],
    }


def _aggregate_label(to: str) -> dict:
    return {f"rbac.authorization.k8s.io/aggregate-to-{to}": "true"}


_HEALTH_URLS = ["/healthz", "/livez", "/readyz", "/version", "/version/"]


def bootstrap_objects() -> list[dict]:
    """Kubernetes' default ClusterRoles and ClusterRoleBindings that every cluster has from its first start.

    The core stores these at start, so kubectl sees them and the authorizer finds them like any other object.
    The aggregated roles (admin, edit, view) come with their rules filled as the aggregation controller would.
    """
    view = [
        _rule(READ, [""], ["pods", "replicationcontrollers", "replicationcontrollers/scale", "serviceaccounts",
                            "services", "services/status", "endpoints", "persistentvolumeclaims",
                            "persistentvolumeclaims/status", "configmaps"]),
        _rule(READ, [""], ["limitranges", "resourcequotas", "bindings", "events", "pods/status",
                            "resourcequotas/status", "namespaces/status", "replicationcontrollers/status",
                            "pods/log"]),
        _rule(READ, [""], ["namespaces"]),
        _rule(READ, ["discovery.k8s.io"], ["endpointslices"]),
        _rule(READ, ["apps"], ["controllerrevisions", "statefulsets", "statefulsets/scale", "statefulsets/status",
                                "daemonsets", "daemonsets/status", "deployments", "deployments/scale",
                                "deployments/status", "replicasets", "replicasets/scale", "replicasets/status"]),
        _rule(READ, ["autoscaling"], ["horizontalpodautoscalers", "horizontalpodautoscalers/status"]),
        _rule(READ, ["batch"], ["cronjobs", "cronjobs/status", "jobs", "jobs/status"]),
        _rule(READ, ["policy"], ["poddisruptionbudgets", "poddisruptionbudgets/status"]),
        _rule(READ, ["networking.k8s.io"], ["ingresses", "ingresses/status", "networkpolicies"]),
    ]
    edit = [
        _rule(READ, [""], ["pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets",
                            "services/proxy"]),
        _rule(["impersonate"], [""], ["serviceaccounts"]),
        _rule(WRITE, [""], ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"]),
        _rule(["create"], [""], ["pods/eviction"]),
        _rule(WRITE, [""], ["configmaps", "events", "persistentvolumeclaims", "replicationcontrollers",
                             "replicationcontrollers/scale", "secrets", "serviceaccounts", "services",
                             "services/proxy"]),
        _rule(["create"], [""], ["serviceaccounts/token"]),
        _rule(WRITE, ["apps"], ["daemonsets", "deployments", "deployments/rollback", "deployments/scale",
                                 "replicasets", "replicasets/scale", "statefulsets", "statefulsets/scale"]),
        _rule(WRITE, ["autoscaling"], ["horizontalpodautoscalers"]),
        _rule(WRITE, ["batch"], ["cronjobs", "jobs"]),
        _rule(WRITE, ["policy"], ["poddisruptionbudgets"]),
        _rule(WRITE, ["networking.k8s.io"], ["ingresses", "networkpolicies"]),
        _rule(READ + WRITE, ["coordination.k8s.io"], ["leases"]),
    ]
    admin = [
        _rule(READ + WRITE, [RBAC_GROUP], ["rolebindings", "roles"]),
        _rule(["create"], ["authorization.k8s.io"], ["localsubjectaccessreviews"]),
    ]
    roles = [
        _cluster_role("cluster-admin", [_rule([ALL], [ALL], [ALL]), _rule([ALL], urls=[ALL])]),
        _cluster_role("admin", [], aggregate_to="admin"),
        _cluster_role("edit", [], labels=_aggregate_label("admin"), aggregate_to="edit"),
        _cluster_role("view", [], labels=_aggregate_label("edit"), aggregate_to="view"),
        _cluster_role("system:aggregate-to-admin", admin, labels=_aggregate_label("admin")),
        _cluster_role("system:aggregate-to-edit", edit, labels=_aggregate_label("edit")),
        _cluster_role("system:aggregate-to-view", view, labels=_aggregate_label("view")),
        _cluster_role("system:discovery", [_rule(["get"], urls=["/api", "/api/*", "/apis", "/apis/*", "/healthz",
                                                                "/livez", "/openapi", "/openapi/*", "/readyz",
                                                                "/version", "/version/"])]),
        _cluster_role("system:basic-user", [
            _rule(["create"], ["authorization.k8s.io"], ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]),
            _rule(["create"], ["authentication.k8s.io"], ["selfsubjectreviews"]),
        ]),
        _cluster_role("system:public-info-viewer", [_rule(["get"], urls=_HEALTH_URLS)]),
        _cluster_role("system:service-account-issuer-discovery", [
            _rule(["get"], urls=["/.well-known/openid-configuration", "/.well-known/openid-configuration/",
                                 "/openid/v1/jwks", "/openid/v1/jwks/"])]),
    ]
    aggregated = aggregate_cluster_roles(roles)
    for role in roles:
        if role.get("aggregationRule"):
            role["rules"] = aggregated[object_name(role)]
    bindings = [
        _cluster_role_binding("cluster-admin", "cluster-admin", [MASTERS]),
        _cluster_role_binding("system:discovery", "system:discovery", [AUTHENTICATED]),
        _cluster_role_binding("system:basic-user", "system:basic-user", [AUTHENTICATED]),
        _cluster_role_binding("system:public-info-viewer", "system:public-info-viewer",
                              [AUTHENTICATED, UNAUTHENTICATED]),
        _cluster_role_binding("system:service-account-issuer-discovery", "system:service-account-issuer-discovery",
                              [SERVICEACCOUNTS]),
    ]
    return roles + bindings
