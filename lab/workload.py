"""What the deployment controller and the kubelet write for the module's Deployment, on a real kube-apiserver.

A lab cluster on the real backend stores the chart's Deployment `d8-peering/peering`, but nothing runs it: the lab
runs the peering processes beside the API (lab/cluster.py `Replica`). `DeploymentPlayer` writes what a cluster
shows of them, from the replicas' states, so that the objects say what runs:

| replica | its Pod (named by the replica's Lease identity, as a Pod's name is) |
|---|---|
| not started | none |
| ready (its `/readyz` answered) | Running, Ready, every container running; `restartCount` the times it came back |
| exited or killed (SIGKILL) | not Ready, every container terminated with the exit code (128 + signal), reason Error |
| stopped cleanly (SIGTERM) | deleted, as a Pod that was terminated and not (yet) replaced |

and the Deployment's `status` (replicas, updated, ready, available, unavailable and the Available condition)
counted from those Pods. The Pods have the Deployment template's labels and spec; no scheduler and no kubelet run,
so they have no node (and no PodScheduled condition). Nothing else is played: no ReplicaSet, no restart on its own (a replica starts again when
the lab is told to), no CrashLoopBackOff.

The emulator serves no Deployments or Pods: there the lab writes nothing of this (`peering check` then judges the
replicas by the Lease, and says so).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import logging
import signal
from typing import Any, Iterable

from lab.apiserver.errors import ApiError

log = logging.getLogger(__name__)

DEPLOYMENT = "peering"
PLAYED_BY = "lab.deckhouse.io/played-by"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def exit_code(returncode: int | None) -> int:
    """A container's exit code as the kubelet reports it: 128 + the signal for a process a signal ended."""
    if returncode is None:
        return 0
    return 128 - returncode if returncode < 0 else returncode


class DeploymentPlayer:
    """Writes the Pods of `replicas` and the Deployment's status; `publish` after every change of a replica."""

    def __init__(self, api: Any, namespace: str, *, cluster: str) -> None:
        self.api = api
        self.namespace = namespace
        self.cluster = cluster
        self._lock = asyncio.Lock()
        self._restarts: dict[str, int] = {}
        self._running: dict[str, bool] = {}

    def served(self) -> bool:
        return self.api.registry.by_kind("apps/v1", "Deployment") is not None

    async def publish(self, replicas: Iterable[Any]) -> None:
        """Bring the Pods and the Deployment's status to what `replicas` are now; the writes are made one after
        another in a thread (the API client is synchronous), never two publications at once."""
        states = [(r.identity, pod_state(r), r.returncode) for r in replicas]
        async with self._lock:
            try:
                await asyncio.to_thread(self._publish, states)
            except (ApiError, OSError) as e:
                # The kubelet would retry; the lab says it and the next change writes everything again.
                log.warning("cluster %s: the Pods of the Deployment %s/%s could not be written: %s", self.cluster,
                            self.namespace, DEPLOYMENT, e)

    def _publish(self, states: list[tuple[str, str | None, int | None]]) -> None:
        deployment = self.api.get("apps", "deployments", DEPLOYMENT, self.namespace)
        if deployment is None:
            return
        for identity, state, returncode in states:
            if state is not None:
                self._pod(deployment, identity, state, returncode)
        self._status(deployment)

    def _pod(self, deployment: dict, name: str, state: str, returncode: int | None) -> None:
        pod = self.api.get("", "pods", name, self.namespace)
        if state == "absent":
            if pod is not None:
                self.api.delete("", "pods", name, self.namespace)
            self._running.pop(name, None)
            return
        if pod is None:
            if state != "running":
                return
            template = copy.deepcopy(deployment["spec"]["template"])
            self._priority_class(template["spec"].get("priorityClassName"))
            pod = self.api.create({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace, "labels": template["metadata"]["labels"],
                             "annotations": {PLAYED_BY: "the lab: a peering process of cluster "
                                                        f"{self.cluster} runs beside the API"}},
                "spec": template["spec"]})
            self._restarts[name] = 0
        elif state == "running" and not self._running.get(name, False):
            # The same Pod's container started again.
            self._restarts[name] = self._restarts.get(name, 0) + 1
        self._running[name] = state == "running"
        pod["status"] = pod_status(pod, running=state == "running", restarts=self._restarts.get(name, 0),
                                   exit_code=exit_code(returncode))
        self.api.update(pod, subresource="status")

    def _priority_class(self, name: str | None) -> None:
        """The PriorityClass the template names: one of those every Deckhouse cluster has (the Priority admission
        plugin refuses a Pod naming a class that does not exist); its value is the lab's own."""
        if not name or self.api.get("scheduling.k8s.io", "priorityclasses", name) is not None:
            return
        try:
            self.api.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                             "metadata": {"name": name}, "value": 4000})
        except ApiError as e:
            if e.code != 409:
                raise

    def _status(self, deployment: dict) -> None:
        pods = [p for p in self.api.list("", "pods", self.namespace)
                if (p["metadata"].get("annotations") or {}).get(PLAYED_BY)]
        ready = sum(1 for p in pods if _ready(p))
        desired = (deployment.get("spec") or {}).get("replicas", 1)
        status: dict = {"observedGeneration": deployment["metadata"]["generation"], "replicas": len(pods),
                        "updatedReplicas": len(pods), "readyReplicas": ready, "availableReplicas": ready}
        if desired > ready:
            status["unavailableReplicas"] = desired - ready
        available = ready >= desired
        old = {c.get("type"): c for c in (deployment.get("status") or {}).get("conditions") or []}
        was = old.get("Available") or {}
        changed = was.get("status") != ("True" if available else "False")
        status["conditions"] = [{
            "type": "Available", "status": "True" if available else "False",
            "reason": "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
            "message": "Deployment has minimum availability." if available else
                       "Deployment does not have minimum availability.",
            "lastUpdateTime": _now() if changed else was.get("lastUpdateTime", _now()),
            "lastTransitionTime": _now() if changed else was.get("lastTransitionTime", _now())}]
        if deployment.get("status") == status:
            return
        deployment["status"] = status
        self.api.update(deployment, subresource="status")


def _ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def pod_state(replica: Any) -> str | None:
    """What the Pod of `replica` is to show: "running", "terminated", "absent", or None (unchanged: starting)."""
    state = replica.state
    if state == "running":
        alive = replica.process is not None and replica.process.returncode is None
        return "running" if alive else "terminated"
    if state == "not started":
        return "absent"
    if state.startswith("stopped"):
        return "terminated" if replica.stopped_by == signal.SIGKILL else "absent"
    if state.startswith("exited"):
        return "terminated"
    return None


def pod_status(pod: dict, *, running: bool, restarts: int, exit_code: int) -> dict:
    now = _now()
    ready = "True" if running else "False"
    containers = []
    for c in pod["spec"]["containers"]:
        state = {"running": {"startedAt": now}} if running else {
            "terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                           "finishedAt": now}}
        containers.append({"name": c["name"], "ready": running, "started": running, "restartCount": restarts,
                           "image": c["image"], "imageID": "", "state": state})
    # restartPolicy Always: a Pod whose container ended stays Running, waiting for the kubelet to start it again.
    return {"phase": "Running",
            "conditions": [{"type": t, "status": s, "lastTransitionTime": now}
                           for t, s in (("Initialized", "True"), ("ContainersReady", ready), ("Ready", ready))],
            "containerStatuses": containers}
