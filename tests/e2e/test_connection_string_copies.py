"""The connection string is never readable from a copy the API server keeps: after a Join ClusterPeer is made with
`kubectl create`, `kubectl apply --server-side` or a client-side `kubectl apply` (which copies the whole object into
the annotation kubectl.kubernetes.io/last-applied-configuration), the string is in spec.join.connectionString of
the joining cluster and nowhere else: not in an annotation, the managed fields or the status, nor in an Event of
either cluster. On the real backend the chart's MutatingAdmissionPolicy (Kubernetes 1.36 and later) strips the
copy before the object is stored; on the emulator, which evaluates no admission policy, the module removes it and
says so in a Warning Event (ConnectionStringCopyRemoved) that names the annotation only."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest
import pytest_asyncio

from lab.demo.kubectl import KUBECTL
from lab.testing import apiserver_backends, lab_clusters
from peering_lab import clusterpeer, connection_string, create_invite, fast_peering_command, ready, until, until_equal

pytestmark = pytest.mark.asyncio(loop_scope="module")
COMMANDS = {"created": ("create", "-f", "-"),
            "server-side": ("apply", "--server-side", "--field-manager=admin", "-f", "-"),
            "applied": ("apply", "-f", "-")}


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=apiserver_backends())
async def lab(request, tmp_path_factory):
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["a", "b"], peering_command=fast_peering_command,
                            apiserver=request.param) as lab:
        yield lab


async def kubectl(cluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """kubectl in a thread: the emulator answers it on this test's event loop."""
    return await asyncio.to_thread(subprocess.run, [KUBECTL, "--kubeconfig", str(cluster.path("kubeconfig")), *args],
                                   input=stdin, capture_output=True, text=True, timeout=60)


def join_manifest(name: str, text: str) -> str:
    return json.dumps({"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                       "metadata": {"name": name}, "spec": {"type": "Join", "join": {"connectionString": text}}})


def copies(cluster, strings: dict[str, str]) -> list[str]:
    """Where `cluster` keeps any of `strings` besides the two sensitive fields that hold one by design (a Join's
    spec.join.connectionString, an Invite's status.invite.connectionString): its ClusterPeers' metadata
    (annotations, managed fields), spec and status, and every Event."""
    found = []
    for obj in cluster.api.list("peering.deckhouse.io", "clusterpeers"):
        name = obj["metadata"]["name"]
        rest = json.loads(json.dumps(obj))
        rest["spec"].get("join", {}).pop("connectionString", None)
        (rest.get("status") or {}).get("invite", {}).pop("connectionString", None)
        for key in ("metadata", "spec", "status"):
            found += [f"ClusterPeer {name} {key} holds the string of {of}" for of, text in strings.items()
                      if text in json.dumps(rest.get(key))]
    events = json.dumps(cluster.api.list("", "events")) + json.dumps(cluster.api.list("events.k8s.io", "events"))
    found += [f"an Event holds the string of {of}" for of, text in strings.items() if text in events]
    return found


def refused_for_its_copy(done: subprocess.CompletedProcess) -> bool:
    """kubectl's answer is the chart's ValidatingAdmissionPolicy refusing a copy, naming the commands to use."""
    return done.returncode != 0 and "d8-peering-connection-string-copies" in done.stderr and \
        "d8 k create -f" in done.stderr


async def policies_in_force(cluster, text: str) -> None:
    """On the real backend, until the chart's admission policies take effect (a moment after the lab created
    them): a server-side dry run of a client-side apply comes back without the copy (the MutatingAdmissionPolicy),
    or is refused for it (the ValidatingAdmissionPolicy, where the mutation could not run)."""
    async def in_force() -> bool:
        done = await kubectl(cluster, "apply", "--dry-run=server", "-o", "json", "-f", "-",
                             stdin=join_manifest("dry-run", text))
        if done.returncode != 0:
            return refused_for_its_copy(done)
        annotations = json.loads(done.stdout).get("metadata", {}).get("annotations") or {}
        return "kubectl.kubernetes.io/last-applied-configuration" not in annotations
    for _ in range(150):
        if await in_force():
            return
        await asyncio.sleep(0.2)
    raise AssertionError("the chart's admission policies never took effect on a dry run")


async def test_no_copy_of_the_string_after_create_server_side_apply_or_apply(lab):
    a, b = lab["a"], lab["b"]
    if b.apiserver == "real":
        await policies_in_force(b, "d8peer1.dry-run")
    strings = {}
    for name in COMMANDS:
        create_invite(a, f"for-{name}", tokenTTL="1h")
        strings[name] = await connection_string(a, f"for-{name}")
    for name, args in COMMANDS.items():
        done = await kubectl(b, *args, stdin=join_manifest(name, strings[name]))
        assert strings[name] not in done.stdout + done.stderr
        if name == "applied" and b.apiserver == "real" and refused_for_its_copy(done):
            # The mutation could not run (kube-apiserver lacked the CRD's schema for it): refused instead, and
            # made as the refusal says.
            done = await kubectl(b, *COMMANDS["created"], stdin=join_manifest(name, strings[name]))
        assert done.returncode == 0, done.stderr
    # One of them joins; b peers with a once, so the others end in ClusterUUIDInUse (each with its status and
    # Events written).
    def outcome():
        return sorted(ready(clusterpeer(b, name))[2] for name in COMMANDS)
    await until_equal(outcome, ["ClusterUUIDInUse", "ClusterUUIDInUse", "PeeringReady"], timeout=45)
    await until(lambda: not copies(b, strings), timeout=15, what="no copy of a string on b")
    assert copies(b, strings) == [] and copies(a, strings) == []
    applied = clusterpeer(b, "applied")
    assert "kubectl.kubernetes.io/last-applied-configuration" not in (applied["metadata"].get("annotations") or {})
    removed = [e for e in b.api.list("events.k8s.io", "events") if e.get("reason") == "ConnectionStringCopyRemoved"]
    if b.apiserver == "real":
        assert removed == []  # the MutatingAdmissionPolicy stripped it: nothing was ever stored to remove
    else:
        assert [(e["type"], e["regarding"]["name"]) for e in removed] == [("Warning", "applied")]
        assert "kubectl.kubernetes.io/last-applied-configuration" in removed[0]["note"]
        assert "d8 k create -f" in removed[0]["note"]
