"""The `peering run` process: one API session, the shared informers, the registry feed, the gateway, the Lease
and the reconcilers, started in that order and stopped in the reverse one.

Where later parts plug in:
- reconcilers: add a factory `fn(ctx: Context) -> Reconciler` to `RECONCILERS` (see `control.workqueue` for how a
  reconciler declares its watches and keys);
- request handlers: `ctx.handlers.add_peer_op(op, fn)` and `ctx.handlers.set_join(fn)` from a reconciler factory
  (or any code given the Context); until a handler is registered, the gateway answers that op 503 NotReady.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import os
import tempfile
from typing import Awaitable, Callable, Sequence

import prometheus_client

from contract import reasons
from contract.names import CLUSTER_UUID_CONFIGMAP, CLUSTER_UUID_NAMESPACE
from gateway.config import GatewayConfig
from gateway.protocol import JoinCall, PeerCall
from contract.paths import PEER_OPS
from contract.errors import Refusal
from gateway.resolve import OverrideResolver

from control.bootstrap import CertificatesReconciler
from control.config import DexSettings, Settings
from control.feed import Feed, Sink, cluster_uuid_from
from control.kube import CLUSTERPEERS, CONFIGMAPS, SECRETS, KubeSession
from control.lease import LeaderElector
from control.informers import Informers
from control.watch import ObjectPoller
from control.workqueue import Controller, Reconciler
from control import reconcilers

log = logging.getLogger("peering.control.process")

PeerOp = Callable[[PeerCall], Awaitable[dict]]
JoinHandler = Callable[[JoinCall], Awaitable[dict]]


class Handlers:
    """The `gateway.protocol.ControlHandlers` of the process: a registry of handlers by op."""

    def __init__(self) -> None:
        self._peer_ops: dict[str, PeerOp] = {}
        self._join: JoinHandler | None = None

    def add_peer_op(self, op: str, fn: PeerOp) -> None:
        if op not in PEER_OPS:
            raise ValueError(f"unknown peer operation {op!r}; known: {', '.join(sorted(PEER_OPS))}")
        if op in self._peer_ops:
            raise ValueError(f"a handler for peer operation {op!r} is already registered")
        self._peer_ops[op] = fn

    def set_join(self, fn: JoinHandler) -> None:
        if self._join is not None:
            raise ValueError("a join handler is already registered")
        self._join = fn

    async def peer_call(self, call: PeerCall) -> dict:
        fn = self._peer_ops.get(call.op)
        if fn is None:
            raise Refusal(503, reasons.NOT_READY, f"this cluster cannot answer /peering/v1/{call.op} yet; retry later")
        return await fn(call)

    async def join(self, call: JoinCall) -> dict:
        if self._join is None:
            raise Refusal(503, reasons.NOT_READY, "this cluster cannot accept joins yet; retry later")
        return await self._join(call)


@dataclasses.dataclass
class Context:
    """What a reconciler factory gets: the settings, the API session, the shared informers, the handlers."""

    settings: Settings
    kube: KubeSession
    informers: Informers
    handlers: Handlers
    controller: Controller | None = None
    exchange_failures: Callable[[], dict[str, tuple[str, str]]] = lambda: {}
    """The gateway's last failed token exchange per Dex connector (reason, message); see Gateway."""

    def enqueue(self, reconciler: str, key: str) -> None:
        """Queue `key` for the named reconciler now (a request handler's nudge); a replica that does not lead has
        no running queue and ignores it: the leader's own periodic pass covers it."""
        if self.controller is None or not self.controller.leading:
            return
        for runner in self.controller.runners:
            if runner.reconciler.name == reconciler:
                runner.queue.add(key)

    @property
    def namespace(self) -> str:
        return self.settings.kube.namespace

    def cluster_uuid_informer(self) -> ObjectPoller:
        """The shared reader of kube-system/d8-cluster-uuid (a GET poller: the process may only get it)."""
        return self.informers.get_object(CONFIGMAPS, CLUSTER_UUID_CONFIGMAP, namespace=CLUSTER_UUID_NAMESPACE)

    def cluster_uuid(self) -> str:
        """This cluster's UUID from the cache ("" until the ConfigMap is seen)."""
        return cluster_uuid_from(self.cluster_uuid_informer().get(CLUSTER_UUID_CONFIGMAP, CLUSTER_UUID_NAMESPACE))


