"""The registry feed: every replica turns its watches into gateway registry snapshots and certificate reloads.

Watched (through the shared informers): ClusterPeers, the module's own Secrets in its namespace (label
`app.kubernetes.io/managed-by=peering`: the `peer-*` credentials and the three TLS Secrets), PeeringCapabilities,
and the ConfigMap kube-system/d8-cluster-uuid. Any change marks the feed dirty; the feed waits a short moment to
gather a burst of changes, then builds one `Registry` with the next generation and publishes it, and reloads the
gateway's certificates when the TLS Secrets changed. Building is a pure function of the caches (`build_registry`,
`certificates_from`), so every replica and every worker arrives at the same snapshot from the same objects.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import inspect
import logging
from typing import Any, Callable, Protocol

from contract.names import (CA_SECRET, CLUSTER_UUID_CONFIGMAP, CLUSTER_UUID_KEY, CLUSTER_UUID_NAMESPACE,
                            EGRESS_TLS_SECRET, ENTRANCE_TLS_SECRET, MANAGED_BY_SELECTOR, PEER_SECRET_PREFIX)
from gateway.registry import Registry

from control import pki
from control.clock import SYSTEM, Clock
from control.kube import CLUSTERPEERS, CONFIGMAPS, PEERINGCAPABILITIES, SECRETS
from control.informers import Informers
from control.watch import Informer, ObjectPoller

log = logging.getLogger("peering.control.feed")



class Sink(Protocol):
    """What the feed drives: `gateway.server.Gateway` (either method may be a coroutine function)."""

    def publish(self, registry: Registry) -> Any: ...

    def reload_certificates(self, *, entrance_cert_pem: bytes, entrance_key_pem: bytes, ca_pem: bytes,
                            egress_cert_pem: bytes, egress_key_pem: bytes) -> Any: ...


@dataclasses.dataclass(frozen=True)
class ServingMaterial:
    """The gateway's serving material as the TLS Secrets hold it (PEM bytes)."""

    entrance_cert_pem: bytes
    entrance_key_pem: bytes
    ca_pem: bytes
    egress_cert_pem: bytes
    egress_key_pem: bytes

    def __repr__(self) -> str:  # keys never reach a log through repr
        return "ServingMaterial(<hidden>)"


def _data(secret: dict | None, key: str) -> bytes:
    value = ((secret or {}).get("data") or {}).get(key)
    if not isinstance(value, str):
        return b""
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        return b""


def cluster_uuid_from(configmap: dict | None) -> str:
    value = ((configmap or {}).get("data") or {}).get(CLUSTER_UUID_KEY)
    return value.strip() if isinstance(value, str) else ""


def build_registry(*, configmap: dict | None, clusterpeers: list[dict], secrets: list[dict],
                   capabilities: list[dict], generation: int) -> Registry:
    """The snapshot of the caches (pure): only `peer-*` Secrets describe peers."""
    peer_secrets = [s for s in secrets
                    if str((s.get("metadata") or {}).get("name", "")).startswith(PEER_SECRET_PREFIX)]
    return Registry.from_objects(cluster_uuid=cluster_uuid_from(configmap), clusterpeers=clusterpeers,
                                 peer_secrets=peer_secrets, capabilities=capabilities, generation=generation)


def certificates_from(secrets: dict[str, dict], now: datetime.datetime | None = None) -> ServingMaterial | None:
    """The gateway's certificates from the TLS Secrets by name, or None while any part is missing (pure), or,
    given `now`, while a server certificate is outside its validity period.

    The CA the gateway trusts for client certificates is the one in `peering-ca`; the server Secrets' own
    `ca.crt` may lag behind a CA rotation for a moment and is not used. A process that starts after being away
    longer than its server certificates live finds them expired: serving one would only make every peer's and
    consumer's TLS fail, so none is loaded (handshakes are refused and /readyz says why, so a Service sends
    elsewhere) until the leader has renewed it, which its first pass does."""
    entrance, egress, ca = (secrets.get(n) for n in (ENTRANCE_TLS_SECRET, EGRESS_TLS_SECRET, CA_SECRET))
    certs = ServingMaterial(_data(entrance, "tls.crt"), _data(entrance, "tls.key"), _data(ca, "tls.crt"),
                         _data(egress, "tls.crt"), _data(egress, "tls.key"))
    if not all(dataclasses.astuple(certs)):
        return None
    if now is not None and (_outside(certs.entrance_cert_pem, now) or _outside(certs.egress_cert_pem, now)):
        return None
    return certs


def _outside(cert_pem: bytes, now: datetime.datetime) -> bool:
    """Whether a readable certificate is outside its validity period (an unreadable one is the gateway's to
    refuse, with its reason)."""
    try:
        return not pki.valid_at(cert_pem.decode(), now)
    except (pki.PKIError, UnicodeDecodeError):
        return False


