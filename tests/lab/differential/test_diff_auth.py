"""Who may do what: RBAC writes with the escalation and bind checks, SelfSubjectAccessReview (kubectl auth can-i),
SelfSubjectReview (kubectl auth whoami), SubjectAccessReview, TokenRequest and TokenReview with audiences,
anonymous and bad credentials, the same on the emulator and on the real kube-apiserver."""

from __future__ import annotations

import asyncio
import json

import pytest
import pytest_asyncio
from differential_support import ANONYMOUS, Backend, Deliberate, User

pytestmark = pytest.mark.asyncio(loop_scope="module")

NS = "diff-auth"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
ROLES = f"{RBAC}/namespaces/{NS}/roles"
BINDINGS = f"{RBAC}/namespaces/{NS}/rolebindings"
SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
SAR = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
SSRR = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"
WHOAMI = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SA = f"/api/v1/namespaces/{NS}/serviceaccounts"
ALICE = User("diff-alice", ("diff-team",))
ISSUER = "https://kubernetes.default.svc.cluster.local"


def role(name: str, rules: list[dict]) -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name},
            "rules": rules}


def binding(name: str, role_kind: str, role_name: str, subjects: list[dict]) -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name},
            "subjects": subjects}


def user_subject(name: str) -> dict:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}


ALICE_RULES = [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"],
                "verbs": ["create", "get", "update", "delete"]},
               {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def seeded(pair):
    """Alice may write Roles and RoleBindings in the namespace and read its ConfigMaps; a ServiceAccount."""
    for b in (pair.emulator, pair.real):
        for path, obj in (
                ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
                (ROLES, role("alice", ALICE_RULES)),
                (BINDINGS, binding("alice", "Role", "alice", [user_subject(ALICE.name)])),
                (SA, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "diff-sa"}})):
            made = await b.call("POST", path, body=obj)
            assert made.status == 201, made
        await until_allowed(b, {"namespace": NS, "verb": "create", "group": "rbac.authorization.k8s.io",
                                "resource": "roles"})
    return pair


async def test_escalation_checks_on_role_writes(seeded):
    async def case(b: Backend):
        s = {}
        s["within what she holds"] = await b.call("POST", ROLES, who=ALICE, body=role("a-read", [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]))
        s["more than she holds"] = await b.call("POST", ROLES, who=ALICE, body=role("a-secrets", [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]))
        s["a wildcard verb"] = await b.call("POST", ROLES, who=ALICE, body=role("a-star", [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]))
        s["update to more"] = await b.call("PUT", f"{ROLES}/a-read", who=ALICE, body={
            **s["within what she holds"].body, "rules": [
                {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get"]}]})
        s["a ClusterRole"] = await b.call("POST", f"{RBAC}/clusterroles", who=ALICE, body={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "diff-a-cr"},
            "rules": []})
        s["a role without rules"] = await b.call("POST", ROLES, who=ALICE, body=role("a-empty", []))
        s["a rule without verbs"] = await b.call("POST", ROLES, body=role("a-bad", [
            {"apiGroups": [""], "resources": ["configmaps"]}]))
        s["a rule without groups or resources"] = await b.call("POST", ROLES, body=role("a-bad", [
            {"verbs": ["get"]}]))
        s["non-resource URLs in a Role"] = await b.call("POST", ROLES, body=role("a-bad", [
            {"verbs": ["get"], "nonResourceURLs": ["/healthz", "/x"], "resources": ["pods"]}]))
        s["a ClusterRole with both"] = await b.call("POST", f"{RBAC}/clusterroles", body={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "diff-bad"},
            "rules": [{"verbs": ["get"], "nonResourceURLs": ["/x"], "apiGroups": [""]}]})
        return s

    await seeded.run(case)


async def test_bind_checks_on_binding_writes(seeded):
    async def case(b: Backend):
        s = {}
        s["her own role"] = await b.call("POST", BINDINGS, who=ALICE, body=binding(
            "a-own", "Role", "alice", [user_subject("diff-bob")]))
        await b.call("POST", f"{RBAC}/clusterroles", body={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "diff-edit"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get", "list", "update"]},
                      {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"],
                       "resourceNames": ["one"]}]})
        s["a ClusterRole she does not hold"] = await b.call("POST", BINDINGS, who=ALICE, body=binding(
            "a-edit", "ClusterRole", "diff-edit", [user_subject("diff-bob")]))
        s["a role that does not exist"] = await b.call("POST", BINDINGS, who=ALICE, body=binding(
            "a-none", "Role", "nothing-here", [user_subject("diff-bob")]))
        s["a ClusterRole that does not exist"] = await b.call("POST", BINDINGS, who=ALICE, body=binding(
            "a-none", "ClusterRole", "diff-nothing-here", [user_subject("diff-bob")]))
        s["admin binds a role that does not exist"] = await b.call("POST", BINDINGS, body=binding(
            "a-dangling", "Role", "nothing-here", [user_subject("diff-bob")]))
        # With bind on that one ClusterRole she may bind it, holding it or not.
        await b.call("POST", ROLES, body=role("alice-bind", [
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"],
             "resourceNames": ["diff-edit"]}]))
        await b.call("POST", BINDINGS, body=binding("alice-bind", "Role", "alice-bind", [user_subject(ALICE.name)]))
        await until_allowed(b, {"namespace": NS, "verb": "bind", "group": "rbac.authorization.k8s.io",
                                "resource": "clusterroles", "name": "diff-edit"})
        s["with bind"] = await b.call("POST", BINDINGS, who=ALICE, body=binding(
            "a-edit", "ClusterRole", "diff-edit", [user_subject("diff-bob")]))
        s["bind of another name"] = await b.call("POST", BINDINGS, who=ALICE, body=binding(
            "a-view", "ClusterRole", "diff-view", [user_subject("diff-bob")]))
        s["roleRef cannot change"] = await b.call("PUT", f"{BINDINGS}/a-own", body={
            **s["her own role"].body, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                  "name": "alice-bind"}})
        # With escalate on roles she may write a Role with more than she holds.
        await b.call("POST", ROLES, body=role("alice-escalate", [
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]}]))
        await b.call("POST", BINDINGS, body=binding("alice-escalate", "Role", "alice-escalate",
                                                    [user_subject(ALICE.name)]))
        await until_allowed(b, {"namespace": NS, "verb": "escalate", "group": "rbac.authorization.k8s.io",
                                "resource": "roles"})
        s["with escalate"] = await b.call("POST", ROLES, who=ALICE, body=role("a-secrets", [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]))
        return s

    await seeded.run(case)


