"""Impersonate-* headers: who may act as whom, and the user a request then acts as."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from lab.apiserver.auth.impersonation import impersonate, impersonation_headers
from lab.apiserver.auth.bootstrap import bootstrap_objects
from lab.apiserver.auth.rbac import Authorizer
from lab.apiserver.auth.types import UserInfo
from lab.apiserver.errors import ApiError

RBAC = "rbac.authorization.k8s.io"


def _objects() -> list[dict]:
    def cluster_role(name, rules):
        return {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": {"name": name}, "rules": rules}

    def bind(name, role, user):
        return {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
                "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role},
                "subjects": [{"apiGroup": RBAC, "kind": "User", "name": user}]}

    return bootstrap_objects() + [
        cluster_role("impersonate-bob", [
            {"verbs": ["impersonate"], "apiGroups": [""], "resources": ["users"], "resourceNames": ["bob"]},
            {"verbs": ["impersonate"], "apiGroups": [""], "resources": ["groups"], "resourceNames": ["devs"]},
            {"verbs": ["impersonate"], "apiGroups": ["authentication.k8s.io"], "resources": ["userextras/scopes"]},
        ]),
        bind("alice-impersonates", "impersonate-bob", "alice"),
        {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": {"name": "sa", "namespace": "d8-x"},
         "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "edit"},
         "subjects": [{"apiGroup": RBAC, "kind": "User", "name": "lead"}]},
    ]


@pytest.fixture(scope="module")
def authz() -> Authorizer:
    objects = _objects()
    plural = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings", "RoleBinding": "rolebindings",
              "Role": "roles"}

    def list_objects(group, resource, namespace):
        return [o for o in objects if plural[o["kind"]] == resource
                and (namespace is None or o["metadata"].get("namespace") == namespace)]

    return Authorizer(list_objects)


ALICE = UserInfo("alice", ("system:authenticated",))
LEAD = UserInfo("lead", ("system:authenticated",))
ROOT = UserInfo("root", ("system:masters", "system:authenticated"))


def headers(*pairs: tuple[str, str]) -> CIMultiDictProxy:
    return CIMultiDictProxy(CIMultiDict(pairs))


def test_no_headers_is_the_authenticated_user(authz):
    assert impersonate(ALICE, headers(("Authorization", "Bearer x")), authz) is ALICE
    assert not impersonation_headers(headers(("Accept", "application/json")))
    assert impersonation_headers({"impersonate-user": "x"})


def test_allowed_user_group_and_extra(authz):
    acting = impersonate(ALICE, headers(("Impersonate-User", "bob"), ("Impersonate-Group", "devs"),
                                        ("Impersonate-Extra-Scopes", "view"), ("Impersonate-Extra-Scopes", "edit")),
                         authz)
    assert acting == UserInfo("bob", ("devs", "system:authenticated"), extra={"scopes": ("view", "edit")})


@pytest.mark.parametrize("pairs,message", [
    ((("Impersonate-User", "carol"),),
     'users "carol" is forbidden: User "alice" cannot impersonate resource "users" in API group "" at the cluster scope'),
    ((("Impersonate-User", "bob"), ("Impersonate-Group", "system:masters")),
     'groups "system:masters" is forbidden: User "alice" cannot impersonate resource "groups"'),
    ((("Impersonate-User", "bob"), ("Impersonate-Uid", "1234")),
     'uids.authentication.k8s.io "1234" is forbidden'),
    ((("Impersonate-User", "bob"), ("Impersonate-Extra-Other", "x")),
     'cannot impersonate resource "userextras/other" in API group "authentication.k8s.io"'),
    ((("Impersonate-User", "system:serviceaccount:kube-system:admin"),),
     'serviceaccounts "admin" is forbidden: User "alice" cannot impersonate resource "serviceaccounts" in API group '
     '"" in the namespace "kube-system"'),
])
def test_denied_impersonation_is_a_403(authz, pairs, message):
    with pytest.raises(ApiError) as err:
        impersonate(ALICE, headers(*pairs), authz)
    assert err.value.code == 403 and message in err.value.message


def test_service_account_impersonation_through_the_edit_role(authz):
    # The bootstrap edit role lets its holders impersonate the ServiceAccounts of their namespace.
    acting = impersonate(LEAD, headers(("Impersonate-User", "system:serviceaccount:d8-x:ctl")), authz)
    assert acting == UserInfo("system:serviceaccount:d8-x:ctl", (
        "system:serviceaccounts", "system:serviceaccounts:d8-x", "system:authenticated"))
    with pytest.raises(ApiError):
        impersonate(LEAD, headers(("Impersonate-User", "system:serviceaccount:d8-y:ctl")), authz)


def test_masters_may_impersonate_anyone_including_anonymous(authz):
    assert impersonate(ROOT, headers(("Impersonate-User", "system:anonymous")), authz) == UserInfo(
        "system:anonymous", ("system:unauthenticated",))
    acting = impersonate(ROOT, headers(("Impersonate-User", "x"), ("Impersonate-Group", "system:unauthenticated"),
                                       ("Impersonate-Uid", "u-1")), authz)
    assert acting == UserInfo("x", ("system:unauthenticated",), uid="u-1")


@pytest.mark.parametrize("pairs", [
    (("Impersonate-Group", "devs"),),
    (("Impersonate-Uid", "1"),),
    (("Impersonate-Extra-Scopes", "view"),),
    (("Impersonate-User", "a"), ("Impersonate-User", "b")),
])
def test_malformed_requests_are_a_400(authz, pairs):
    with pytest.raises(ApiError) as err:
        impersonate(ROOT, headers(*pairs), authz)
    assert err.value.code == 400


def test_escaped_extra_keys(authz):
    acting = impersonate(ROOT, headers(("Impersonate-User", "x"),
                                       ("Impersonate-Extra-Example.com%2fteam", "a")), authz)
    assert acting.extra == {"example.com/team": ("a",)}
