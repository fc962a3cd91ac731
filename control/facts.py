"""Facts about this cluster that the reconcilers read from the API server rather than from a watch: which
resources are namespaced (discovery, for capability scopes) and the issuer and keys of its ServiceAccount tokens
(for status.offer). Both change rarely, so each is cached for a while and read again after that."""

from __future__ import annotations

import asyncio
import json

from control.clock import SYSTEM, Clock
from control.kube import ApiError, KubeSession

DISCOVERY_TTL = 300.0
FAILED_GROUP_RETRY = 30.0
ISSUER_TTL = 60.0
#: Resources whose scope every Kubernetes cluster agrees on, used when discovery cannot be read.
_KNOWN_CLUSTER_SCOPED = {("", "namespaces"), ("", "nodes"), ("", "persistentvolumes"),
                         ("rbac.authorization.k8s.io", "clusterroles"),
                         ("rbac.authorization.k8s.io", "clusterrolebindings"),
                         ("storage.k8s.io", "storageclasses"), ("apiextensions.k8s.io", "customresourcedefinitions")}


class Discovery:
    """`namespaced(group, resource)` for capability scopes: True, False, or None when discovery does not know it."""

    def __init__(self, kube: KubeSession, *, ttl: float = DISCOVERY_TTL, clock: Clock = SYSTEM) -> None:
        self.kube = kube
        self.ttl = ttl
        self.clock = clock
        self._table: dict[tuple[str, str], bool] = {}
        self._read_at = -1e18
        self._lock = asyncio.Lock()
        #: Groups whose discovery failed at the last read (their earlier entries are kept).
        self.failed_groups: list[str] = []

    async def refresh(self) -> None:
        """Read discovery again when the table is older than `ttl`. One failing group (an aggregated API whose
        backend answers 503, say) keeps what was known of that group and spoils nothing else."""
        async with self._lock:
            if self.clock.monotonic() - self._read_at < self.ttl:
                return
            try:
                core = await self.kube.request("GET", "/api/v1")
                groups = await self.kube.request("GET", "/apis")
            except (ApiError, OSError, ValueError, asyncio.TimeoutError):
                # Keep what we had; unknown resources count as project scope, which fails closed.
                return
            table: dict[tuple[str, str], bool] = {}
            for r in core.get("resources") or []:
                table[("", r.get("name", ""))] = bool(r.get("namespaced"))
            failed: list[str] = []
            for g in groups.get("groups") or []:
                name = g.get("name", "")
                gv = (g.get("preferredVersion") or {}).get("groupVersion")
                if not gv:
                    continue
                try:
                    answer = await self.kube.request("GET", f"/apis/{gv}")
                except (ApiError, OSError, ValueError, asyncio.TimeoutError):
                    failed.append(name)
                    table.update({k: v for k, v in self._table.items() if k[0] == name})
                    continue
                for r in answer.get("resources") or []:
                    table[(name, r.get("name", ""))] = bool(r.get("namespaced"))
            self.failed_groups = failed
            self._table = table
            # A failing group is asked again sooner than the rest.
            self._read_at = self.clock.monotonic() - (max(0.0, self.ttl - FAILED_GROUP_RETRY) if failed else 0.0)

    def namespaced(self, group: str, resource: str) -> bool | None:
        key = (group, resource.split("/", 1)[0])
        if key in self._table:
            return self._table[key]
        if key in _KNOWN_CLUSTER_SCOPED:
            return False
        return None


class Issuer:
    """The issuer URL and JWKS (as a canonical JSON string) of this cluster's ServiceAccount tokens."""

    def __init__(self, kube: KubeSession, *, ttl: float = ISSUER_TTL, clock: Clock = SYSTEM) -> None:
        self.kube = kube
        self.ttl = ttl
        self.clock = clock
        self.url = ""
        self.jwks = ""
        self._read_at = -1e18
        self._lock = asyncio.Lock()

    async def refresh(self) -> tuple[str, str]:
        async with self._lock:
            if self.clock.monotonic() - self._read_at >= self.ttl:
                try:
                    config = await self.kube.request("GET", "/.well-known/openid-configuration")
                    # kube-apiserver serves the keys as application/jwk-set+json only (406 to application/json).
                    keys = await self.kube.request("GET", "/openid/v1/jwks", accept="application/jwk-set+json")
                except (ApiError, OSError, ValueError, asyncio.TimeoutError):
                    # The offer keeps the last known issuer; an empty one makes the peer wait (AwaitingIssuer).
                    return self.url, self.jwks
                url = config.get("issuer") if isinstance(config.get("issuer"), str) else ""
                jwks = json.dumps(keys, sort_keys=True, separators=(",", ":")) if keys.get("keys") else ""
                self.url, self.jwks = url, jwks
                self._read_at = self.clock.monotonic()
            return self.url, self.jwks
