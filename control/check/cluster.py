"""What `peering check` reads from the API server, read-only, as plain values: every read says whether it worked,
found nothing, was not allowed, or is of an API this server does not serve, so that the judgement
(`control.check.judge`) can tell "broken" from "cannot see with this role" and from "not a Deckhouse cluster".

The reads: the Module `peering` and `user-authn` (deckhouse.io/v1alpha1 modules), the ModuleConfigs `peering`,
`global` and `user-authn` (whether Dex has its `kubernetes` client), the DexAuthenticators (deckhouse.io/v1; one
allowed access to Kubernetes gives Dex that client too), the namespace `d8-peering`, the Deployment `peering` and its Pods, the Lease `peering`, the Secret of the
Dex client, the module's certificate Secrets and each peering's `peer-<name>` (Secrets: an administrator's
view; the viewer role is told it cannot read them), the ClusterPeers, PeeringCapabilities and ProjectPeers, and
whether TokenExchangeProviders are served.
"""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from contract.names import CA_SECRET, EGRESS_TLS_SECRET, ENTRANCE_TLS_SECRET, NAMESPACE, peer_secret_name
from control.config import ControlSettings
from control.kube import (CLUSTERPEERS, LEASES, NAMESPACES, PEERINGCAPABILITIES, PROJECTPEERS, SECRETS,
                          TOKENEXCHANGEPROVIDERS, ApiError, KubeSession, Resource)

MODULES = Resource("deckhouse.io", "v1alpha1", "modules", False, "Module")
MODULECONFIGS = Resource("deckhouse.io", "v1alpha1", "moduleconfigs", False, "ModuleConfig")
DEXAUTHENTICATORS = Resource("deckhouse.io", "v1", "dexauthenticators", True, "DexAuthenticator")
DEPLOYMENTS = Resource("apps", "v1", "deployments", True, "Deployment")
PODS = Resource("", "v1", "pods", True, "Pod")
#: The module's objects, named as the chart names them.
DEPLOYMENT = "peering"
LEASE = "peering"
DEX_CLIENT_SECRET = "dex-client-peering"
MODULE_SECRETS = (CA_SECRET, ENTRANCE_TLS_SECRET, EGRESS_TLS_SECRET)

OK, MISSING, FORBIDDEN, UNSERVED, ERROR = "ok", "missing", "forbidden", "unserved", "error"


@dataclass(frozen=True)
class Read:
    """One read: `state` OK (with `obj`), MISSING (404), FORBIDDEN (401/403), UNSERVED (the API is not served
    here) or ERROR (anything else, `detail` says what)."""

    state: str
    obj: Any = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.state == OK

    @property
    def items(self) -> list[dict]:
        return list((self.obj or {}).get("items") or []) if self.ok else []


UNSERVED_READ = Read(UNSERVED)


@dataclass
class Facts:
    now: datetime.datetime
    namespace: str = NAMESPACE
    module_namespace: Read = UNSERVED_READ
    module: Read = UNSERVED_READ
    user_authn: Read = UNSERVED_READ
    module_config: Read = UNSERVED_READ
    global_config: Read = UNSERVED_READ
    user_authn_config: Read = UNSERVED_READ
    dex_authenticators: Read = UNSERVED_READ
    deployment: Read = UNSERVED_READ
    pods: Read = UNSERVED_READ
    lease: Read = UNSERVED_READ
    dex_secret: Read = UNSERVED_READ
    module_secrets: dict[str, Read] = field(default_factory=dict)
    clusterpeers: Read = UNSERVED_READ
    capabilities: Read = UNSERVED_READ
    projectpeers: Read = UNSERVED_READ
    peer_secrets: dict[str, Read] = field(default_factory=dict)
    #: Whether tokenexchangeproviders.deckhouse.io is served (None: discovery could not tell).
    providers_served: bool | None = None

    def clusterpeer(self, name: str) -> dict | None:
        return next((cp for cp in self.clusterpeers.items if cp["metadata"]["name"] == name), None)

    def container(self) -> dict:
        """The module's `peering` container of the Deployment as read ({} when it could not be)."""
        obj = self.deployment.obj or {} if self.deployment.ok else {}
        spec = (obj.get("spec") or {}).get("template", {}).get("spec", {})
        return next((c for c in spec.get("containers") or [] if c.get("name") == "peering"), {})

    def sync_interval(self) -> float:
        """Seconds between the module's pulls of a peer's offer: `--peer-sync-interval` of the Deployment, else
        the process's default."""
        args = list(self.container().get("args") or [])
        for i, arg in enumerate(args):
            value = arg.partition("=")[2] if arg.startswith("--peer-sync-interval=") else \
                args[i + 1] if arg == "--peer-sync-interval" and i + 1 < len(args) else None
            if value is not None:
                try:
                    return float(value)
                except ValueError:
                    break
        return ControlSettings.peer_sync_interval