class Published:
    """The registry this replica's gateway decides on now: the feed's last publish, handed to the sink before it is
    set here. What the control loop announces to others is held back until it is served here (the access of a
    ClusterPeer, a certificate the join answers with: docs/protocol.md, "Announced only once served"): `until`
    waits for a registry that serves it, `subscribe` tells of every publish."""

    def __init__(self) -> None:
        self.registry: Registry = Registry.empty()
        self._next = asyncio.Event()
        self._subscribers: list[Callable[[Registry, Registry], None]] = []
        #: Set while this replica's gateway serves server certificates within their validity (the feed's), so
        #: that a peer called now can call back: `until_serving`.
        self.serving = asyncio.Event()

    async def until_serving(self, timeout: float) -> bool:
        """Whether the gateway serves valid server certificates within `timeout` seconds (now included)."""
        if self.serving.is_set():
            return True
        try:
            await asyncio.wait_for(self.serving.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def set(self, registry: Registry) -> None:
        old, self.registry = self.registry, registry
        event, self._next = self._next, asyncio.Event()
        event.set()
        for fn in list(self._subscribers):
            try:
                fn(old, registry)
            except Exception as exc:  # one broken subscriber must not keep the others from hearing of it
                log.error("registry subscriber failed", extra={"error": f"{type(exc).__name__}: {exc}"})

    def subscribe(self, fn: Callable[[Registry, Registry], None]) -> Callable[[], None]:
        """Call `fn(previous, new)` after every publish; returns the function that unsubscribes."""
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn) if fn in self._subscribers else None

    async def until(self, served: Callable[[Registry], bool], timeout: float) -> bool:
        """Whether a registry for which `served` is true is published within `timeout` seconds (now included)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not served(self.registry):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._next.wait(), remaining)
            except asyncio.TimeoutError:
                return served(self.registry)
        return True


class Feed:
    """Publishes registry snapshots and certificates to `sink` from the shared informers; `ready` is set after the
    first publish of fully synced caches (the process's /readyz waits on it); `published` is what the sink was
    handed last."""

    def __init__(self, informers: Informers, sink: Sink, namespace: str, *, coalesce: float = 0.05,
                 clock: Clock = SYSTEM) -> None:
        self.sink = sink
        self.namespace = namespace
        self.coalesce = coalesce
        self.clock = clock
        self._held_back = False
        self.clusterpeers = informers.get(CLUSTERPEERS)
        self.secrets = informers.get(SECRETS, namespace=namespace, label_selector=MANAGED_BY_SELECTOR)
        self.capabilities = informers.get(PEERINGCAPABILITIES)
        self.cluster_uuid = informers.get_object(CONFIGMAPS, CLUSTER_UUID_CONFIGMAP,
                                                 namespace=CLUSTER_UUID_NAMESPACE)
        self._informers: tuple[Informer | ObjectPoller, ...] = (
            self.clusterpeers, self.secrets, self.capabilities, self.cluster_uuid)
        self.generation = 0
        self.published = Published()
        self.certificates: ServingMaterial | None = None
        self.ready = asyncio.Event()
        self._dirty = asyncio.Event()
        self._unsubscribe: list = []
        self._task: asyncio.Task | None = None

    def _changed(self, event_type: str, obj: dict) -> None:
        self._dirty.set()

    def start(self) -> None:
        if self._task is not None:
            return
        self._unsubscribe = [i.subscribe(self._changed) for i in self._informers]
        self._dirty.set()
        self._task = asyncio.create_task(self._run(), name="registry-feed")

    async def stop(self) -> None:
        for fn in self._unsubscribe:
            fn()
        self._unsubscribe = []
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self._informers))
        while True:
            await self._dirty.wait()
            # Gather a burst (a relist, a reconcile writing several objects) into one snapshot.
            await asyncio.sleep(self.coalesce)
            self._dirty.clear()
            try:
                await self.publish_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The gateway keeps serving the previous snapshot; the next change tries again.
                log.error("publishing the registry failed", extra={"error": f"{type(exc).__name__}: {exc}"})

    async def publish_once(self) -> Registry:
        """Build the snapshot of the current caches, hand it to the sink, and reload changed certificates."""
        secrets = {(s.get("metadata") or {}).get("name", ""): s for s in self.secrets.items()}
        certs = certificates_from(secrets, self.clock.now())
        held_back = certs is None and certificates_from(secrets) is not None
        if held_back and not self._held_back:
            log.warning("a server certificate of the gateway is outside its validity period: not served; the "
                        "leader renews it (the entrance and egress refuse handshakes until then)")
        self._held_back = held_back
        if certs is not None and certs != self.certificates:
            await _maybe_await(self.sink.reload_certificates(**dataclasses.asdict(certs)))
            self.certificates = certs
            log.info("gateway certificates reloaded")
        if certs is not None:
            self.published.serving.set()
        elif held_back:
            self.published.serving.clear()
        configmap = self.cluster_uuid.get(CLUSTER_UUID_CONFIGMAP, CLUSTER_UUID_NAMESPACE)
        registry = build_registry(configmap=configmap, clusterpeers=self.clusterpeers.items(),
                                  secrets=list(secrets.values()), capabilities=self.capabilities.items(),
                                  generation=self.generation + 1)
        if _same_content(registry, self.registry):
            return self.registry
        self.generation += 1
        await _maybe_await(self.sink.publish(registry))
        self.published.set(registry)
        self.ready.set()
        log.info("registry published", extra={"generation": registry.generation, "peers": len(registry.peers),
                                              "capabilities": len(registry.capabilities)})
        return registry

    @property
    def registry(self) -> Registry:
        """The last registry published (an empty placeholder before the first)."""
        return self.published.registry


def _same_content(a: Registry, b: Registry) -> bool:
    # A change that does not alter the snapshot (a status condition, a resourceVersion) publishes nothing.
    return (a.loaded == b.loaded and a.cluster_uuid == b.cluster_uuid and dict(a.peers) == dict(b.peers)
            and dict(a.capabilities) == dict(b.capabilities) and a.pending == b.pending)


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value