async def until_allowed(b: Backend, attrs: dict, who: User = ALICE, timeout: float = 10.0) -> None:
    """Wait until RBAC lets `who` do it: kube-apiserver's authorizer sees new roles and bindings through an
    informer, a moment after they are written (the emulator at once)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        answer = await b.call("POST", SSAR, who=who, body=ssar(resourceAttributes=attrs))
        if answer.body["status"].get("allowed"):
            return
        assert asyncio.get_running_loop().time() < deadline, f"{b.name}: RBAC never allowed {attrs}: {answer}"
        await asyncio.sleep(0.05)


def ssar(**attrs) -> dict:
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": attrs}


async def test_access_reviews(seeded):
    async def case(b: Backend):
        s = {}
        s["admin may"] = await b.call("POST", SSAR, body=ssar(resourceAttributes={
            "namespace": NS, "verb": "get", "resource": "secrets"}))
        s["alice may"] = await b.call("POST", SSAR, who=ALICE, body=ssar(resourceAttributes={
            "namespace": NS, "verb": "list", "resource": "configmaps"}))
        s["alice may not"] = await b.call("POST", SSAR, who=ALICE, body=ssar(resourceAttributes={
            "namespace": NS, "verb": "get", "resource": "secrets"}))
        s["subresource"] = await b.call("POST", SSAR, who=ALICE, body=ssar(resourceAttributes={
            "verb": "get", "group": "peering.deckhouse.io", "resource": "clusterpeers", "subresource": "sensitive"}))
        # /apis: one binding allows it (the health paths have two, and which one the reason names is the order
        # kube-apiserver happens to find them in).
        s["non-resource"] = await b.call("POST", SSAR, who=ALICE, body=ssar(nonResourceAttributes={
            "path": "/apis", "verb": "get"}))
        s["neither"] = await b.call("POST", SSAR, who=ALICE, body=ssar())
        s["both"] = await b.call("POST", SSAR, who=ALICE, body=ssar(
            resourceAttributes={"verb": "get", "resource": "pods"}, nonResourceAttributes={"path": "/x",
                                                                                          "verb": "get"}))
        s["subject access review"] = await b.call("POST", SAR, body={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": ALICE.name, "groups": list(ALICE.groups),
                     "resourceAttributes": {"namespace": NS, "verb": "get", "resource": "configmaps"}}})
        s["subject access review without a user"] = await b.call("POST", SAR, body={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": "get", "resource": "configmaps"}}})
        s["alice may not review others"] = await b.call("POST", SAR, who=ALICE, body={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": "x", "resourceAttributes": {"verb": "get", "resource": "configmaps"}}})
        s["whoami"] = await b.call("POST", WHOAMI, who=ALICE, body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        s["whoami admin"] = await b.call("POST", WHOAMI, body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        s["reviews are create-only"] = await b.call("GET", SSAR, who=ALICE)
        return s

    await seeded.run(case)


async def test_rules_review(seeded):
    async def case(b: Backend):
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": NS}}
        answer = await b.call("POST", SSRR, who=ALICE, body=review)
        for key in ("resourceRules", "nonResourceRules"):
            # In the order of the bindings as each server happens to keep them: compared as sets.
            answer.body["status"][key].sort(key=lambda r: json.dumps(r, sort_keys=True))
        return {"rules review": answer,
                "under a namespace": await b.call("POST", f"/apis/authorization.k8s.io/v1/namespaces/{NS}/"
                                                  "selfsubjectrulesreviews", who=ALICE, body=review)}

    await seeded.run(case)


async def token_request(b: Backend, name: str, spec: dict):
    return await b.call("POST", f"{SA}/{name}/token", body={
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})


def review(token: str, audiences: list[str] | None = None) -> dict:
    spec: dict = {"token": token}
    if audiences is not None:
        spec["audiences"] = audiences
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}


async def test_token_request_and_review(seeded):
    async def case(b: Backend):
        s = {}
        with_audience = await token_request(b, "diff-sa", {"audiences": ["peering-test"], "expirationSeconds": 3600})
        s["token with an audience"] = with_audience
        default = await token_request(b, "diff-sa", {"expirationSeconds": 3600})
        s["token for the API"] = default
        s["too short"] = await token_request(b, "diff-sa", {"expirationSeconds": 60})
        s["no such account"] = await token_request(b, "diff-nobody", {"expirationSeconds": 3600})
        s["bound to a missing object"] = await token_request(b, "diff-sa", {
            "expirationSeconds": 3600, "boundObjectRef": {"kind": "Secret", "apiVersion": "v1", "name": "gone"}})
        token = with_audience.body["status"]["token"]
        api_token = default.body["status"]["token"]
        s["review, its audience"] = await b.call("POST", TOKENREVIEWS, body=review(token, ["peering-test"]))
        s["review, two audiences"] = await b.call("POST", TOKENREVIEWS, body=review(token, ["other",
                                                                                            "peering-test"]))
        s["review, another audience"] = await b.call("POST", TOKENREVIEWS, body=review(token, ["other"]))
        s["review, the API's audience by default"] = await b.call("POST", TOKENREVIEWS, body=review(token))
        s["review of an API token"] = await b.call("POST", TOKENREVIEWS, body=review(api_token))
        s["review of garbage"] = await b.call("POST", TOKENREVIEWS, body=review("not-a-token", ["peering-test"]))
        s["review without a token"] = await b.call("POST", TOKENREVIEWS, body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {}})
        s["alice may not review"] = await b.call("POST", TOKENREVIEWS, who=ALICE, body=review(token))
        s["whoami with the API token"] = await b.call("POST", WHOAMI, token=api_token, body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        s["the audience token is not for the API"] = await b.call("GET", "/api/v1/namespaces", token=token)
        s["the API token, forbidden"] = await b.call("GET", "/api/v1/namespaces", token=api_token)
        return s

    await seeded.run(case)


async def test_anonymous_and_bad_credentials(seeded):
    async def case(b: Backend):
        s = {}
        for path in ("/version", "/healthz", "/readyz", "/livez", "/api/v1/namespaces", "/api",
                     "/.well-known/openid-configuration", "/openid/v1/jwks"):
            s[f"anonymous {path}"] = await b.call("GET", path, who=ANONYMOUS)
        s["a token nobody issued"] = await b.call("GET", "/api/v1/namespaces", token="not-a-token")
        s["an empty bearer"] = await b.call("GET", "/version", token="")
        return s

    # Build facts of the binaries: when and with which Go each was built.
    await seeded.run(case, volatile=("buildDate", "goVersion"))


async def test_sensitive_fields_are_the_emulators_alone(seeded):
    """Deckhouse's x-kubernetes-sensitive-data (its own patch of kube-apiserver): the emulator masks the marked
    fields for a reader without clusterpeers/sensitive; a stock kube-apiserver, which got the CRDs without the
    marker, shows them. Kept, and checked, as the one documented difference of what a reader sees."""
    reader = User("diff-reader")
    cp = "/apis/peering.deckhouse.io/v1alpha1/clusterpeers"

    async def case(b: Backend):
        await b.call("POST", f"{RBAC}/clusterroles", body={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "diff-reader"},
            "rules": [{"apiGroups": ["peering.deckhouse.io"], "resources": ["clusterpeers"], "verbs": ["get"]}]})
        await b.call("POST", f"{RBAC}/clusterrolebindings", body={
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "diff-reader"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                             "kind": "ClusterRole", "name": "diff-reader"},
            "subjects": [user_subject(reader.name)]})
        await until_allowed(b, {"verb": "get", "group": "peering.deckhouse.io", "resource": "clusterpeers"},
                            who=reader)
        made = await b.call("POST", cp, body={
            "apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer", "metadata": {"name": "diff-sens"},
            "spec": {"type": "Join", "join": {"connectionString": "d8peer1.not-a-real-secret"}}})
        assert made.status == 201, made
        s = {"as the reader": await b.call("GET", f"{cp}/diff-sens", who=reader),
             "as the admin": await b.call("GET", f"{cp}/diff-sens")}
        await b.call("DELETE", f"{cp}/diff-sens")
        return s

    await seeded.run(case, deliberate=(Deliberate(
        "as the reader", ("body", "spec", "join", "connectionString"), "<omitted>",
        "d8peer1.not-a-real-secret",
        "x-kubernetes-sensitive-data is Deckhouse's patch of kube-apiserver: a stock one refuses the marker, so "
        "the real backend gets the CRDs without it and shows the value"),))


async def test_owner_references_permission_enforcement(seeded):
    """OwnerReferencesPermissionEnforcement (Deckhouse enables it): blocking an owner's deletion needs the right
    to set that owner's finalizers."""
    cm = f"/api/v1/namespaces/{NS}/configmaps"

    async def case(b: Backend):
        owner = await b.call("POST", cm, body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "orpe"}})
        assert owner.status == 201, owner
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "orpe", "uid": owner.body["metadata"]["uid"]}
        await b.call("POST", ROLES, body=role("orpe-writer", [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "update", "patch"]}]))
        await b.call("POST", BINDINGS, body=binding("orpe-writer", "Role", "orpe-writer",
                                                    [user_subject("diff-writer")]))
        writer = User("diff-writer")
        await until_allowed(b, {"namespace": NS, "verb": "create", "resource": "configmaps"}, who=writer)
        s = {}
        for name, blocking in (("orpe-plain", False), ("orpe-blocking", True)):
            s[name] = await b.call("POST", cm, who=writer, body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                "name": name, "ownerReferences": [dict(ref, blockOwnerDeletion=blocking)]}})
        plain = s["orpe-plain"].body
        s["update to blocking"] = await b.call("PUT", f"{cm}/orpe-plain", who=writer, body={
            **plain, "metadata": {**plain["metadata"], "ownerReferences": [dict(ref, blockOwnerDeletion=True)]}})
        s["patch to blocking"] = await b.call("PATCH", f"{cm}/orpe-plain", who=writer,
                                              content_type="application/merge-patch+json", body={"metadata": {
                                                  "ownerReferences": [dict(ref, blockOwnerDeletion=True)]}})
        s["the admin may"] = await b.call("PATCH", f"{cm}/orpe-plain", content_type="application/merge-patch+json",
                                          body={"metadata": {"ownerReferences": [dict(ref, blockOwnerDeletion=True)]}})
        blocked = s["the admin may"].body
        s["keeping what is there"] = await b.call("PUT", f"{cm}/orpe-plain", who=writer, body={
            **blocked, "data": {"k": "v"}})
        return s

    await seeded.run(case)
