"""A lab cluster on loopback: API server, Dex, user-authn, ingress, and the real peering process.

The API server is the emulator (lab/apiserver/, in this process, the default) or, with `apiserver="real"`, a real
etcd + kube-apiserver + kube-controller-manager (lab/real/), whose `cluster.api` is lab/real/api.py's `HttpApi`:
the emulator's in-process calls over HTTP. Everything else is the same on both.

A cluster `c` has the public domain template `%s.c.lab`. Every listener binds 127.0.0.1 with a port the OS
chooses; the names resolve through the lab's resolver map (`resolve_map()`), so TLS host names are real:

| name | what answers |
|---|---|
| `api.c.lab` | the API server (also reachable as 127.0.0.1, which its certificate names too) |
| `dex.c.lab` | the Dex stand-in, issuer `https://dex.c.lab/` (with the slash, as Deckhouse's) |
| `peering.c.lab` | the ingress-nginx stand-in, TLS by the lab's public CA, to the peering process's join listener |
| `peering-gateway.c.lab` | a TCP passthrough (the LoadBalancer) to the peering process's entrance |
| `peering-gateway.d8-peering.svc` | a TCP passthrough (the Service) to the egress; per cluster, so only in its own map |

Every cluster signs its ServiceAccount tokens with its own key under the same issuer URL,
`https://kubernetes.default.svc.cluster.local`, as every default Deckhouse cluster does: nothing may tell
clusters apart by issuer.

The passthroughs and the ingress listen before the peering process starts, so every cluster's resolver map is
complete before any peering process needs it, whatever order the clusters start in.

Files under `DIR/<c>/`: `kubeconfig` (cluster-admin by client certificate, usable by kubectl as is),
`peering-kubeconfig` (ServiceAccount d8-peering/peering, bearer token), `public-ca.crt`, `client-ca.crt`,
`ports.json` (written by the peering process), `peering.log`.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import os
import pathlib
import secrets
import shutil
import signal
import sys
import uuid
from typing import Any, Callable, Mapping

import aiohttp
import yaml

from lab import certs, multitenancy
from lab.certs import check_cluster_name, kubeconfig
from lab.dex import Dex
from lab.ingress import Ingress, TcpPassthrough
from lab.module_manager import GROUP as DECKHOUSE_GROUP, PEERING, USER_AUTHN, ModuleManager
from lab.userauthn import UserAuthn
from lab.userauthn_module import MODULE_DEX_CLIENT_ID, MODULE_DEX_CLIENT_SECRET_NAME
from lab.workload import DeploymentPlayer

log = logging.getLogger(__name__)

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULE_CRDS = ROOT / "charts" / "peering" / "crds"
CHART = ROOT / "charts" / "peering"
LAB_CRDS = pathlib.Path(__file__).resolve().parent / "apiserver" / "crds"
NAMESPACE = "d8-peering"
# The CRDs of Deckhouse's module manager (lab/module_manager.py), which no lab cluster starts without.
MODULE_MANAGER_CRDS = ("moduleconfigs.deckhouse.io", "modules.deckhouse.io")
EGRESS_HOST = "peering-gateway.d8-peering.svc"
# The module's Dex client, as user-authn makes it from the chart's DexClient `peering` (lab/userauthn_module.py).
DEX_CLIENT_ID = MODULE_DEX_CLIENT_ID
DEX_CLIENT_SECRET_NAME = MODULE_DEX_CLIENT_SECRET_NAME
# Every default Deckhouse cluster's ServiceAccount issuer, so every lab cluster's (each with its own key).
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# The modules a lab cluster has enabled besides those its module manager keeps (user-authn and peering), as
# global.enabledModules says: cert-manager (the https mode) and multitenancy-manager (Projects). No monitoring or VPA
# modules, so none of their objects are rendered.
OTHER_MODULES = ("cert-manager", "multitenancy-manager")
READY_TIMEOUT = 90.0
# What answers as a lab cluster's API server: the emulator (lab/apiserver/, in this process, the fast default) or a
# real etcd + kube-apiserver + kube-controller-manager (lab/real/, processes; `cluster.api` is then lab/real/api.py).
APISERVERS = ("emulator", "real")

PeeringCommand = Callable[["LabCluster"], "list[str] | None"]
# The chart runs 2; a lab cluster may run a few more to test spreading, not a fleet.
MAX_REPLICAS = 8


@dataclasses.dataclass
class Replica:
    """One peering process of a cluster: a replica of the module's Deployment."""

    index: int
    identity: str
    """Its Lease holder identity (its Pod's name)."""
    ports_file: pathlib.Path
    log: pathlib.Path
    process: asyncio.subprocess.Process | None = None
    ports: dict[str, int] = dataclasses.field(default_factory=dict)
    state: str = "not started"
    watcher: asyncio.Task | None = None
    returncode: int | None = None
    """How its last process ended (None while it runs, or before it first ran)."""
    stopped_by: int | None = None
    """The signal `stop_replica` sent it last (None: it was not stopped by the lab)."""

    def info(self) -> dict:
        return {"index": self.index, "identity": self.identity, "state": self.state,
                "pid": self.process.pid if self.process else None, "ports": self.ports, "log": str(self.log)}


