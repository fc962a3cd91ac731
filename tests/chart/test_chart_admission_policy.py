"""The ValidatingAdmissionPolicy that bounds the module's own RBAC power, against a real kube-apiserver (lab/real):
the module's ServiceAccount, which holds escalate and bind, is refused each write the policy forbids, with the
policy's message, and may still write the grants the module makes. The lab's emulator does not evaluate
ValidatingAdmissionPolicies, so these run only on the real backend (skipped loudly without its binaries, failing
instead when PEERING_REQUIRE_REAL_APISERVER=1)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import helm_python as helm
import pytest

from chart_paths import CHART_DIR
from module_values import objects, values
from lab.real import RealControlPlane
from lab.testing import real_binaries_or_skip

pytestmark = pytest.mark.slow
RBAC = "/apis/rbac.authorization.k8s.io/v1"
GRANT_LABELS = {"app.kubernetes.io/managed-by": "peering", "peering.deckhouse.io/clusterpeer": "cluster-b"}
PEER_USER = {"kind": "User", "apiGroup": "rbac.authorization.k8s.io",
             "name": "peering:0b7c3e1a-5f2d-4c8e-9a61-2d4f8b3e7c10:system:serviceaccount:d8-x:ctl"}
READ_PODS = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    """A real control plane with the module's namespace, ServiceAccount, RBAC and admission policy applied."""
    binaries = real_binaries_or_skip()
    cp = RealControlPlane("vap", tmp_path_factory.mktemp("real-vap"), binaries=binaries)
    with helm.Chart.load(CHART_DIR) as chart:
        rendered = objects(chart, values())
    wanted = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
              "ValidatingAdmissionPolicyBinding"}
    chart_objects = [o for o in rendered if o["kind"] in wanted]

    async def setup() -> str:
        await cp.start()
        await cp.apply(chart_objects)
        return await cp.service_account_token("d8-peering", "peering", seconds=3600)

    token = asyncio.run(setup())
    yield cp, token
    asyncio.run(cp.stop())


def cluster_role(name: str, labels: dict | None = None, rules=None, **extra) -> dict:
    meta = {"name": name}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta,
            "rules": READ_PODS if rules is None else rules, **extra}


def binding(kind: str, name: str, role_kind: str, role: str, subjects=None, namespace: str | None = None) -> dict:
    meta = {"name": name, "labels": dict(GRANT_LABELS)}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
            "subjects": [PEER_USER] if subjects is None else subjects}


async def as_module(plane: RealControlPlane, token: str, method: str, path: str, body: dict | None = None):
    connector = aiohttp.TCPConnector(ssl=plane.ssl_context())
    async with aiohttp.ClientSession(base_url=plane.url, connector=connector,
                                     headers={"Authorization": f"Bearer {token}"},
                                     timeout=aiohttp.ClientTimeout(total=30)) as s:
        async with s.request(method, path, json=body) as r:
            return r.status, await r.json(content_type=None)


async def as_admin(plane: RealControlPlane, method: str, path: str, body: dict | None = None):
    async with plane.session() as s:
        async with s.request(method, path, json=body) as r:
            return r.status, await r.json(content_type=None)


async def refused(plane, token, method, path, body=None) -> str:
    """The policy's message for a write it refuses. The policy takes effect a moment after it is created, so the
    first refusal is awaited by a bounded poll (a write let through meanwhile is undone)."""
    deadline = time.monotonic() + 30
    while True:
        status, answer = await as_module(plane, token, method, path, body)
        if status == 403 and "d8-peering-rbac-bounds" in answer.get("message", ""):
            return answer["message"]
        assert status in (200, 201), answer
        assert time.monotonic() < deadline, f"the policy never refused {method} {path}: {answer}"
        if method == "POST":
            name = body["metadata"]["name"]
            await as_admin(plane, "DELETE", f"{path}/{name}")
        await asyncio.sleep(0.2)


async def test_a_role_without_the_module_labels_is_refused(plane) -> None:
    cp, token = plane
    message = await refused(cp, token, "POST", f"{RBAC}/clusterroles", cluster_role("d8:peering:cluster-b:x"))
    assert "writes only RBAC objects labelled app.kubernetes.io/managed-by: peering" in message


async def test_the_grants_the_module_makes_are_allowed(plane) -> None:
    cp, token = plane
    await refused(cp, token, "POST", f"{RBAC}/clusterroles", cluster_role("d8:peering:warmup"))
    status, answer = await as_module(cp, token, "POST", f"{RBAC}/clusterroles",
                                     cluster_role("d8:peering:cluster-b:read-pods", GRANT_LABELS))
    assert status == 201, answer
    status, answer = await as_module(cp, token, "POST", f"{RBAC}/clusterrolebindings",
                                     binding("ClusterRoleBinding", "d8:peering:cluster-b:read-pods", "ClusterRole",
                                             "d8:peering:cluster-b:read-pods"))
    assert status == 201, answer
    status, answer = await as_module(cp, token, "DELETE", f"{RBAC}/clusterrolebindings/d8:peering:cluster-b:read-pods")
    assert status == 200, answer