def certificates(ctx: Context) -> Reconciler:
    return CertificatesReconciler(ctx.kube, namespace=ctx.namespace,
                                  public_domain_template=ctx.settings.public_domain_template,
                                  cluster_name=ctx.cluster_uuid)


RECONCILERS: tuple[Callable[[Context], Reconciler], ...] = (certificates, *reconcilers.FACTORIES)
"""Every reconciler of the process, run on the Lease holder only."""


class DexClient:
    """The module's Dex client as user-authn makes it from the chart's DexClient object: the ID is derived from
    the DexClient's name and namespace; the secret is kept current from Secret `dex-client-<name>`, key
    `clientSecret`, and read on every exchange, so that the Secret appearing late or rotating needs no restart."""

    def __init__(self, informers: Informers, namespace: str, settings: DexSettings) -> None:
        self.name = settings.secret_name
        self.namespace = namespace
        self.id = settings.client_id(namespace)
        self.informer = informers.get(SECRETS, namespace=namespace, field_selector=f"metadata.name={self.name}")

    def client_id(self) -> str:
        return self.id

    def client_secret(self) -> str:
        secret = self.informer.get(self.name, self.namespace) or {}
        value = (secret.get("data") or {}).get("clientSecret")
        try:
            return base64.b64decode(value).decode() if isinstance(value, str) else ""
        except (ValueError, UnicodeDecodeError):
            return ""


class Runtime:
    """The control loop of one replica around a gateway (anything with `publish`/`reload_certificates`, and
    optionally `start`/`stop`)."""

    def __init__(self, settings: Settings, kube: KubeSession, gateway: Sink, *,
                 handlers: Handlers | None = None,
                 reconcilers: Sequence[Callable[[Context], Reconciler]] = RECONCILERS) -> None:
        self.settings = settings
        self.kube = kube
        self.gateway = gateway
        self.handlers = handlers or Handlers()
        self.informers = Informers(kube, watch_timeout=settings.kube.watch_timeout,
                                   optional_recheck=settings.control.optional_api_interval)
        self.ctx = Context(settings, kube, self.informers, self.handlers)
        self.feed = Feed(self.informers, gateway, settings.kube.namespace, coalesce=settings.control.feed_coalesce)
        self.controller = Controller(self.informers, [make(self.ctx) for make in reconcilers],
                                     workers=settings.control.reconcile_workers)
        self.ctx.controller = self.controller
        if isinstance(getattr(gateway, "exchange_failures", None), dict):
            self.ctx.exchange_failures = lambda: gateway.exchange_failures
            # A change of how exchanges go is shown on the ClusterPeers at once (the connector is one of theirs).
            gateway.on_exchange_change = lambda connector: [
                self.ctx.enqueue("clusterpeer", key) for key in self.informers.get(CLUSTERPEERS).store]
        self.elector = LeaderElector(kube, settings.kube.namespace, settings.lease,
                                     on_started=self.controller.start, on_stopped=self.controller.stop)
        self._started = False

    @property
    def ready(self) -> bool:
        """Every cache synced and the gateway holds a real registry."""
        return self.feed.ready.is_set() and self.informers.synced

    async def start(self) -> None:
        self._started = True
        self.informers.start()
        self.feed.start()
        start = getattr(self.gateway, "start", None)
        if start is not None:
            await start()
        self.elector.start()
        log.info("control loop started", extra={"identity": self.settings.lease.identity,
                                                "namespace": self.settings.kube.namespace})

    async def stop(self) -> None:
        """Stop reconciling and release the Lease first, then stop serving, then the watches."""
        if not self._started:
            return
        self._started = False
        await self.elector.stop(release=True)
        await self.controller.stop()
        for runner in self.controller.runners:
            close = getattr(runner.reconciler, "close", None)
            if close is not None:
                await close()
        stop = getattr(self.gateway, "stop", None)
        if stop is not None:
            await stop()
        await self.feed.stop()
        await self.informers.stop()
        log.info("control loop stopped")


