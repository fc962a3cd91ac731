"""Conformance of the emulated kube-apiserver through an unmodified kubectl: discovery, get (tables and
jsonpath), create, apply (client-side and server-side, create then change), patch (strategic, merge, json),
delete, get -w, create token, auth can-i, and the errors kubectl prints for invalid objects."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from tests.lab.conftest import KUBECTL

PEER = """
apiVersion: peering.deckhouse.io/v1alpha1
kind: ClusterPeer
metadata:
  name: cluster-b
spec:
  type: Invite
  invite:
    tokenTTL: {ttl}
"""


async def ok(lab, *args, stdin=None, kubeconfig=None) -> str:
    code, out, err = await lab.kubectl(*args, stdin=stdin, kubeconfig=kubeconfig)
    assert code == 0, f"kubectl {' '.join(args)} failed: {err}"
    return out


async def test_get_tables_and_jsonpath(lab):
    out = await ok(lab, "get", "namespaces")
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "STATUS", "AGE"]
    assert any(r.split()[:2] == ["default", "Active"] for r in rows)
    await ok(lab, "apply", "-f", "-", stdin=PEER.format(ttl="1h"))
    lab.server.update(dict(lab.server.get("peering.deckhouse.io", "clusterpeers", "cluster-b"), status={
        "phase": "Active", "effectiveCapabilities": ["dns", "logs"],
        "conditions": [{"type": "Ready", "status": "True", "reason": "PeeringReady", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}), subresource="status")
    out = await ok(lab, "get", "clusterpeers")
    header, row = out.splitlines()
    assert header.split() == ["NAME", "PHASE", "READY", "EFFECTIVE", "AGE"]
    assert row.split()[:4] == ["cluster-b", "Active", "True", '["dns","logs"]']
    wide = await ok(lab, "get", "cpeer", "-o", "wide")
    assert wide.splitlines()[0].split()[:2] == ["NAME", "TYPE"], "priority columns show with -o wide"
    ttl = await ok(lab, "get", "clusterpeer", "cluster-b", "-o", "jsonpath={.spec.invite.tokenTTL}")
    assert ttl == "1h"
    ready = await ok(lab, "get", "clusterpeer", "cluster-b", "-o",
                     'jsonpath={.status.conditions[?(@.type=="Ready")].status}')
    assert ready == "True"


async def test_apply_create_then_change_client_side(lab):
    cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: default\ndata:\n{data}"
    assert "created" in await ok(lab, "apply", "-f", "-", stdin=cm.format(data="  a: '1'\n  b: '2'\n"))
    assert "configured" in await ok(lab, "apply", "-f", "-", stdin=cm.format(data="  a: '3'\n"))
    got = json.loads(await ok(lab, "get", "configmap", "settings", "-n", "default", "-o", "json"))
    assert got["data"] == {"a": "3"}, "a key dropped from the applied file is removed"
    assert "kubectl.kubernetes.io/last-applied-configuration" in got["metadata"]["annotations"]
    assert "unchanged" in await ok(lab, "apply", "-f", "-", stdin=cm.format(data="  a: '3'\n"))
    # A custom resource: kubectl sends a merge patch; generation follows the spec.
    await ok(lab, "apply", "-f", "-", stdin=PEER.format(ttl="1h"))
    await ok(lab, "apply", "-f", "-", stdin=PEER.format(ttl="2h"))
    peer = json.loads(await ok(lab, "get", "clusterpeer", "cluster-b", "-o", "json"))
    assert peer["spec"]["invite"]["tokenTTL"] == "2h" and peer["metadata"]["generation"] == 2


async def test_apply_server_side(lab):
    cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  namespace: default\ndata:\n{data}"
    await ok(lab, "apply", "--server-side", "-f", "-", stdin=cm.format(data="  a: '1'\n  b: '2'\n"))
    await ok(lab, "patch", "configmap", "ssa", "-n", "default", "--type=merge", "-p", '{"data":{"other":"x"}}')
    await ok(lab, "apply", "--server-side", "-f", "-", stdin=cm.format(data="  a: '9'\n"))
    got = json.loads(await ok(lab, "get", "configmap", "ssa", "-n", "default", "-o", "json"))
    assert got["data"] == {"a": "9", "other": "x"}, "the manager's dropped field goes, others' fields stay"
    await ok(lab, "apply", "--server-side", "-f", "-", stdin=PEER.format(ttl="3h"))
    peer = json.loads(await ok(lab, "get", "clusterpeer", "cluster-b", "-o", "json"))
    assert peer["spec"]["invite"]["tokenTTL"] == "3h"


async def test_patch_merge_json_and_strategic_then_delete(lab):
    await ok(lab, "create", "configmap", "p", "-n", "default", "--from-literal=a=1")
    await ok(lab, "patch", "configmap", "p", "-n", "default", "-p", '{"data":{"b":"2"}}')
    await ok(lab, "patch", "configmap", "p", "-n", "default", "--type=merge", "-p", '{"data":{"a":null}}')
    await ok(lab, "patch", "configmap", "p", "-n", "default", "--type=json",
             "-p", '[{"op":"add","path":"/data/c","value":"3"}]')
    got = json.loads(await ok(lab, "get", "cm", "p", "-n", "default", "-o", "json"))
    assert got["data"] == {"b": "2", "c": "3"}
    code, _, err = await lab.kubectl("patch", "configmap", "p", "-n", "default", "--type=json",
                                     "-p", '[{"op":"remove","path":"/data/zzz"}]')
    assert code != 0 and "/data/zzz" in err
    await ok(lab, "apply", "-f", "-", stdin=PEER.format(ttl="1h"))
    await ok(lab, "patch", "clusterpeer", "cluster-b", "--type=merge", "-p", '{"spec":{"capabilities":["dns"]}}')
    await ok(lab, "patch", "clusterpeer", "cluster-b", "--subresource=status", "--type=merge",
             "-p", '{"status":{"phase":"Pending"}}')
    peer = json.loads(await ok(lab, "get", "clusterpeer", "cluster-b", "-o", "json"))
    assert peer["spec"]["capabilities"] == ["dns"] and peer["status"]["phase"] == "Pending"
    assert "deleted" in await ok(lab, "delete", "configmap", "p", "-n", "default")
    assert "deleted" in await ok(lab, "delete", "clusterpeer", "cluster-b")
    code, _, err = await lab.kubectl("get", "clusterpeer", "cluster-b")
    assert code == 1 and 'clusterpeers.peering.deckhouse.io "cluster-b" not found' in err


async def test_invalid_objects_are_refused_with_the_field(lab):
    code, _, err = await lab.kubectl("apply", "-f", "-", stdin=PEER.format(ttl="5m"))
    assert code == 1
    assert 'The ClusterPeer "cluster-b" is invalid' in err and "spec.invite.tokenTTL" in err
    code, _, err = await lab.kubectl("apply", "-f", "-", stdin=PEER.format(ttl="1h") + "  bogus: 1\n")
    assert code == 1 and 'unknown field "spec.bogus"' in err, "kubectl's default validation is Strict"


async def test_get_watch_streams_changes(lab):
    await ok(lab, "create", "configmap", "w0", "-n", "default")
    env = dict(os.environ, HOME=str(lab.tmp_path), KUBECONFIG=str(lab.kubeconfig))
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL), "--cache-dir", str(lab.tmp_path / "kube-cache"), "get", "configmaps", "-n", "default",
        "-w", "--no-headers", "-o", "custom-columns=NAME:.metadata.name,DATA:.data.k",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    try:
        async def line() -> list[str]:
            return (await asyncio.wait_for(proc.stdout.readline(), 15)).decode().split()

        assert await line() == ["w0", "<none>"], "the watch starts with what exists"
        await ok(lab, "create", "configmap", "w1", "-n", "default", "--from-literal=k=v1")
        seen = await line()
        while seen[0] != "w1":
            seen = await line()
        assert seen == ["w1", "v1"]
        await ok(lab, "patch", "configmap", "w1", "-n", "default", "--type=merge", "-p", '{"data":{"k":"v2"}}')
        assert await line() == ["w1", "v2"]
    finally:
        proc.terminate()
        await proc.wait()


async def test_create_token_and_auth_can_i(lab):
    await ok(lab, "create", "serviceaccount", "robot", "-n", "default")
    token = (await ok(lab, "create", "token", "robot", "-n", "default", "--audience=peering.deckhouse.io/u/c",
                      "--duration=10m")).strip()
    assert token.count(".") == 2
    claims = json.loads(await ok(lab, "create", "-o", "json", "-f", "-", stdin=json.dumps({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": token, "audiences": ["peering.deckhouse.io/u/c"]}})))
    assert claims["status"]["user"]["username"] == "system:serviceaccount:default:robot"
    assert (await ok(lab, "auth", "can-i", "create", "clusterpeers.peering.deckhouse.io")).strip() == "yes"
    viewer = lab.user_kubeconfig("viewer")
    code, out, _ = await lab.kubectl("auth", "can-i", "list", "secrets", "-n", "default", kubeconfig=viewer)
    assert (code, out.strip()) == (1, "no")
    code, _, err = await lab.kubectl("get", "secrets", "-n", "default", kubeconfig=viewer)
    assert code == 1 and 'User "viewer" cannot list resource "secrets" in API group "" in the namespace "default"' \
        in err


async def test_sensitive_field_masked_for_a_limited_user(lab):
    await ok(lab, "apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer", "metadata": {"name": "j"},
        "spec": {"type": "Join", "join": {"connectionString": "top-secret"}}}))
    await ok(lab, "create", "clusterrole", "peer-reader", "--verb=get,list",
             "--resource=clusterpeers.peering.deckhouse.io")
    await ok(lab, "create", "clusterrolebinding", "peer-reader", "--clusterrole=peer-reader", "--user=reader")
    reader = lab.user_kubeconfig("reader")
    masked = await ok(lab, "get", "clusterpeer", "j", "-o", "jsonpath={.spec.join.connectionString}",
                      kubeconfig=reader)
    assert masked == "<omitted>"
    assert await ok(lab, "get", "clusterpeer", "j", "-o", "jsonpath={.spec.join.connectionString}") == "top-secret"


@pytest.mark.parametrize("resource", ["configmaps", "clusterroles", "leases", "events", "crd", "tep"])
async def test_get_each_kind_kubectl_knows(lab, resource):
    if resource == "tep":
        resource = "tokenexchangeproviders"
    code, _, err = await lab.kubectl("get", resource, "-A")
    assert code == 0, err


async def test_server_side_apply_conflicts_between_managers(lab):
    cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owned\n  namespace: default\ndata:\n  k: '{v}'\n"
    await ok(lab, "apply", "--server-side", "--field-manager=first", "-f", "-", stdin=cm.format(v="1"))
    code, _, err = await lab.kubectl("apply", "--server-side", "--field-manager=second", "-f", "-",
                                     stdin=cm.format(v="2"))
    assert code == 1 and 'conflict with "first"' in err and ".data.k" in err
    await ok(lab, "apply", "--server-side", "--field-manager=second", "-f", "-", stdin=cm.format(v="1"))
    await ok(lab, "apply", "--server-side", "--force-conflicts", "--field-manager=second", "-f", "-",
             stdin=cm.format(v="3"))
    # The field moved to "second": "first" applying without it no longer removes it.
    await ok(lab, "apply", "--server-side", "--field-manager=first", "-f", "-",
             stdin="apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owned\n  namespace: default\n")
    got = json.loads(await ok(lab, "get", "configmap", "owned", "-n", "default", "-o", "json"))
    assert got["data"] == {"k": "3"}