class ClusterReader:
    """Reads with the caller's credentials; never writes."""

    def __init__(self, kube: KubeSession, namespace: str = NAMESPACE) -> None:
        self.kube = kube
        self.namespace = namespace
        self._discovery: dict[str, set[str] | None] = {}

    async def served(self, resource: Resource) -> bool | None:
        """Whether the API server serves `resource` (discovery of its group version); None when it cannot tell."""
        gv = resource.api_version
        if gv not in self._discovery:
            path = f"/apis/{gv}" if resource.group else f"/api/{gv}"
            try:
                answer = await self.kube.request("GET", path)
                self._discovery[gv] = {r.get("name") for r in answer.get("resources") or []}
            except ApiError as exc:
                self._discovery[gv] = set() if exc.code == 404 else None
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                self._discovery[gv] = None
        names = self._discovery[gv]
        return None if names is None else resource.plural in names

    async def _read(self, resource: Resource, call) -> Read:
        if await self.served(resource) is False:
            return UNSERVED_READ
        try:
            return Read(OK, await call())
        except ApiError as exc:
            if exc.code == 404:
                return Read(MISSING, detail=exc.message)
            if exc.code in (401, 403):
                return Read(FORBIDDEN, detail=exc.message[:300])
            return Read(ERROR, detail=f"{exc.code} {exc.reason}: {exc.message[:300]}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return Read(ERROR, detail=f"{type(exc).__name__}: {exc}"[:300])

    async def get(self, resource: Resource, name: str, namespace: str | None = None) -> Read:
        return await self._read(resource, lambda: self.kube.get(resource, name, namespace))

    async def list(self, resource: Resource, namespace: str | None = None, *, label_selector: str | None = None
                   ) -> Read:
        return await self._read(resource, lambda: self.kube.list(resource, namespace, label_selector=label_selector))

    async def facts(self, now: datetime.datetime, *, peers: list[str] | None = None) -> Facts:
        """Everything the judgement needs; `peers` limits the per-peering Secrets read (None: every ClusterPeer)."""
        ns = self.namespace
        f = Facts(now=now, namespace=ns)
        (f.module_namespace, f.module, f.user_authn, f.module_config, f.global_config, f.user_authn_config,
         f.dex_authenticators, f.deployment, f.lease, f.dex_secret, f.clusterpeers, f.capabilities,
         f.projectpeers) = await asyncio.gather(
            self.get(NAMESPACES, ns), self.get(MODULES, "peering"), self.get(MODULES, "user-authn"),
            self.get(MODULECONFIGS, "peering"), self.get(MODULECONFIGS, "global"),
            self.get(MODULECONFIGS, "user-authn"), self.list(DEXAUTHENTICATORS),
            self.get(DEPLOYMENTS, DEPLOYMENT, ns), self.get(LEASES, LEASE, ns), self.get(SECRETS, DEX_CLIENT_SECRET, ns),
            self.list(CLUSTERPEERS), self.list(PEERINGCAPABILITIES), self.list(PROJECTPEERS))
        if f.deployment.ok:
            labels = ((f.deployment.obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or None
            f.pods = await self.list(PODS, ns, label_selector=selector)
        secrets = await asyncio.gather(*(self.get(SECRETS, name, ns) for name in MODULE_SECRETS))
        f.module_secrets = dict(zip(MODULE_SECRETS, secrets))
        names = [cp["metadata"]["name"] for cp in f.clusterpeers.items]
        if peers is not None:
            names = [n for n in names if n in peers]
        reads = await asyncio.gather(*(self.get(SECRETS, peer_secret_name(n), ns) for n in names))
        f.peer_secrets = dict(zip(names, reads))
        f.providers_served = await self.served(TOKENEXCHANGEPROVIDERS)
        return f
