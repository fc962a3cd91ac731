"""The `peering run` process (the composition root): one API session, the shared informers, the registry feed,
the gateway, the Lease and the reconcilers, started in that order and stopped in the reverse one. Nothing imports
this module but the CLI: the parts it composes get a `control.context.Context`.

Where later parts plug in:
- reconcilers: add a factory `fn(ctx: Context) -> Reconciler` to `RECONCILERS` (see `control.workqueue` for how a
  reconciler declares its watches and keys);
- request handlers: `ctx.handlers.add_peer_op(op, fn)` and `ctx.handlers.set_join(fn)` from a reconciler factory
  (or any code given the Context); until a handler is registered, the gateway answers that op 503 NotReady.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from typing import Any, Callable, Protocol, Sequence

import prometheus_client

from gateway.config import GatewayConfig, Limits
from gateway.exchange import ExchangeFailures
from gateway.registry import Registry
from gateway.resolve import OverrideResolver

from control import reconcilers
from control.bootstrap import CertificatesReconciler
from control.clock import SYSTEM, Clock
from control.config import Settings
from control.context import Context
from control.dex_credentials import DexClientCredentials
from control.feed import Feed, Sink
from control.handlers.dispatch import Handlers
from control.informers import Informers
from control.kube import CLUSTERPEERS, KubeSession
from control.lease import LeaderElector
from control.metrics import ControlCollector
from control.workqueue import Controller, Reconciler

log = logging.getLogger("peering.control.process")


def certificates(ctx: Context) -> Reconciler:
    return CertificatesReconciler(ctx.kube, namespace=ctx.namespace,
                                  public_domain_template=ctx.settings.public_domain_template,
                                  cluster_name=ctx.cluster_uuid, clock=ctx.clock,
                                  lifetime=ctx.settings.control.server_lifetime, events=ctx.events)


RECONCILERS: tuple[Callable[[Context], Reconciler], ...] = (certificates, *reconcilers.FACTORIES)
"""Every reconciler of the process, run on the Lease holder only."""


class Served(Sink, Protocol):
    """The gateway a Runtime drives (`gateway.server.Gateway`): what the feed publishes into, started once the
    caches run and stopped after the reconcilers."""

    async def start(self) -> Any: ...

    async def stop(self) -> Any: ...


class Runtime:
    """The control loop of one replica around a gateway. Each part is made with what it needs, in order: the
    informers, the feed, the controller (empty), the Context with all of them, then every reconciler from the
    Context, the Lease elector and the metrics. `exchange_failures` is the gateway's record of the last failed
    token exchange per Dex connector (given to the Gateway too): the ClusterPeers show it, and each change of it
    queues them again (`exchange_changed`)."""

    def __init__(self, settings: Settings, kube: KubeSession, gateway: Served, *,
                 handlers: Handlers | None = None,
                 reconcilers: Sequence[Callable[[Context], Reconciler]] = RECONCILERS, clock: Clock = SYSTEM,
                 exchange_failures: ExchangeFailures | None = None) -> None:
        self.settings = settings
        self.kube = kube
        self.gateway = gateway
        self.handlers = handlers or Handlers()
        self.informers = Informers(kube, watch_timeout=settings.kube.watch_timeout,
                                   optional_recheck=settings.control.optional_api_interval)
        self.feed = Feed(self.informers, gateway, settings.kube.namespace, coalesce=settings.control.feed_coalesce,
                         clock=clock)
        self.controller = Controller(self.informers, workers=settings.control.reconcile_workers)
        failures = exchange_failures if exchange_failures is not None else ExchangeFailures()
        failures.subscribe(self.exchange_changed)
        self.ctx = Context(settings, kube, self.informers, self.handlers, controller=self.controller, clock=clock,
                           published=self.feed.published, exchange_failures=lambda: failures.by_connector)
        for make in reconcilers:
            self.controller.add(make(self.ctx))
        # What a ClusterPeer announces waits for the registry that serves it (control/rules/access.py): a publish
        # that changes a peer queues its ClusterPeer again.
        self.feed.published.subscribe(lambda old, new: [self.ctx.enqueue("clusterpeer", name)
                                                        for name in changed_peers(old, new)])
        self.elector = LeaderElector(kube, settings.kube.namespace, settings.lease,
                                     on_started=self.controller.start, on_stopped=self.controller.stop)
        #: The metrics an administrator alerts on, computed at each scrape (register on the /metrics registry).
        self.metrics = ControlCollector(self.informers, settings.kube.namespace,
                                        leading=lambda: self.elector.is_leader, memory=self.ctx.peer_memory)
        self._started = False
        self._electing: asyncio.Task | None = None

    def exchange_changed(self, connector: str) -> None:
        """A change of how exchanges go (through `connector`, one of the ClusterPeers') is shown on the
        ClusterPeers at once."""
        for key in self.informers.get(CLUSTERPEERS).store:
            self.ctx.enqueue("clusterpeer", key)

    @property
    def ready(self) -> bool:
        """Every cache synced and the gateway holds a real registry."""
        return self.feed.ready.is_set() and self.informers.synced

    async def start(self) -> None:
        self._started = True
        self.informers.start()
        self.feed.start()
        await self.gateway.start()
        # The reconcilers announce only what this replica's gateway serves (rules/served.py): they lead only once
        # the gateway holds the registry of synced caches, not the empty one it starts with.
        self._electing = asyncio.create_task(self._elect_when_published(), name="elect-when-published")
        log.info("control loop started", extra={"identity": self.settings.lease.identity,
                                                "namespace": self.settings.kube.namespace})

    async def _elect_when_published(self) -> None:
        await self.feed.ready.wait()
        self.elector.start()

    async def stop(self) -> None:
        """Stop reconciling and release the Lease first, then stop serving, then the watches."""
        if not self._started:
            return
        self._started = False
        if self._electing is not None:
            self._electing.cancel()
            await asyncio.gather(self._electing, return_exceptions=True)
            self._electing = None
        await self.elector.stop(release=True)
        await self.controller.stop()
        await self.ctx.close()
        await self.gateway.stop()
        await self.feed.stop()
        await self.informers.stop()
        log.info("control loop stopped")


def changed_peers(old: Registry, new: Registry) -> set[str]:
    """The ClusterPeers whose peer the new registry holds otherwise than the old one (added, changed or gone)."""
    return {name for name in set(old.peers) | set(new.peers) if old.peers.get(name) != new.peers.get(name)}


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


def expose_control_metrics(registry: prometheus_client.CollectorRegistry) -> None:
    """Serve the control loop's metrics from the gateway's /metrics `registry` too."""
    if registry is not prometheus_client.REGISTRY:
        registry.register(_Forwarded(prometheus_client.REGISTRY))


def gateway_config(settings: Settings, kube: KubeSession, dex: DexClientCredentials) -> GatewayConfig:
    """The gateway's part of the settings, with the API credentials of the process's one session."""
    creds = kube.credentials()
    listen = settings.listen
    dex_ca = None
    if settings.dex.ca_file:
        with open(settings.dex.ca_file, "rb") as f:
            dex_ca = f.read()
    # Dex's URL only when it is known (user-authn is enabled); the gateway's default stands otherwise.
    dex_url = {"dex_url": settings.dex.url} if settings.dex.url else {}
    return GatewayConfig(
        public_domain_template=settings.public_domain_template,
        api_server=creds.server, api_ca_pem=creds.ca_pem, api_token=lambda: creds.token() or "",
        dex_client_id=dex.client_id(), dex_client_secret=dex.client_secret, dex_ca_pem=dex_ca, **dex_url,
        resolve=dict(settings.resolve), workers=settings.workers,
        entrance_host=listen.bind_host, entrance_port=listen.entrance_port,
        join_host=listen.bind_host, join_port=listen.join_port,
        egress_host=listen.bind_host, egress_port=listen.egress_port,
        ops_host=listen.bind_host, ops_port=listen.ops_port,
        limits=Limits(exchanges_per_peer_per_second=settings.exchanges_per_peer,
                      exchange_burst_per_peer=settings.exchange_burst_per_peer),
        trusted_proxies=settings.trusted_proxies)


async def run_process(settings: Settings, stop: asyncio.Event) -> None:
    """`peering run`: serve until `stop` is set, then shut down in order (release the Lease first)."""
    from gateway.server import Gateway

    resolver = OverrideResolver(settings.resolve)
    kube = await KubeSession.connect(settings.kube.kubeconfig, resolver=resolver)
    informers_for_dex: Informers | None = None
    try:
        handlers = Handlers()
        # The Dex client's ID is read once at start (the gateway's exchange client is built with it); its secret
        # is read from the cache on every exchange, so a rotation needs no restart.
        informers_for_dex = Informers(kube, watch_timeout=settings.kube.watch_timeout)
        dex = DexClientCredentials(informers_for_dex, settings.kube.namespace, settings.dex)
        informers_for_dex.start()
        try:
            await _unless_stopped(stop, asyncio.wait_for(dex.informer.synced.wait(), timeout=30))
        except asyncio.TimeoutError:
            raise ValueError(f"cannot read Secret {settings.kube.namespace}/{dex.name} "
                             f"through the API: {dex.informer.last_error or 'no answer'}; check the kubeconfig "
                             f"and the ServiceAccount's RBAC") from None
        if not dex.client_secret():
            log.warning("the Secret of the module's Dex client is missing or has no clientSecret: token exchange "
                        "fails until user-authn writes it (from the DexClient of the chart); no restart is needed",
                        extra={"object": f"{settings.kube.namespace}/{dex.name}", "client": dex.id})
        # How token exchanges go: the gateway records it, the runtime shows it on the ClusterPeers.
        failures = ExchangeFailures()
        gateway = Gateway(gateway_config(settings, kube, dex), handlers, exchange_failures=failures)
        expose_control_metrics(gateway.metrics.registry)
        runtime = Runtime(settings, kube, gateway, handlers=handlers, exchange_failures=failures)
        gateway.metrics.registry.register(runtime.metrics)
        try:
            await _unless_stopped(stop, runtime.start())
            ports = {"entrance": gateway.entrance_port, "join": gateway.join_port, "egress": gateway.egress_port,
                     "ops": gateway.ops_port}
            log.info("listening", extra={"ports": ports, "bind_host": settings.listen.bind_host})
            if settings.listen.ports_file:
                write_ports_file(settings.listen.ports_file, ports)
            await stop.wait()
            log.info("stopping")
        finally:
            await runtime.stop()
    except Stopped:
        log.info("stopped while starting")
    finally:
        if informers_for_dex is not None:
            await informers_for_dex.stop()
        await kube.close()
        await resolver.close()


class Stopped(Exception):
    """The stop came while the process was still starting."""


async def _unless_stopped(stop: asyncio.Event, step: Any) -> Any:
    """What `step` (a coroutine of the start) comes to, or Stopped once `stop` is set first: a SIGTERM while the
    API server is slow to answer (or gone, with the lab that ran it) ends the process at once, not after the
    start's own timeouts. The step is cancelled then; what it had started is stopped by the caller."""
    task = asyncio.ensure_future(step)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        stopping.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise Stopped
