"""The gateway as the process runs it: the four listeners (DESIGN.md 2), the registry swap and the certificate
reloads, in one process, or with `config.workers` > 1 with the entrance and the egress in worker processes.

A `Gateway` composes a `DataPlane` (dataplane.py) for the listeners this process serves and, with workers, a
`WorkerPool` (workers.py) whose processes compose data planes of their own (worker.py). What a request may do is
decided in admission.py; this file only starts, feeds and stops those pieces.
"""

from __future__ import annotations

import os

from prometheus_client import generate_latest

from gateway.config import GatewayConfig
from gateway.dataplane import LISTENERS, Certificates, DataPlane
from gateway.exchange import ExchangeFailures
from gateway.metrics import Metrics
from gateway.peercalls import PeerCallBound
from gateway.protocol import ControlHandlers
from gateway.registry import Registry
from gateway.state import GatewayState
from gateway.tls import require_no_resumption
from gateway.workers import WorkerPool


class Gateway:
    """The data plane. Build it with a config and the control loop's handlers, `await start()`, then feed it
    registries with `publish` and certificates with `reload_certificates`."""

    def __init__(self, config: GatewayConfig, handlers: ControlHandlers, *,
                 exchange_failures: ExchangeFailures | None = None) -> None:
        self.config = config
        self.handlers = handlers
        self.metrics = Metrics()
        self.entrance_port = 0
        self.join_port = 0
        self.egress_port = 0
        self.ops_port = 0
        self._registry = Registry.empty()
        # Given by the composition root, which lets the control loop subscribe to its changes.
        self._failures = exchange_failures if exchange_failures is not None else ExchangeFailures()
        #: The last failed token exchange per Dex connector, (reason, message), cleared by a success; the control
        #: loop shows it in the ClusterPeer's TokenExchangeReady. Workers report theirs to the parent.
        self.exchange_failures: dict[str, tuple[str, str]] = self._failures.by_connector
        count = config.workers if config.workers > 0 else (os.cpu_count() or 1)
        # Every peer call of the process, its workers' too, passes this one bound per peer.
        bounded = PeerCallBound(handlers, config.limits.peer_calls_per_second, config.limits.peer_call_burst)
        self._pool = WorkerPool(config, bounded, count) if count > 1 else None
        listeners = ("join", "ops") if self._pool is not None else LISTENERS
        self._plane = DataPlane(config, bounded, self.metrics, listeners=listeners, readiness=self.readiness,
                                scrape=self._scrape, on_exchange=self.exchange_outcome)

    # ----- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind all listeners and open the sessions; with workers, start them first (they serve the entrance and
        the egress)."""
        # A gateway whose TLS could resume a session (and so skip a client certificate) does not start.
        require_no_resumption()
        try:
            if self._pool is not None:
                # The workers' token exchanges go through this process's one cache (and its Dex client).
                await self._pool.start(lambda: self._registry, self.exchange_outcome,
                                       exchange=lambda: self._plane.state and self._plane.state.exchange)
                self.entrance_port, self.egress_port = self._pool.entrance_port, self._pool.egress_port
            await self._plane.start(self._registry)
        except BaseException:
            await self.stop()
            raise
        for name, port in self._plane.ports.items():
            setattr(self, f"{name}_port", port)

    async def stop(self) -> None:
        """Close the listeners, every connection and every upstream session (and the workers)."""
        if self._pool is not None:
            await self._pool.stop()
        await self._plane.stop()

    # ----- inputs from the control loop ----------------------------------------------------------------------
    def publish(self, registry: Registry) -> None:
        """Swap the registry; connections of peers that left it are closed now."""
        self._registry = registry
        if self._pool is not None:
            self._pool.publish(registry)
        self._plane.publish(registry)

    def reload_certificates(self, *, entrance_cert_pem: bytes, entrance_key_pem: bytes, ca_pem: bytes,
                            egress_cert_pem: bytes, egress_key_pem: bytes) -> None:
        """Serve new handshakes with these certificates; open connections keep theirs. Raises ValueError with
        what is wrong when they do not load, and keeps the previous ones then."""
        pem = dict(entrance_cert_pem=entrance_cert_pem, entrance_key_pem=entrance_key_pem, ca_pem=ca_pem,
                   egress_cert_pem=egress_cert_pem, egress_key_pem=egress_key_pem)
        self._plane.reload_certificates(Certificates.from_pem(**pem))
        if self._pool is not None:
            self._pool.reload_certificates(pem)

    # ----- what it shows -------------------------------------------------------------------------------------
    @property
    def registry(self) -> Registry:
        return self._registry

    @property
    def state(self) -> GatewayState | None:
        """This process's state once started (its entrance and egress are the workers' with workers)."""
        return self._plane.state

    def readiness(self) -> tuple[bool, str]:
        if not self._plane.has_certificates:
            return False, "the entrance and egress certificates are not loaded yet"
        if not self._registry.loaded:
            return False, "no peer registry has been published yet"
        if self._pool is not None and not self._pool.alive():
            return False, "a gateway worker process is not running; it is being started again"
        if self._pool is not None and not self._pool.synced():
            return False, "the gateway workers have not applied the latest registry and certificates yet"
        return True, "ok"

    def metrics_text(self) -> bytes:
        return generate_latest(self.metrics.registry)

    async def _scrape(self) -> bytes:
        own = self.metrics_text()
        return own if self._pool is None else await self._pool.scrape(own.decode())

    def exchange_outcome(self, connector_id: str, failure: tuple[str, str] | None) -> None:
        """Record how the last exchange through `connector_id` went (None: it worked)."""
        self._failures.record(connector_id, failure)
