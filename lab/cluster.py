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
import json
import os
import pathlib
import secrets
import uuid
from typing import Any, Callable, Mapping

from lab import certs, multitenancy
from lab.certs import check_cluster_name
from lab.dex import Dex
from lab.ingress import Ingress, TcpPassthrough
from lab.module_manager import GROUP as DECKHOUSE_GROUP, PEERING, USER_AUTHN, ModuleManager
from lab.userauthn import UserAuthn
from lab.workload import DeploymentPlayer
from lab.layout import (APISERVERS, ClusterFiles, DEX_CLIENT_ID, DEX_CLIENT_SECRET_NAME, EGRESS_HOST, LAB_CRDS,
                        MAX_REPLICAS, MODULE_CRDS, NAMESPACE, OTHER_MODULES, READY_TIMEOUT, ROOT,
                        SERVICE_ACCOUNT_ISSUER, check_apiserver, check_crd_names, crd_documents, gather_all)
from lab.replicas import Replica, Replicas, default_peering_command, peering_executable
from lab.real.process import write

# lab.cluster is where tests and tools find the lab's names, wherever they are defined.
__all__ = ["APISERVERS", "DEX_CLIENT_ID", "DEX_CLIENT_SECRET_NAME", "EGRESS_HOST", "LAB_CRDS", "MAX_REPLICAS",
           "MODULE_CRDS", "NAMESPACE", "READY_TIMEOUT", "ROOT", "SERVICE_ACCOUNT_ISSUER", "Lab",
           "LabCluster", "PeeringCommand", "Replica", "check_apiserver", "check_cluster_name",
           "check_crd_names", "crd_documents", "default_peering_command", "peering_executable"]


PeeringCommand = Callable[["LabCluster"], "list[str] | None"]


def _ignore_exists(call: Callable[[], Any]) -> Any:
    from lab.apiserver.errors import ApiError

    try:
        return call()
    except ApiError as e:
        if e.code != 409:
            raise
        return None



class LabCluster(Replicas, ClusterFiles):
    """One lab cluster. `start()` starts it alone; `Lab` starts several that know each other's names."""

    def __init__(self, name: str, dir: os.PathLike | str, *, peering_command: PeeringCommand | None = default_peering_command,
                 ready_timeout: float = READY_TIMEOUT, without_crds=(), apiserver: str = "emulator",
                 api_front: bool = False, replicas: int = 1, module_enabled: bool = True,
                 planes: Any = None) -> None:
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
        # On the real backend: where a control plane is taken from and given back to (lab/real/pool.py
        # `PlanePool`), or None for a plane of this cluster's own, stopped with it.
        self.planes = planes
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

    async def _start_dex(self, signing_key: Any = None) -> None:
        # Its clients are user-authn's to make (lab/userauthn_module.py), once the module manager runs.
        self.dex = Dex(self.dex_issuer, certs.server_ssl_context(self.pki.dex), signing_key=signing_key)
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
        from lab.real.pool import acquire_plane

        docs = crd_documents()

        async def start_dex(pki: Any, signing_key: Any) -> Dex:
            self.pki = pki
            await self._start_dex(signing_key)
            return self.dex
        self.control_plane = await acquire_plane(
            self.planes, self.name, self.path("control-plane"), pki=self.pki, dex_issuer=self.dex_issuer,
            start_dex=start_dex, crds=[doc for name, doc in docs.items() if name not in self.without_crds],
            without_crds=self.without_crds)
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
            if self.api is not None:
                self.api.close()
            from lab.real.pool import release_plane

            plane, self.control_plane = self.control_plane, None
            await release_plane(self.planes, plane)
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



class Lab:
    """Several lab clusters that resolve and trust each other's public names."""

    def __init__(self, dir: os.PathLike | str, names: list[str], *, peering_command: PeeringCommand | None = default_peering_command,
                 ready_timeout: float = READY_TIMEOUT, without_crds=(), apiserver: str = "emulator",
                 api_front: bool = False, replicas: int = 1, module_enabled: bool = True,
                 planes: Any = None) -> None:
        """without_crds: CRD names every cluster starts without, or a mapping of cluster name to such names.
        apiserver: "emulator" (in this process) or "real" (etcd, kube-apiserver, kube-controller-manager).
        api_front: on the real backend, the peering processes reach kube-apiserver through lab/apifront.py.
        replicas: peering processes per cluster, behind its ingress and passthroughs (the chart runs 2).
        module_enabled: False starts every cluster without ModuleConfig peering: the module is enabled as the guide
        says, with a ModuleConfig (lab/module_manager.py).
        planes: on the real backend, a lab/real/pool.py `PlanePool` the clusters take their control planes from
        and give them back to; None: each starts its own and stops it."""
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
                                       replicas=replicas, module_enabled=module_enabled, planes=planes)
                         for n in names}

    def __getitem__(self, name: str) -> LabCluster:
        return self.clusters[name]

    async def start(self) -> None:
        try:
            await gather_all(c.start_services() for c in self.clusters.values())
            resolve: dict[str, str] = {}
            for c in self.clusters.values():
                resolve.update(c.public_resolve_map())
            cas = [c.pki.public_ca.cert_pem for c in self.clusters.values()]
            for c in self.clusters.values():
                c.resolve = dict(resolve)
                c.trusted_ca_pems = list(cas)
            await gather_all(c.start_controllers() for c in self.clusters.values())
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
        write(self.dir / "lab.json", json.dumps(self.info(), indent=2), 0o600)