def peering_executable() -> list[str] | None:
    """How to run the `peering` console script here, or None while `control/cli.py` does not exist."""
    script = pathlib.Path(sys.executable).with_name("peering")
    if script.exists():
        return [str(script)]
    if (ROOT / "control" / "cli.py").exists():
        return [sys.executable, "-m", "control.cli"]
    return None


def default_peering_command(cluster: "LabCluster") -> list[str] | None:
    """The real peering process for `cluster`, with its listeners on loopback and the lab's resolver map."""
    exe = peering_executable()
    if exe is None:
        return None
    c = cluster.name
    cmd = exe + [
        "run",
        "--kubeconfig", str(cluster.path("peering-kubeconfig")),
        "--namespace", NAMESPACE,
        "--public-domain-template", f"%s.{c}.lab",
        "--bind-host", "127.0.0.1",
        "--entrance-port", "0", "--join-port", "0", "--egress-port", "0", "--ops-port", "0",
        "--ports-file", str(cluster.path("ports.json")),
        "--dex-url", cluster.dex_issuer,
        "--dex-ca-file", str(cluster.path("public-ca.crt")),
        "--identity", f"lab-{c}",
    ]
    for host, target in sorted(cluster.process_resolve().items()):
        cmd += ["--resolve", f"{host}={target}"]
    return cmd


