"""Helpers of the two-cluster tests: a lab whose peering processes sync fast, and bounded polls on its objects."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import time
from typing import Any, AsyncIterator, Callable

from control.events import REPORTING_CONTROLLER
from lab.cluster import default_peering_command
from lab.testing import lab_clusters

GROUP = "peering.deckhouse.io"
API_VERSION = f"{GROUP}/v1alpha1"
FAST = ["--peer-sync-interval", "1", "--selfcheck-interval", "1", "--issuer-refresh-interval", "1"]


def fast_peering_command(cluster) -> list[str] | None:
    cmd = default_peering_command(cluster)
    return None if cmd is None else cmd + FAST


async def until(fn: Callable[[], Any], *, timeout: float = 15.0, what: str = "condition") -> Any:
    """Poll `fn` (every 50 ms) until it returns something truthy; fail with `what` and the last value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


async def until_equal(fn: Callable[[], Any], expected: Any, *, timeout: float = 15.0, what: str = "") -> None:
    """Poll until `fn()` equals `expected`; the failure shows the last value seen."""
    seen: list = [None]

    def check() -> bool:
        seen[0] = fn()
        return seen[0] == expected
    try:
        await until(check, timeout=timeout, what=what or repr(expected))
    except AssertionError:
        raise AssertionError(f"timed out after {timeout}s waiting for {what or expected!r}; last value: "
                             f"{seen[0]!r}") from None


def ready_message(obj: dict | None) -> str:
    return condition(obj, "Ready").get("message", "")


def clusterpeer(cluster, name: str) -> dict | None:
    return cluster.api.get(GROUP, "clusterpeers", name)


def condition(obj: dict | None, type_: str) -> dict:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return {}


def ready(obj: dict | None) -> tuple[str, str, str]:
    """(phase, Ready status, Ready reason)."""
    c = condition(obj, "Ready")
    return (((obj or {}).get("status") or {}).get("phase", ""), c.get("status", ""), c.get("reason", ""))


def warning_events(cluster) -> list[tuple[str, str, str]]:
    """(object, reason, message) of every Warning Event the module reported on `cluster`, in every namespace
    (kube-apiserver's own controllers report on the lab's objects too)."""
    return [((e.get("regarding") or {}).get("name", ""), e.get("reason", ""), e.get("note", ""))
            for e in cluster.api.list("events.k8s.io", "events")
            if e.get("type") == "Warning" and e.get("reportingController") == REPORTING_CONTROLLER]


def create_invite(cluster, name: str, **invite: Any) -> dict:
    spec: dict = {"type": "Invite"}
    if invite:
        spec["invite"] = invite
    return cluster.api.create({"apiVersion": API_VERSION, "kind": "ClusterPeer", "metadata": {"name": name},
                               "spec": spec})


def create_join(cluster, name: str, connection_string: str, **join: Any) -> dict:
    return cluster.api.create({"apiVersion": API_VERSION, "kind": "ClusterPeer", "metadata": {"name": name},
                               "spec": {"type": "Join", "join": {"connectionString": connection_string, **join}}})


async def connection_string(cluster, name: str) -> str:
    return await until(lambda: ((clusterpeer(cluster, name) or {}).get("status") or {}).get("invite", {})
                       .get("connectionString"), what=f"status.invite of {name}")


def create_capability(cluster, name: str, *, namespace: str = "consumer", account: str = "app",
                      verbs: tuple[str, ...] = ("get", "list")) -> dict:
    """A module's PeeringCapability `name`: its consumer, ServiceAccount `account` (created, with its namespace
    `namespace`), may use `verbs` on ConfigMaps of the paired projects."""
    api = cluster.api
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    api.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}})
    return api.create({"apiVersion": API_VERSION, "kind": "PeeringCapability", "metadata": {"name": name},
                       "spec": {"version": "v1",
                                "consumers": [{"kind": "ServiceAccount", "namespace": namespace, "name": account}],
                                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": list(verbs)}]}})


def create_project_with_prices(cluster, project: str) -> None:
    """Project `project` as multitenancy-manager leaves it, holding ConfigMap `prices` that names the cluster."""
    cluster.create_project(project)
    cluster.api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "prices", "namespace": project},
                        "data": {"cluster": cluster.name}})


async def invite_join_and_open(a, b, capability: str) -> None:
    """a invites b (ClusterPeer `to-b`), b joins with the string (`to-a`), and both open `capability`."""
    create_invite(a, "to-b")
    create_join(b, "to-a", await connection_string(a, "to-b"))
    for cluster, name in ((a, "to-b"), (b, "to-a")):
        obj = await until(lambda: clusterpeer(cluster, name), what=name)
        obj["spec"]["capabilities"] = [capability]
        cluster.api.update(obj)


