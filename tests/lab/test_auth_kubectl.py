"""The auth code as kubectl meets it through the running emulator: whoami, can-i, can-i --list, bootstrap roles,
escalation prevention and ServiceAccount tokens revoked by deleting their ServiceAccount."""

from __future__ import annotations

import json

from lab.apiserver.testing import write_kubeconfig

RBAC = "rbac.authorization.k8s.io"


async def _apply(lab, doc: dict) -> None:
    code, out, err = await lab.kubectl("apply", "-f", "-", stdin=json.dumps(doc))
    assert code == 0, err


async def test_whoami_and_can_i_for_a_certificate_user(lab):
    jane = lab.user_kubeconfig("jane", ["team-a"])
    code, out, err = await lab.kubectl("auth", "whoami", "-o", "json", kubeconfig=jane)
    assert code == 0, err
    info = json.loads(out)["status"]["userInfo"]
    assert {k: info[k] for k in ("username", "groups")} == {"username": "jane",
                                                             "groups": ["team-a", "system:authenticated"]}
    assert info["extra"]["authentication.kubernetes.io/credential-id"][0].startswith("X509SHA256=")

    await _apply(lab, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns-a"}})
    await _apply(lab, {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
                       "metadata": {"name": "team-a-view", "namespace": "ns-a"},
                       "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "view"},
                       "subjects": [{"apiGroup": RBAC, "kind": "Group", "name": "team-a"}]})
    for args, answer in [
        (("list", "pods", "-n", "ns-a"), "yes"),
        (("list", "pods", "-n", "default"), "no"),
        (("get", "secrets", "-n", "ns-a"), "no"),
        (("get", "clusterpeers.peering.deckhouse.io"), "no"),
        (("get", "/apis"), "yes"),
    ]:
        code, out, err = await lab.kubectl("auth", "can-i", *args, kubeconfig=jane)
        assert out.strip() == answer, (args, out, err)
        assert code == (0 if answer == "yes" else 1)

    code, out, err = await lab.kubectl("auth", "can-i", "--list", "-n", "ns-a", kubeconfig=jane)
    assert code == 0, err
    lines = out.splitlines()
    assert any(line.split()[0] == "pods" and "[get list watch]" in line for line in lines), out
    assert any(line.startswith("selfsubjectaccessreviews.authorization.k8s.io") for line in lines), out


async def test_can_i_on_the_sensitive_subresource(lab):
    await _apply(lab, {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": {"name": "peer-secrets"},
                       "rules": [{"apiGroups": ["peering.deckhouse.io"], "verbs": ["get"],
                                  "resources": ["clusterpeers", "clusterpeers/sensitive"]}]})
    await _apply(lab, {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "ops"},
                       "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "peer-secrets"},
                       "subjects": [{"apiGroup": RBAC, "kind": "User", "name": "ops"}]})
    ops = lab.user_kubeconfig("ops")
    dev = lab.user_kubeconfig("dev")
    for kubeconfig, verb, answer in [(ops, "get", "yes"), (ops, "list", "no"), (dev, "get", "no")]:
        _, out, err = await lab.kubectl("auth", "can-i", verb, "clusterpeers.peering.deckhouse.io",
                                        "--subresource=sensitive", kubeconfig=kubeconfig)
        assert out.strip() == answer, (verb, out, err)


async def test_bootstrap_roles_are_visible_to_kubectl(lab):
    code, out, err = await lab.kubectl("get", "clusterroles", "-o", "name")
    assert code == 0, err
    for name in ("cluster-admin", "admin", "edit", "view", "system:discovery", "system:basic-user"):
        assert f"clusterrole.rbac.authorization.k8s.io/{name}" in out.split()
    code, out, err = await lab.kubectl("get", "clusterrolebinding", "system:basic-user", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["subjects"][0]["name"] == "system:authenticated"


async def test_escalation_is_refused_unless_held(lab):
    await _apply(lab, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns-e"}})
    await _apply(lab, {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
                       "metadata": {"name": "lead-admin", "namespace": "ns-e"},
                       "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "admin"},
                       "subjects": [{"apiGroup": RBAC, "kind": "User", "name": "lead"}]})
    lead = lab.user_kubeconfig("lead")
    # admin in ns-e may hand out edit there (it holds edit's rules), but not cluster-admin.
    code, _, err = await lab.kubectl("create", "rolebinding", "dev-edit", "-n", "ns-e", "--clusterrole=edit",
                                     "--user=dev", kubeconfig=lead)
    assert code == 0, err
    code, _, err = await lab.kubectl("create", "rolebinding", "dev-root", "-n", "ns-e",
                                     "--clusterrole=cluster-admin", "--user=dev", kubeconfig=lead)
    assert code != 0 and "attempting to grant RBAC permissions not currently held" in err
    code, _, err = await lab.kubectl("create", "role", "peers", "-n", "ns-e", "--verb=get",
                                     "--resource=clusterpeers.peering.deckhouse.io",
                                     kubeconfig=lead)
    assert code != 0 and "not currently held" in err


async def test_service_account_token_stops_working_when_the_account_is_deleted(lab):
    code, _, err = await lab.kubectl("create", "serviceaccount", "robot", "-n", "default")
    assert code == 0, err
    code, token, err = await lab.kubectl("create", "token", "robot", "-n", "default", "--duration=10m")
    assert code == 0, err
    token = token.strip()
    robot = write_kubeconfig(lab.tmp_path / "kubeconfig-robot", lab.server.url, lab.ca_pem, token=token)
    code, out, err = await lab.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}",
                                       kubeconfig=robot)
    assert code == 0 and out == "system:serviceaccount:default:robot", err
    code, _, err = await lab.kubectl("delete", "serviceaccount", "robot", "-n", "default")
    assert code == 0, err
    code, _, err = await lab.kubectl("auth", "whoami", kubeconfig=robot)
    assert code != 0 and "Unauthorized" in err
    assert token not in err
    # Too short a duration is refused with kube-apiserver's words.
    await lab.kubectl("create", "serviceaccount", "robot2", "-n", "default")
    code, _, err = await lab.kubectl("create", "token", "robot2", "-n", "default", "--duration=5m")
    assert code != 0 and "may not specify a duration less than 10 minutes" in err