def _write(path: pathlib.Path, data: bytes | str, mode: int = 0o600) -> None:
    """Write atomically with restrictive permissions: these files hold keys and tokens."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def _ignore_exists(call: Callable[[], Any]) -> Any:
    from lab.apiserver.errors import ApiError

    try:
        return call()
    except ApiError as e:
        if e.code != 409:
            raise
        return None


def known_crds() -> list[str]:
    """The CRDs a lab cluster installs at start: the lab's (Project, TokenExchangeProvider, ModuleConfig, Module) and
    the module's."""
    names = []
    for path in sorted(LAB_CRDS.glob("*.yaml")) + sorted(MODULE_CRDS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                names.append(doc["metadata"]["name"])
    return names


def check_crd_names(names) -> list[str]:
    """The names as a list, each one a CRD the lab installs; ValueError naming the unknown ones otherwise."""
    names = list(names)
    known = known_crds()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown CRD {', '.join(unknown)}: name a CRD the lab installs, one of {', '.join(known)}")
    kept = [n for n in names if n in MODULE_MANAGER_CRDS]
    if kept:
        raise ValueError(f"CRD {', '.join(kept)} is Deckhouse's own, which its module manager needs (every Deckhouse "
                         "cluster has it): leave out another")
    return names


def crd_documents() -> dict[str, dict]:
    """Every CRD a lab cluster knows, by name: the lab's (lab/apiserver/crds/), then the module's."""
    docs: dict[str, dict] = {}
    for path in sorted(LAB_CRDS.glob("*.yaml")) + sorted(MODULE_CRDS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                docs[doc["metadata"]["name"]] = doc
    return docs


def check_apiserver(apiserver: str) -> str:
    if apiserver not in APISERVERS:
        raise ValueError(f"apiserver {apiserver!r}: choose one of {', '.join(APISERVERS)} (emulator is the in-process "
                         "default; real runs etcd and kube-apiserver, built by `python -m lab.real build`)")
    return apiserver


class LabCluster:
    """One lab cluster. `start()` starts it alone; `Lab` starts several that know each other's names."""

    def __init__(self, name: str, dir: os.PathLike | str, *, peering_command: PeeringCommand | None = default_peering_command,
                 ready_timeout: float = READY_TIMEOUT, without_crds=(), apiserver: str = "emulator",
                 api_front: bool = False, replicas: int = 1, module_enabled: bool = True) -> None:
        check_cluster_name(name)
        self.apiserver = check_apiserver(apiserver)
        # On the real backend: the peering process reaches kube-apiserver through lab/apifront.py, so that a test
        # can replace the keys the cluster publishes (`api.sa_issuer.jwks = ...`), as on the emulator.
        self.api_front = api_front
        self.front: Any = None
        # CRDs this cluster starts without (e.g. projects.deckhouse.io: no multitenancy-manager); install_crd adds
        # one later.
        self.without_crds = check_crd_names(without_crds)
        self.ready_timeout = ready_timeout
        self.name = name
        self.dir = pathlib.Path(dir)
        self.peering_command = peering_command
        self.pki = certs.cluster_pki(name)
        self.uuid = str(uuid.uuid4())
        # As Deckhouse's Dex: the issuer ends with a slash (its `iss` must match kube-apiserver's issuer URL exactly).
        self.dex_issuer = f"https://dex.{name}.lab/"
        self.public_domain_template = f"%s.{name}.lab"
        self.dex_client_secret = secrets.token_urlsafe(32)
        # Whether the cluster starts with ModuleConfig peering enabling the module (the guide's step, done before);
        # without, the module is enabled as the guide says, with a ModuleConfig.
        self.module_enabled = module_enabled
        self.modules: ModuleManager | None = None
        # The module's ServiceAccount token for its process, once the module manager installed it.
        self._peering_token: str | None = None
        self._controllers_started = False
        self.api: Any = None
        # The real backend's processes (lab.real.RealControlPlane); None on the emulator.
        self.control_plane: Any = None
        self.dex: Dex | None = None
        self.userauthn: UserAuthn | None = None
        self.ingress: Ingress | None = None
        self.entrance_lb: TcpPassthrough | None = None
        self.egress_svc: TcpPassthrough | None = None
        if not isinstance(replicas, int) or isinstance(replicas, bool) or not 1 <= replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas {replicas!r}: give a whole number of peering processes from 1 to "
                             f"{MAX_REPLICAS} (the chart runs 2)")
        # One process per replica of the Deployment, each with its own identity, ports and log; the first keeps
        # the names of a single replica (`lab-<c>`, ports.json, peering.log).
        self.replicas = [Replica(i, f"lab-{name}" if replicas == 1 else f"lab-{name}-{i}",
                                 self.path("ports.json" if i == 0 else f"ports-{i}.json"),
                                 self.path("peering.log" if i == 0 else f"peering-{i}.log"))
                         for i in range(replicas)]
        self.peering_state = "not started"
        self._peering_base: list[str] | None = None
        # On the real backend: the Pods of the module's Deployment and its status, from the replicas (lab/workload.py).
        self.workload: Any = None
        # What this cluster's clients must resolve and trust: its own names until `Lab` adds the others'.
        self.resolve: dict[str, str] = {}
        self.trusted_ca_pems: list[bytes] = []
        self._services_started = False

    def path(self, name: str) -> pathlib.Path:
        return self.dir / self.name / name

    # --- names ---

    def resolve_map(self) -> dict[str, str]:
        """This cluster's public names and its own egress Service name, to 127.0.0.1:<port>."""
        assert self._services_started, "start the cluster's services first"
        return {
            certs.api_host(self.name): f"127.0.0.1:{self.api.port}",
            certs.dex_host(self.name): f"127.0.0.1:{self.dex.port}",
            certs.join_host(self.name): f"127.0.0.1:{self.ingress.port}",
            certs.entrance_host(self.name): f"127.0.0.1:{self.entrance_lb.port}",
            EGRESS_HOST: f"127.0.0.1:{self.egress_svc.port}",
        }

    def public_resolve_map(self) -> dict[str, str]:
        """The names other clusters may reach: all but the in-cluster Service."""
        return {h: t for h, t in self.resolve_map().items() if h != EGRESS_HOST}

    def process_resolve(self) -> dict[str, str]:
        return {**self.resolve, **self.resolve_map()}

    # --- lifecycle ---

    async def start(self) -> None:
        """Start this cluster alone: services, user-authn, and the peering process when there is one."""
        await self.start_services()
        self.resolve = self.resolve_map()
        self.trusted_ca_pems = [self.pki.public_ca.cert_pem]
        await self.start_controllers()

    async def start_services(self) -> None:
        """API server (seeded), Dex, ingress and passthroughs; nothing that needs other clusters' names."""
        self.path(".").mkdir(parents=True, exist_ok=True)
        try:
            await self._start_services()
        except BaseException:
            await self.stop()
            raise
        self._services_started = True
        self._write_files()

    async def _start_services(self) -> None:
        if self.apiserver == "real":
            await self._start_real_services()
            return
        from lab.apiserver.app import ApiServer

        # The emulator always loads its own lab CRDs (lab/apiserver/crds/); the module's come from the chart.
        crds = sorted(MODULE_CRDS.glob("*.yaml"))
        self.api = ApiServer(
            name=self.name, crd_paths=crds, serving_cert_pem=self.pki.api.cert_pem,
            serving_key_pem=self.pki.api.key_pem, client_ca_pem=self.pki.client_ca.cert_pem,
            issuer_url=SERVICE_ACCOUNT_ISSUER, without_crds=self.without_crds,
        )
        await self.api.start("127.0.0.1", 0)
        await self._start_dex()
        await self._start_balancers()
        self.api.add_oidc(self._dex_authenticator())
        await self.seed()

    async def _start_dex(self) -> None:
        # Its clients are user-authn's to make (lab/userauthn_module.py), once the module manager runs.
        self.dex = Dex(self.dex_issuer, certs.server_ssl_context(self.pki.dex))
        await self.dex.start()

    async def _start_balancers(self) -> None:
        self.ingress = Ingress(certs.join_host(self.name), certs.server_ssl_context(self.pki.ingress))
        await self.ingress.start()
        self.entrance_lb = TcpPassthrough(certs.entrance_host(self.name))
        await self.entrance_lb.start()
        self.egress_svc = TcpPassthrough(EGRESS_HOST)
        await self.egress_svc.start()

    async def _start_real_services(self) -> None:
        """etcd, kube-apiserver and kube-controller-manager configured as lab/real does (Deckhouse's
        AuthenticationConfiguration toward this cluster's Dex, which therefore starts first: kube-apiserver reads
        its discovery document at start and retries only every 10 s), the lab's CRDs through the real validation
        (Deckhouse's x-kubernetes-sensitive-data stripped: a stock kube-apiserver refuses it), then the seed."""
        from lab.real.api import HttpApi
        from lab.real import JWTIssuer, RealControlPlane

        await self._start_dex()
        # A lab cluster starts new each time: nothing of an earlier run in the same directory (etcd's data, the
        # ServiceAccount key) is kept, as the emulator keeps nothing.
        await asyncio.to_thread(shutil.rmtree, self.path("control-plane"), True)
        self.control_plane = RealControlPlane(
            self.name, self.path("control-plane"), pki=self.pki,
            jwt_issuer=JWTIssuer(self.dex_issuer, self.pki.public_ca.cert_pem),
            resolve={certs.dex_host(self.name): f"127.0.0.1:{self.dex.port}"})
        docs = crd_documents()
        await self.control_plane.start(crds=[doc for name, doc in docs.items() if name not in self.without_crds])
        self.api = HttpApi(self.name, self.control_plane.admin_kubeconfig, crd_documents=docs)
        if self.api_front:
            from lab.apifront import ApiFront

            self.front = ApiFront(self.api, self.control_plane.url, certs.client_ssl_context(self.pki.public_ca.cert_pem),
                                  certs.server_ssl_context(self.pki.api))
            await self.front.start()
            self.api.front = self.front
        await self._start_balancers()
        await self.seed()

    def _dex_authenticator(self) -> Any:
        """kube-apiserver's `jwt` authenticator for Dex as Deckhouse's AuthenticationConfiguration renders it:
        audience `kubernetes`, username from `email` and groups from `groups` without prefixes, extras from
        `claims.name` (required), `preferred_username` and the connector id, and no `system:` user or group.

        The API server reaches Dex by its name, which resolves to Dex's loopback port, and trusts the public CA.
        """
        from gateway.resolve import OverrideResolver
        from lab.apiserver.auth.oidc import deckhouse_dex_authenticator

        resolver = OverrideResolver({certs.dex_host(self.name): f"127.0.0.1:{self.dex.port}"})
        return deckhouse_dex_authenticator(self.dex_issuer, ca_pem=self.pki.public_ca.cert_pem, resolver=resolver)

    # --- APIs that come and go ---

    def install_crd(self, name: str) -> dict:
        """Install a CRD the cluster started without (or that was deleted) while everything runs, as applying
        it with kubectl would: discovery serves it at once and user-authn starts serving providers."""
        obj = self.api.install_crd(name)
        if name in self.without_crds:
            self.without_crds.remove(name)
        return obj

    # --- multitenancy (lab/multitenancy.py) ---

    def create_project(self, name: str, spec: dict | None = None) -> dict:
        """Project `name` and its main namespace, as multitenancy-manager leaves them."""
        return multitenancy.create_project(self.api, name, spec)

    def add_project_namespace(self, project: str, suffix: str) -> str:
        """Namespace `<project>-<suffix>`, Additional in the Project's status, as a ProjectNamespace makes it."""
        return multitenancy.add_project_namespace(self.api, project, suffix)

    async def start_controllers(self) -> None:
        """user-authn, then the module manager's processes (the peering process), with `self.resolve` and
        `self.trusted_ca_pems` complete."""
        self._write_trust()
        self._controllers_started = True
        if USER_AUTHN in self.modules.enabled:
            await self.user_authn_up()
        await self.modules.run()
        if self.peering_state == "not started":
            self.peering_state = "not running: the peering module is disabled (ModuleConfig peering)"

    # --- what the module manager does to the cluster (lab/module_manager.py) ---

    async def user_authn_up(self) -> None:
        """user-authn enabled: Dex answers, and its controller serves TokenExchangeProviders once it may start."""
        if not self.dex.running:
            await self.dex.start()
        if self._controllers_started and self.userauthn is None:
            ctx = certs.client_ssl_context(b"".join(self.trusted_ca_pems))
            self.userauthn = UserAuthn(self.api, self.dex, ssl_context=ctx, resolve=self.process_resolve())
            await self.userauthn.start()

    async def user_authn_down(self) -> None:
        """user-authn disabled: its controller stops and Dex goes away (its clients are kept for a re-enable)."""
        if self.userauthn is not None:
            await self.userauthn.stop()
            self.userauthn = None
        await self.dex.stop()

    def peering_token(self, token: str) -> None:
        """The module's ServiceAccount token, which its process runs with (`peering-kubeconfig`)."""
        self._peering_token = token
        if self._services_started:
            self._write_files()

    async def peering_up(self) -> None:
        """The module's "Deployment": its processes start, once the cluster may start them."""
        if self._controllers_started:
            await self.start_peering()

    async def peering_down(self) -> None:
        await self.stop_peering()
        self.peering_state = "not running: the peering module is disabled"

    async def start_peering(self) -> None:
        """Start every replica of the peering process (`replicas`), concurrently; each joins the balancers once its
        `/readyz` answers."""
        if self.peering_command is None:
            self.peering_state = "disabled"
            return
        base = self.peering_command(self)
        if base is None:
            self.peering_state = "absent: control/cli.py with `peering run` does not exist yet"
            log.info("cluster %s: no peering process (%s)", self.name, self.peering_state)
            return
        # Asked once per start (a test's command may set things up as it is asked); every replica runs it.
        self._peering_base = base
        self.peering_state = "starting"
        await _all(self.start_replica(r.index) for r in self.replicas)
        self.peering_state = "running"
        self._write_files()

    def replica_command(self, index: int) -> list[str] | None:
        """The command of replica `index`: the peering command of the last `start_peering`, with, when there are
        several replicas, the replica's own ports file and Lease identity (later flags win in `peering run`)."""
        cmd = self._peering_base
        if cmd is None or len(self.replicas) == 1:
            return cmd
        replica = self.replicas[index]
        return cmd + ["--ports-file", str(replica.ports_file), "--identity", replica.identity]

    async def start_replica(self, index: int) -> None:
        """Start (or start again) replica `index`; returns once it is ready and behind the balancers."""
        replica = self.replicas[index]
        if replica.process is not None and replica.process.returncode is None:
            raise RuntimeError(f"cluster {self.name}: replica {index} ({replica.identity}) already runs; stop it first")
        cmd = self.replica_command(index)
        if cmd is None:
            raise RuntimeError(f"cluster {self.name}: replica {index} cannot start before the peering process was "
                               "started once (start_peering), or without a peering command")
        replica.ports_file.unlink(missing_ok=True)
        env = {**os.environ, "SSL_CERT_FILE": str(self.path("ca-bundle.crt")), "PYTHONUNBUFFERED": "1"}
        logf = open(replica.log, "ab")
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=logf, stderr=logf, env=env, cwd=str(ROOT),
            )
        finally:
            logf.close()
        replica.process = proc
        replica.state = "starting"
        replica.returncode = replica.stopped_by = None
        try:
            replica.ports = await self._wait_ready(replica, proc)
        except BaseException:
            # The start may be failing because it is being cancelled: the process must still be reaped, so the stop
            # runs as its own task that a second cancellation cannot cut short before the child is waited for.
            stopping = asyncio.ensure_future(self.stop_replica(index))
            try:
                await asyncio.shield(stopping)
            except asyncio.CancelledError:
                await stopping
                raise
            raise
        replica.state = "running"
        # Like the endpoints controller: a replica that exits leaves the Service's endpoints.
        replica.watcher = asyncio.ensure_future(self._watch_exit(replica, proc))
        self._publish_endpoints()
        await self._publish_workload()

    async def _watch_exit(self, replica: "Replica", proc: asyncio.subprocess.Process) -> None:
        await proc.wait()
        exited = replica.process is proc  # not stopped by stop_replica, which publishes the Pods itself
        if exited:
            replica.state = f"exited ({proc.returncode})"
            replica.returncode = proc.returncode
            log.info("cluster %s: replica %d (%s) exited with %s", self.name, replica.index, replica.identity,
                     proc.returncode)
        self._publish_endpoints()
        if exited:
            await self._publish_workload()

    async def _publish_workload(self) -> None:
        """Like the kubelet and the deployment controller: the replicas' Pods and the Deployment's status."""
        if self.workload is not None:
            await self.workload.publish(self.replicas)

    def _publish_endpoints(self) -> None:
        """The balancers send to the replicas that are running (ready, not exited, not being stopped)."""
        live = [r for r in self.replicas if r.state == "running" and r.process is not None
                and r.process.returncode is None]
        if self.ingress is not None:
            self.ingress.set_backends([r.ports["join"] for r in live])
        if self.entrance_lb is not None:
            self.entrance_lb.set_targets([r.ports["entrance"] for r in live])
        if self.egress_svc is not None:
            self.egress_svc.set_targets([r.ports["egress"] for r in live])

    async def _wait_ready(self, replica: "Replica", proc: asyncio.subprocess.Process) -> dict[str, int]:
        # `proc`, not `replica.process`: a concurrent stop clears the attribute while this poll is still running.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout
        ports: dict[str, int] | None = None
        what = f"cluster {self.name}: the peering process" + (f" (replica {replica.index}, {replica.identity})"
                                                               if len(self.replicas) > 1 else "")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while True:
                if proc.returncode is not None:
                    raise RuntimeError(f"{what} exited with {proc.returncode}; "
                                       f"see {replica.log}:\n{self._log_tail(replica.log)}")
                if loop.time() > deadline:
                    raise TimeoutError(f"{what} was not ready within "
                                       f"{self.ready_timeout:.0f}s; see {replica.log}:\n{self._log_tail(replica.log)}")
                if ports is None and replica.ports_file.exists():
                    ports = {k: int(v) for k, v in json.loads(replica.ports_file.read_text()).items()}
                if ports is not None:
                    try:
                        async with http.get(f"http://127.0.0.1:{ports['ops']}/readyz") as r:
                            if r.status == 200:
                                return ports
                    except (aiohttp.ClientError, asyncio.TimeoutError):
                        pass
                # Bounded poll: the process signals nothing else we could wait on.
                await asyncio.sleep(0.1)

    def _log_tail(self, path: pathlib.Path | None = None, lines: int = 20) -> str:
        try:
            return "\n".join((path or self.path("peering.log")).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def stop_replica(self, index: int, sig: int = signal.SIGTERM, timeout: float = 20) -> int | None:
        """Stop replica `index` with `sig` (SIGTERM: a clean stop, which releases the Lease; SIGKILL: a crash) and
        wait for it to exit; its exit code, or None when it was not running.

        With SIGTERM it leaves the balancers first, as a terminating Pod leaves its Service's endpoints; a killed
        one stays in them until its exit is seen, and meanwhile the balancers skip it because it refuses
        connections. A process that ignores SIGTERM for `timeout` seconds is killed."""
        replica = self.replicas[index]
        proc, replica.process = replica.process, None
        watcher, replica.watcher = replica.watcher, None
        if proc is None:
            return None
        if sig != signal.SIGKILL:
            replica.state = "stopping"
            self._publish_endpoints()
        if proc.returncode is None:
            proc.send_signal(sig)
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except asyncio.TimeoutError:
                log.warning("cluster %s: the peering process %s ignored signal %s for %ss; killing it", self.name,
                            replica.identity, sig, timeout)
                proc.kill()
                await proc.wait()
        replica.state = f"stopped (exit {proc.returncode})"
        replica.returncode, replica.stopped_by = proc.returncode, sig
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        self._publish_endpoints()
        await self._publish_workload()
        return proc.returncode

    async def stop_peering(self) -> None:
        """Stop every replica (SIGTERM, concurrently)."""
        if all(r.process is None for r in self.replicas):
            return
        await asyncio.gather(*(self.stop_replica(r.index) for r in self.replicas))
        codes = [r.state.removeprefix("stopped (exit ").rstrip(")") for r in self.replicas]
        self.peering_state = f"stopped (exit {', '.join(codes)})"

    def leader(self) -> "Replica | None":
        """The replica that holds the Lease `d8-peering/peering` now (by its holder identity), or None."""
        lease = self.api.get("coordination.k8s.io", "leases", "peering", NAMESPACE)
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
        return next((r for r in self.replicas if r.identity == holder), None)

    @property
    def process(self) -> asyncio.subprocess.Process | None:
        """The first replica's process (the only one unless `replicas` > 1)."""
        return self.replicas[0].process

    @property
    def ports(self) -> dict[str, int]:
        """The first replica's ports."""
        return self.replicas[0].ports

    async def stop(self) -> None:
        """Stop everything this cluster started, the peering process first, whatever state it is in."""
        await self.stop_peering()
        if self.modules is not None:
            await self.modules.stop()
        if self.userauthn is not None:
            await self.userauthn.stop()
            self.userauthn = None
        for part in (self.egress_svc, self.entrance_lb, self.ingress, self.front):
            if part is not None:
                await part.stop()
        if self.control_plane is not None:
            await self.control_plane.stop()
            if self.api is not None:
                self.api.close()
        elif self.api is not None:
            await self.api.stop()
        if self.dex is not None:
            await self.dex.stop()
        self._services_started = False

    # --- seeding ---

    async def seed(self) -> None:
        """What a fresh Deckhouse cluster holds: its namespaces and UUID, and the module manager with the
        ModuleConfigs global, user-authn (publishAPI on: the guide's preparation) and, unless the cluster starts
        without the module, peering, which the module manager installs from charts/peering. The Deployment's
        processes are the lab's replicas (on the real backend the Deployment is stored, and lab/workload.py writes
        its Pods)."""
        api = self.api
        for ns in ("kube-system", "default"):
            _ignore_exists(lambda ns=ns: api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
        api.create({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "d8-cluster-uuid", "namespace": "kube-system"},
                    "data": {"cluster-uuid": self.uuid}})
        player = DeploymentPlayer(api, NAMESPACE, cluster=self.name)
        self.workload = player if player.served() else None
        self.modules = ModuleManager(self, other_modules=OTHER_MODULES)
        await self.modules.start(self.module_configs())

    def module_configs(self) -> list[dict]:
        """The ModuleConfigs the cluster starts with."""
        def config(name: str, spec: dict) -> dict:
            return {"apiVersion": f"{DECKHOUSE_GROUP}/v1alpha1", "kind": "ModuleConfig", "metadata": {"name": name},
                    "spec": spec}

        https = {"mode": "CertManager", "certManager": {"clusterIssuerName": "letsencrypt"}}
        out = [config("global", {"version": 2, "settings": {"modules": {
                   "publicDomainTemplate": self.public_domain_template, "https": https}}}),
               config(USER_AUTHN, {"enabled": True, "version": 2, "settings": {"publishAPI": {"enabled": True}}})]
        if self.module_enabled:
            out.append(config(PEERING, {"enabled": True}))
        return out

    def kubernetes_version(self) -> str:
        """The Kubernetes version the cluster's API server reports, as Deckhouse puts it in
        global.discovery.kubernetesVersion (what the chart's version-dependent objects follow)."""
        if self.control_plane is not None:
            return self.control_plane.binaries.kube_version.removeprefix("v")
        from lab.apiserver.discovery import KUBE_VERSION

        return KUBE_VERSION["gitVersion"].removeprefix("v")

    # --- files ---

    def _write_trust(self) -> None:
        _write(self.path("ca-bundle.crt"), b"".join(self.trusted_ca_pems), 0o644)

    def _write_files(self) -> None:
        _write(self.path("public-ca.crt"), self.pki.public_ca.cert_pem, 0o644)
        _write(self.path("client-ca.crt"), self.pki.client_ca.cert_pem, 0o644)
        server = f"https://127.0.0.1:{self.api.port}"
        tls_name = certs.api_host(self.name)
        admin = kubeconfig(self.name, server, self.pki.public_ca.cert_pem, tls_name, {
            "client-certificate-data": base64.b64encode(self.pki.admin.cert_pem).decode(),
            "client-key-data": base64.b64encode(self.pki.admin.key_pem).decode(),
        })
        # JSON, which every YAML reader reads the same: Go's YAML 1.1 takes an unquoted cluster name `y`, `n`, `on`
        # or `off` for a boolean, and PyYAML does not quote them.
        _write(self.path("kubeconfig"), json.dumps(admin, indent=2))
        if self._peering_token is not None:
            peering = kubeconfig(self.name, self.front.url if self.front is not None else server,
                                 self.pki.public_ca.cert_pem, tls_name, {"token": self._peering_token})
            _write(self.path("peering-kubeconfig"), json.dumps(peering, indent=2))

    def info(self) -> dict:
        """This cluster's entry in lab.json."""
        return {
            "name": self.name,
            "uuid": self.uuid,
            "apiserver": self.apiserver,
            "publicDomainTemplate": self.public_domain_template,
            "apiServer": f"https://127.0.0.1:{self.api.port}",
            "dexIssuer": self.dex_issuer,
            "dexClientID": DEX_CLIENT_ID,
            "serviceAccountIssuer": SERVICE_ACCOUNT_ISSUER,
            "withoutCRDs": list(self.without_crds),
            "resolve": self.resolve_map(),
            "caBundles": {
                "public": self.pki.public_ca.cert_pem.decode(),
                "client": self.pki.client_ca.cert_pem.decode(),
            },
            "files": {
                "kubeconfig": str(self.path("kubeconfig")),
                "peeringKubeconfig": str(self.path("peering-kubeconfig")),
                "publicCA": str(self.path("public-ca.crt")),
                "clientCA": str(self.path("client-ca.crt")),
                "caBundle": str(self.path("ca-bundle.crt")),
                "peeringLog": str(self.path("peering.log")),
            },
            "controlPlane": self.control_plane.info() if self.control_plane is not None else None,
            "peering": {
                "state": self.peering_state,
                "pid": self.process.pid if self.process else None,
                "ports": self.ports,
                "replicas": [r.info() for r in self.replicas],
            },
        }


async def _all(coros) -> None:
    """Run concurrently; on the first failure cancel the others, wait for them, and raise that failure."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        if not t.cancelled() and t.exception() is not None:
            raise t.exception()


class Lab:
    """Several lab clusters that resolve and trust each other's public names."""

    def __init__(self, dir: os.PathLike | str, names: list[str], *, peering_command: PeeringCommand | None = default_peering_command,
                 ready_timeout: float = READY_TIMEOUT, without_crds=(), apiserver: str = "emulator",
                 api_front: bool = False, replicas: int = 1, module_enabled: bool = True) -> None:
        """without_crds: CRD names every cluster starts without, or a mapping of cluster name to such names.
        apiserver: "emulator" (in this process) or "real" (etcd, kube-apiserver, kube-controller-manager).
        api_front: on the real backend, the peering processes reach kube-apiserver through lab/apifront.py.
        replicas: peering processes per cluster, behind its ingress and passthroughs (the chart runs 2).
        module_enabled: False starts every cluster without ModuleConfig peering: the module is enabled as the guide
        says, with a ModuleConfig (lab/module_manager.py)."""
        check_apiserver(apiserver)
        self.apiserver = apiserver
        self.replicas = replicas
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"cluster names {names!r}: give one or more distinct names")
        if isinstance(without_crds, Mapping):
            stray = sorted(set(without_crds) - set(names))
            if stray:
                raise ValueError(f"without_crds names cluster {', '.join(stray)}, which is not one of {names!r}")
            per_cluster = {n: list(without_crds.get(n, ())) for n in names}
        else:
            per_cluster = {n: list(without_crds) for n in names}
        self.dir = pathlib.Path(dir)
        self.clusters = {n: LabCluster(n, self.dir, peering_command=peering_command, ready_timeout=ready_timeout,
                                       without_crds=per_cluster[n], apiserver=apiserver, api_front=api_front,
                                       replicas=replicas, module_enabled=module_enabled)
                         for n in names}

    def __getitem__(self, name: str) -> LabCluster:
        return self.clusters[name]

    async def start(self) -> None:
        try:
            await _all(c.start_services() for c in self.clusters.values())
            resolve: dict[str, str] = {}
            for c in self.clusters.values():
                resolve.update(c.public_resolve_map())
            cas = [c.pki.public_ca.cert_pem for c in self.clusters.values()]
            for c in self.clusters.values():
                c.resolve = dict(resolve)
                c.trusted_ca_pems = list(cas)
            await _all(c.start_controllers() for c in self.clusters.values())
        except BaseException:
            await self.stop()
            raise
        self.write_info()

    async def stop(self) -> None:
        await asyncio.gather(*(c.stop() for c in self.clusters.values()), return_exceptions=True)

    def info(self) -> dict:
        return {"ready": True, "dir": str(self.dir), "apiserver": self.apiserver, "replicas": self.replicas,
                "clusters": {n: c.info() for n, c in self.clusters.items()}}

    def write_info(self) -> None:
        _write(self.dir / "lab.json", json.dumps(self.info(), indent=2), 0o600)