def write_ports_file(path: str, ports: dict[str, int]) -> None:
    """Write the bound ports atomically, so that a reader never sees half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".ports-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(ports, f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise



class _Forwarded:
    """A collector that serves another registry's metrics (the control loop's, kept in prometheus_client's default
    registry) from the gateway's own, so that one /metrics shows both."""

    def __init__(self, source: prometheus_client.CollectorRegistry) -> None:
        self.source = source

    def collect(self):
        return self.source.collect()


def expose_control_metrics(gateway: object) -> None:
    registry = getattr(getattr(gateway, "metrics", None), "registry", None)
    if registry is not None and registry is not prometheus_client.REGISTRY:
        registry.register(_Forwarded(prometheus_client.REGISTRY))


def gateway_config(settings: Settings, kube: KubeSession, dex: DexClient) -> GatewayConfig:
    """The gateway's part of the settings, with the API credentials of the process's one session."""
    creds = kube.credentials()
    listen = settings.listen
    dex_ca = None
    if settings.dex.ca_file:
        with open(settings.dex.ca_file, "rb") as f:
            dex_ca = f.read()
    config = GatewayConfig(
        public_domain_template=settings.public_domain_template,
        api_server=creds.server, api_ca_pem=creds.ca_pem, api_token=lambda: creds.token() or "",
        dex_client_id=dex.client_id(), dex_client_secret=dex.client_secret, dex_ca_pem=dex_ca,
        resolve=dict(settings.resolve), workers=settings.workers,
        entrance_host=listen.bind_host, entrance_port=listen.entrance_port,
        join_host=listen.bind_host, join_port=listen.join_port,
        egress_host=listen.bind_host, egress_port=listen.egress_port,
        ops_host=listen.bind_host, ops_port=listen.ops_port)
    if settings.dex.url:
        config.dex_url = settings.dex.url
    return config


async def run_process(settings: Settings, stop: asyncio.Event) -> None:
    """`peering run`: serve until `stop` is set, then shut down in order (release the Lease first)."""
    from gateway.server import Gateway

    resolver = OverrideResolver(settings.resolve)
    kube = await KubeSession.connect(settings.kube.kubeconfig, resolver=resolver)
    try:
        handlers = Handlers()
        # The Dex client's ID is read once at start (the gateway's exchange client is built with it); its secret
        # is read from the cache on every exchange, so a rotation needs no restart.
        informers_for_dex = Informers(kube, watch_timeout=settings.kube.watch_timeout)
        dex = DexClient(informers_for_dex, settings.kube.namespace, settings.dex)
        informers_for_dex.start()
        try:
            await asyncio.wait_for(dex.informer.synced.wait(), timeout=30)
        except asyncio.TimeoutError:
            raise ValueError(f"cannot read Secret {settings.kube.namespace}/{dex.name} "
                             f"through the API: {dex.informer.last_error or 'no answer'}; check the kubeconfig "
                             f"and the ServiceAccount's RBAC") from None
        if not dex.client_secret():
            log.warning("the Secret of the module's Dex client is missing or has no clientSecret: token exchange "
                        "fails until user-authn writes it (from the DexClient of the chart); no restart is needed",
                        extra={"object": f"{settings.kube.namespace}/{dex.name}", "client": dex.id})
        gateway = Gateway(gateway_config(settings, kube, dex), handlers)
        expose_control_metrics(gateway)
        runtime = Runtime(settings, kube, gateway, handlers=handlers)
        try:
            await runtime.start()
            ports = {"entrance": gateway.entrance_port, "join": gateway.join_port, "egress": gateway.egress_port,
                     "ops": gateway.ops_port}
            log.info("listening", extra={"ports": ports, "bind_host": settings.listen.bind_host})
            if settings.listen.ports_file:
                write_ports_file(settings.listen.ports_file, ports)
            await stop.wait()
            log.info("stopping")
        finally:
            await runtime.stop()
            await informers_for_dex.stop()
    finally:
        await kube.close()
        await resolver.close()