async def peer_with_capability(a, b, capability: str, *, wait: bool = True, timeout: float = 30.0,
                               **consumer: Any) -> None:
    """The guide's first steps on clusters `a` and `b`: both install the module's PeeringCapability `capability`
    (`create_capability`, `consumer` its keywords), then `invite_join_and_open`. With `wait`, until both
    ClusterPeers are Active, Ready (PeeringReady) and list the capability as effective."""
    for cluster in (a, b):
        create_capability(cluster, capability, **consumer)
    await invite_join_and_open(a, b, capability)
    if not wait:
        return
    for cluster, name in ((a, "to-b"), (b, "to-a")):
        await until_equal(lambda: ready(clusterpeer(cluster, name)), ("Active", "True", "PeeringReady"),
                          timeout=timeout, what=f"{cluster.name}'s ClusterPeer {name} Active and Ready")
        await until_equal(lambda: clusterpeer(cluster, name)["status"].get("effectiveCapabilities"), [capability],
                          what=f"{capability} effective on {cluster.name}'s ClusterPeer {name}")


@contextlib.asynccontextmanager
async def peered_lab(dir: pathlib.Path, capability: str, project: str, *, apiserver: str = "emulator",
                     wait: bool = True, **consumer: Any) -> AsyncIterator[Any]:
    """Lab clusters a and b whose peering processes sync fast, each with project `project` and its ConfigMap
    `prices` (`create_project_with_prices`), peered with `capability` open (`peer_with_capability`)."""
    async with lab_clusters(dir, ["a", "b"], peering_command=fast_peering_command, apiserver=apiserver) as lab:
        for name in ("a", "b"):
            create_project_with_prices(lab[name], project)
        await peer_with_capability(lab["a"], lab["b"], capability, wait=wait, **consumer)
        yield lab


class WriteCounter:
    """Counts the writes (create, update incl. patch and status, delete) the API server of a cluster accepts, by
    resource (`"update clusterpeers"`), leaving out Leases (the leader renews its Lease by design); it sees writes
    from every client, the lab's stand-ins too (user-authn's statuses; on the real backend the Pods that
    lab/workload.py writes when a replica starts or stops). `counts.clear()` starts counting afresh; `close()` stops.

    On the emulator it wraps the object store in place. On a real kube-apiserver it reads the server's own
    /metrics, `apiserver_request_total` of successful POST/PUT/PATCH/DELETE requests (dry runs left out), and
    counts the difference from when it started or was cleared: the server counts every request it answered,
    from any client, with no configuration (an audit log would need kube-apiserver restarted with a policy)."""

    def __init__(self, cluster) -> None:
        self._api = cluster.api
        self._counts: dict[str, int] = {}
        self._saved = {}
        if getattr(self._api, "backend", "emulator") == "real":
            self._baseline = self._metrics()
            return
        self.objects = cluster.api.objects
        for method in ("create", "update", "delete"):
            original = getattr(self.objects, method)
            self._saved[method] = original
            setattr(self.objects, method, self._wrap(method, original))

    _VERBS = {"POST": "create", "PUT": "update", "PATCH": "update", "DELETE": "delete", "DELETECOLLECTION": "delete"}

    def _metrics(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, n in self._api.write_counts().items():
            verb, resource = key.split(" ", 1)
            plural = resource.split("/", 1)[0]
            if plural == "leases" or not plural:
                continue
            name = f"{self._VERBS[verb]} {plural}"
            out[name] = out.get(name, 0) + n
        return out

    def _wrap(self, method: str, original):
        def counted(info, *args, **kwargs):
            result = original(info, *args, **kwargs)
            if info.plural != "leases" and not kwargs.get("dry_run"):
                key = f"{method} {info.plural}"
                self._counts[key] = self._counts.get(key, 0) + 1
            return result
        return counted

    @property
    def counts(self) -> "_Counts":
        if not hasattr(self, "_baseline"):
            return _Counts(self._counts, self._counts.clear)
        now = self._metrics()
        diff = {k: n - self._baseline.get(k, 0) for k, n in now.items() if n - self._baseline.get(k, 0)}

        def clear() -> None:
            self._baseline = now if not diff else self._metrics()
        return _Counts(diff, clear)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def close(self) -> None:
        for method, original in self._saved.items():
            setattr(self.objects, method, original)


class _Counts(dict):
    """The counts seen; `clear()` starts counting again from now."""

    def __init__(self, counts: dict[str, int], reset) -> None:
        super().__init__(counts)
        self._reset = reset

    def clear(self) -> None:
        super().clear()
        self._reset()