@pytest.mark.parametrize(("path", "body", "expected"), [
    pytest.param(f"{RBAC}/clusterrolebindings",
                 binding("ClusterRoleBinding", "d8:peering:cluster-b:admin", "ClusterRole", "cluster-admin"),
                 "binds only the roles of its grants", id="bind-cluster-admin"),
    pytest.param(f"{RBAC}/clusterrolebindings",
                 binding("ClusterRoleBinding", "d8:peering:cluster-b:sys", "ClusterRole", "system:controller:x"),
                 "binds only the roles of its grants", id="bind-system-role"),
    pytest.param(f"{RBAC}/clusterrolebindings",
                 binding("ClusterRoleBinding", "d8:peering:cluster-b:own", "ClusterRole", "d8:peering:controller"),
                 "binds only the roles of its grants", id="bind-its-own-role"),
    pytest.param(f"{RBAC}/clusterrolebindings",
                 binding("ClusterRoleBinding", "d8:peering:cluster-b:sa", "ClusterRole", "d8:peering:cluster-b:x",
                         subjects=[{"kind": "ServiceAccount", "name": "default", "namespace": "default"}]),
                 "binds only the identities of its peers' consumers", id="bind-a-serviceaccount"),
    pytest.param(f"{RBAC}/namespaces/default/rolebindings",
                 binding("RoleBinding", "d8:peering:cluster-b:cr", "ClusterRole", "d8:peering:cluster-b:x",
                         namespace="default"),
                 "binds a Role of the same namespace from a RoleBinding", id="rolebinding-to-clusterrole"),
    pytest.param(f"{RBAC}/clusterroles", cluster_role("d8:peering:cluster-b:esc", GRANT_LABELS, rules=[
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["escalate"]}]),
                 "carries no wildcard, no escalate", id="role-with-escalate"),
    pytest.param(f"{RBAC}/clusterroles", cluster_role("d8:peering:cluster-b:all", GRANT_LABELS, rules=[
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get"]}]),
                 "carries no wildcard", id="role-with-wildcard"),
    pytest.param(f"{RBAC}/clusterroles", cluster_role("d8:peering:cluster-b:agg", GRANT_LABELS, rules=[],
                                                      aggregationRule={"clusterRoleSelectors": [
                                                          {"matchLabels": {"x": "y"}}]}),
                 "does not aggregate other ClusterRoles", id="role-with-aggregation"),
    pytest.param(f"{RBAC}/clusterroles", cluster_role("cluster-b-reader", GRANT_LABELS),
                 "named d8:peering:<clusterpeer>:<capability>", id="role-without-its-naming"),
    pytest.param(f"{RBAC}/clusterroles", cluster_role("d8:peering:controller", GRANT_LABELS),
                 "never its own RBAC", id="role-named-as-its-own"),
    pytest.param(f"{RBAC}/clusterroles", cluster_role("d8:peering:cluster-b:h", {**GRANT_LABELS,
                                                                                  "heritage": "deckhouse"}),
                 "labelled heritage", id="role-labelled-heritage"),
])
async def test_each_forbidden_write_is_refused(plane, path: str, body: dict, expected: str) -> None:
    cp, token = plane
    assert expected in await refused(cp, token, "POST", path, body)


async def test_rbac_it_did_not_make_is_never_changed_or_deleted(plane) -> None:
    cp, token = plane
    status, answer = await as_admin(cp, "POST", f"{RBAC}/clusterroles", cluster_role("someone-elses"))
    assert status == 201, answer
    message = await refused(cp, token, "DELETE", f"{RBAC}/clusterroles/someone-elses")
    assert "changes and deletes only RBAC objects it made" in message
    changed = cluster_role("someone-elses", GRANT_LABELS)
    changed["metadata"]["resourceVersion"] = answer["metadata"]["resourceVersion"]
    message = await refused(cp, token, "PUT", f"{RBAC}/clusterroles/someone-elses", changed)
    assert "changes and deletes only RBAC objects it made" in message
    status, _ = await as_admin(cp, "GET", f"{RBAC}/clusterroles/someone-elses")
    assert status == 200


async def test_other_subjects_are_not_bound_by_the_policy(plane) -> None:
    """Deckhouse installs the module's own RBAC with its own identity: the policy matches the module alone."""
    cp, token = plane
    await refused(cp, token, "POST", f"{RBAC}/clusterroles", cluster_role("d8:peering:warmup2"))
    status, answer = await as_admin(cp, "POST", f"{RBAC}/clusterroles", cluster_role("admins-own-role"))
    assert status == 201, answer
