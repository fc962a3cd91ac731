"""`peering check` on the shape a Deckhouse cluster has and the lab's emulator has not: the module's Deployment and
its Pods, on a real kube-apiserver. The lab stores the chart's Deployment there, but nothing runs it (no
controller-manager's deployment controller, no kubelet: the lab runs the peering process beside the API), so the
test plays those two: it writes the Pods and the statuses they would write, then breaks one Pod. The check reads
the domain and Dex's URL from the Deployment here, with no --public-domain-template."""

from __future__ import annotations

import copy

import pytest
import pytest_asyncio

from lab.testing import lab_clusters
from peering_lab import fast_peering_command
from check_helpers import check, line

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.real,
              pytest.mark.timeout(240)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory):
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["a"], peering_command=fast_peering_command,
                            apiserver="real") as lab:
        yield lab["a"]


async def _check(cluster, *args):
    # As on a real cluster: no --public-domain-template (the Deployment says it); the lab's names still need
    # --resolve, which `check` adds.
    return await check(cluster, *args, domain=False)


def _pod(deployment: dict, name: str) -> dict:
    template = copy.deepcopy(deployment["spec"]["template"])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "d8-peering", "labels": template["metadata"]["labels"]},
            "spec": template["spec"]}


def _pod_status(pod: dict, *, ready: bool, waiting: str | None = None) -> dict:
    state = {"waiting": {"reason": waiting, "message": "back-off restarting"}} if waiting else {
        "running": {"startedAt": "2026-12-01T00:00:00Z"}}
    pod["status"] = {"phase": "Running",
                     "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                     "containerStatuses": [{"name": c["name"], "ready": ready, "restartCount": 0 if ready else 5,
                                            "image": c["image"], "imageID": "", "state": state}
                                           for c in pod["spec"]["containers"]]}
    return pod


async def test_the_replicas_of_the_deployment_and_their_pods(cluster):
    api = cluster.api
    deployment = api.get("apps", "deployments", "peering", "d8-peering")
    assert deployment is not None, "the lab installs the chart's Deployment on a real kube-apiserver"
    replicas = deployment["spec"].get("replicas", 1)
    # Nothing runs it yet: no Pod, no ready replica.
    code, text = await _check(cluster)
    failing, fix = line(text, "replicas")
    assert code == 1 and f"0 of {replicas} replicas ready; not ready: no Pod yet" in failing
    # The domain came from the Deployment's arguments, Dex's URL from its environment.
    line(text, "dns", "✓")
    assert "Dex answers at https://dex.a.lab" in line(text, "dex", "✓")[0]
    # What the deployment controller and the kubelet would write: Pods named as the Lease's holder is. Their
    # priority class is one of Deckhouse's, which every Deckhouse cluster has.
    priority = deployment["spec"]["template"]["spec"].get("priorityClassName")
    if priority and api.get("scheduling.k8s.io", "priorityclasses", priority) is None:
        api.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": priority},
                    "value": 4000})
    names = ["lab-a"] + [f"lab-a-{i}" for i in range(1, replicas)]
    for name in names:
        pod = api.create(_pod(deployment, name))
        api.update(_pod_status(pod, ready=True), subresource="status")
    deployment = api.get("apps", "deployments", "peering", "d8-peering")
    deployment["status"] = {"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
                            "observedGeneration": deployment["metadata"]["generation"]}
    api.update(deployment, subresource="status")
    code, text = await _check(cluster)
    assert f"{replicas} of {replicas} replicas ready: {', '.join(sorted(names))}" in line(text, "replicas", "✓")[0]
    assert "held by lab-a" in line(text, "leader", "✓")[0]
    # One Pod crashes: named, with what to run.
    broken = names[-1]
    pod = api.get("", "pods", broken, "d8-peering")
    api.update(_pod_status(pod, ready=False, waiting="CrashLoopBackOff"), subresource="status")
    deployment = api.get("apps", "deployments", "peering", "d8-peering")
    deployment["status"].update(readyReplicas=replicas - 1, availableReplicas=replicas - 1)
    api.update(deployment, subresource="status")
    code, text = await _check(cluster)
    failing, fix = line(text, "replicas")
    assert code == 1 and f"{broken} CrashLoopBackOff (5 restarts)" in failing
    assert f"describe pod {broken}" in fix and f"logs {broken} -c peering" in fix
    if broken == "lab-a":  # a single replica: its leader is that crashed Pod, which the leader line says
        assert "not a ready Pod" in line(text, "leader", "!")[0]
