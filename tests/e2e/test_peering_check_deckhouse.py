"""`peering check` on the shape a Deckhouse cluster has and the lab's emulator has not: the module's Deployment and
its Pods, on a real kube-apiserver. The lab stores the chart's Deployment there and runs its two replicas beside the
API; lab/workload.py writes what the deployment controller and the kubelet would (a Pod per replica, named as its
Lease identity, and the Deployment's status). The test crashes a replica, then writes what the kubelet's restart
back-off would show, which the lab does not play. The check reads the domain and Dex's URL from the Deployment
here, with no --public-domain-template.

Real backend only: the emulator serves no Deployments or Pods (tests/e2e/test_peering_check.py checks the lab's
shape there on both backends)."""

from __future__ import annotations

import signal

import pytest
import pytest_asyncio

from lab.testing import lab_clusters
from peering_lab import fast_peering_command, until
from check_helpers import check, line

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.real,
              pytest.mark.timeout(240)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory):
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["a"], peering_command=fast_peering_command,
                            apiserver="real", replicas=2) as lab:
        yield lab["a"]


async def _check(cluster, *args):
    # As on a real cluster: no --public-domain-template (the Deployment says it); the lab's names still need
    # --resolve, which `check` adds.
    return await check(cluster, *args, domain=False)


def _ready_replicas(cluster) -> int:
    deployment = cluster.api.get("apps", "deployments", "peering", "d8-peering")
    return (deployment.get("status") or {}).get("readyReplicas", 0)


async def test_the_replicas_of_the_deployment_and_their_pods(cluster):
    api = cluster.api
    deployment = api.get("apps", "deployments", "peering", "d8-peering")
    assert deployment["spec"]["replicas"] == 2, "two replicas, as the chart deploys in high availability"
    names = sorted(r.identity for r in cluster.replicas)
    code, text = await _check(cluster)
    assert f"2 of 2 replicas ready: {', '.join(names)}" in line(text, "replicas", "✓")[0]
    leader = cluster.leader()
    assert f"held by {leader.identity}" in line(text, "leader", "✓")[0]
    # The domain came from the Deployment's arguments, Dex's URL from its environment.
    line(text, "dns", "✓")
    assert "Dex answers at https://dex.a.lab" in line(text, "dex", "✓")[0]
    # The replica that does not lead crashes: its Pod is not ready, its container ended by the signal.
    crashed = next(r for r in cluster.replicas if r is not leader)
    await cluster.stop_replica(crashed.index, signal.SIGKILL)
    await until(lambda: _ready_replicas(cluster) == 1, what="the Deployment's status: one replica ready")
    code, text = await _check(cluster)
    failing, fix = line(text, "replicas")
    assert code == 1 and f"1 of 2 replicas ready; not ready: {crashed.identity} Error" in failing
    assert f"describe pod {crashed.identity}" in fix and f"logs {crashed.identity} -c peering" in fix
    # What the kubelet shows once its restarts back off: named, with the count.
    pod = api.get("", "pods", crashed.identity, "d8-peering")
    for status in pod["status"]["containerStatuses"]:
        status.update(restartCount=5, state={"waiting": {"reason": "CrashLoopBackOff",
                                                         "message": "back-off restarting failed container"}})
    api.update(pod, subresource="status")
    code, text = await _check(cluster)
    assert code == 1 and f"{crashed.identity} CrashLoopBackOff (5 restarts)" in line(text, "replicas")[0]
    # Started again: the same Pod's container came back.
    await cluster.start_replica(crashed.index)
    await until(lambda: _ready_replicas(cluster) == 2, what="the Deployment's status: both replicas ready")
    pod = api.get("", "pods", crashed.identity, "d8-peering")
    assert [c["restartCount"] for c in pod["status"]["containerStatuses"]] == [1] * len(pod["spec"]["containers"])
    code, text = await _check(cluster)
    assert code == 0 and f"2 of 2 replicas ready: {', '.join(names)}" in line(text, "replicas", "✓")[0]
    # Both stopped cleanly: their Pods are gone, and none has come yet.
    await cluster.stop_peering()
    assert api.list("", "pods", "d8-peering") == []
    code, text = await _check(cluster)
    failing, fix = line(text, "replicas")
    assert code == 1 and "0 of 2 replicas ready; not ready: no Pod yet" in failing
