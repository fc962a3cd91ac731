"""The data plane of one process: the listeners it serves over one `GatewayState`. The process's `Gateway`
(server.py) composes one for its own listeners, and each worker process (worker.py) one for the entrance and the
egress. Only I/O lives here: the TLS acceptors of the entrance and the egress with the engine's protocol
(engine.Connection, carrying out a serving.Serving, each with its listener's ways: listeners.py), aiohttp's
low-level servers of the join and ops listeners, bound to their sockets; what a request may do is decided in
admission.py."""

from __future__ import annotations

import asyncio
import socket
import ssl
from dataclasses import dataclass
from typing import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from contract import reasons
from gateway.config import GatewayConfig
from gateway.engine import Connection
from gateway.http import HTTPProtocol, HTTPServer, status_response
from gateway.join import Join
from gateway.listeners import Egress, Entrance
from gateway.metrics import Metrics
from gateway.protocol import ControlHandlers
from gateway.registry import Registry
from gateway.state import GatewayState
from gateway.tls import TLSAcceptor, server_context
from gateway.tlsstream import TLSStream

LISTENERS = ("entrance", "egress", "join", "ops")
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Certificates:
    """The server contexts new handshakes of the entrance and the egress get."""

    entrance: ssl.SSLContext
    egress: ssl.SSLContext

    @classmethod
    def from_pem(cls, *, entrance_cert_pem: bytes, entrance_key_pem: bytes, ca_pem: bytes, egress_cert_pem: bytes,
                 egress_key_pem: bytes) -> "Certificates":
        """Raises ValueError saying what is wrong when they do not load."""
        return cls(entrance=server_context(entrance_cert_pem, entrance_key_pem, ca_pem),
                   egress=server_context(egress_cert_pem, egress_key_pem, None))


class DataPlane:
    """Serves `listeners` (some of entrance, egress, join, ops) once started. `readiness` and `scrape` answer the
    ops listener's /readyz and /metrics for the whole gateway; `on_exchange` hears how each Dex exchange went."""

    def __init__(self, config: GatewayConfig, handlers: ControlHandlers, metrics: Metrics, *,
                 listeners: tuple[str, ...] = LISTENERS,
                 readiness: Callable[[], tuple[bool, str]] = lambda: (True, "ok"),
                 scrape: Callable[[], Awaitable[bytes]] | None = None,
                 on_exchange: Callable[[str, tuple[str, str] | None], None] | None = None) -> None:
        unknown = set(listeners) - set(LISTENERS)
        if unknown:
            raise ValueError(f"unknown listeners {sorted(unknown)}; a data plane serves some of {', '.join(LISTENERS)}")
        self.config = config
        self.handlers = handlers
        self.metrics = metrics
        self.listeners = listeners
        self._readiness = readiness
        self._scrape = scrape
        self._on_exchange = on_exchange
        self.state: GatewayState | None = None
        self.ports: dict[str, int] = {}
        self._certs: Certificates | None = None
        self._servers: list[asyncio.AbstractServer] = []
        self._http: list[HTTPServer] = []
        self._acceptors: list[TLSAcceptor] = []
        #: The egress's connections after their handshake (the entrance's are `state.connections`'): ended at stop.
        self._egress_streams: set[TLSStream] = set()

    async def start(self, registry: Registry, sockets: dict[str, socket.socket] | None = None) -> None:
        """Bind the listeners (or serve the given pre-bound sockets, as a worker does)."""
        cfg, limits = self.config, self.config.limits
        loop = asyncio.get_running_loop()
        state = self.state = GatewayState.open(cfg, self.metrics, registry, self._on_exchange)
        http_kwargs = dict(max_line_size=limits.max_header_bytes, max_field_size=limits.max_header_bytes,
                           max_headers=limits.max_headers, keepalive_timeout=limits.idle_timeout,
                           auto_decompress=False, read_bufsize=_CHUNK, head_timeout=limits.request_head_timeout)
        join_http = HTTPServer(Join(state, self.handlers), on_refused=_refused_head(state, "join"), **http_kwargs)
        ops_http = HTTPServer(self._ops, **http_kwargs)
        self._http = [join_http, ops_http]
        count = self.metrics.handshake_failures
        peers, consumers = Entrance(), Egress()
        entrance = TLSAcceptor(name="entrance", context=lambda: self._certs and self._certs.entrance,
                               make_protocol=lambda fp: Connection(state, self.handlers, peers, fp),
                               admit=state.connections.admit,
                               count_failure=lambda reason: count.labels("entrance", reason).inc(),
                               handshake_timeout=limits.handshake_timeout, max_connections=limits.max_connections,
                               on_connect=state.connections.track, on_lost=state.connections.untrack)
        egress = TLSAcceptor(name="egress", context=lambda: self._certs and self._certs.egress,
                             # No client certificate on the egress: no fingerprint.
                             make_protocol=lambda admitted: Connection(state, self.handlers, consumers, None),
                             admit=lambda transport: True,
                             count_failure=lambda reason: count.labels("egress", reason).inc(),
                             handshake_timeout=limits.handshake_timeout, max_connections=limits.max_connections,
                             on_connect=lambda stream, admitted: self._egress_streams.add(stream),
                             on_lost=self._egress_streams.discard)
        self._acceptors = [entrance, egress]
        # Read at each scrape: every TCP connection an acceptor holds, from its accept to its end.
        for acceptor in self._acceptors:
            self.metrics.connections.labels(acceptor.name).set_function(lambda a=acceptor: a.open)
        factories = {"entrance": (entrance, cfg.entrance_host, cfg.entrance_port),
                     "egress": (egress, cfg.egress_host, cfg.egress_port),
                     "join": (join_http, cfg.join_host, cfg.join_port),
                     "ops": (ops_http, cfg.ops_host, cfg.ops_port)}
        try:
            for name in self.listeners:
                factory, host, port = factories[name]
                if sockets is not None:
                    if name not in sockets:
                        continue
                    server = await loop.create_server(factory, sock=sockets[name], backlog=4096)
                else:
                    server = await loop.create_server(factory, host, port, backlog=4096, reuse_address=True)
                self._servers.append(server)
                self.ports[name] = server.sockets[0].getsockname()[1]
        except BaseException:
            await self.stop()
            raise

    def publish(self, registry: Registry) -> None:
        if self.state is not None:
            self.state.publish(registry)

    def reload_certificates(self, certs: Certificates) -> None:
        """New handshakes get these; open connections keep theirs."""
        self._certs = certs

    @property
    def has_certificates(self) -> bool:
        return self._certs is not None

    async def stop(self) -> None:
        """Close the listeners, every connection and every upstream session."""
        for server in self._servers:
            server.close()
        for acceptor in self._acceptors:
            await acceptor.close()
        if self.state is not None:
            self.state.connections.abort_all()
        for stream in list(self._egress_streams):
            stream.abort()
        self._egress_streams.clear()
        for http in self._http:
            for conn in http.connections:
                if conn.transport is not None:
                    conn.transport.abort()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        if self.state is not None:
            await self.state.close()
        # Let handler tasks that the aborts above cancelled run to their end.
        for _ in range(3):
            await asyncio.sleep(0)

    async def _ops(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path == "/healthz":
            return web.Response(text="ok")
        if path == "/readyz":
            ready, why = self._readiness()
            return web.Response(status=200 if ready else 503, text=why)
        if path == "/metrics" and self._scrape is not None:
            return web.Response(body=await self._scrape(), headers={"Content-Type": CONTENT_TYPE_LATEST})
        return status_response(404, reasons.NOT_FOUND, "the ops listener serves /healthz, /readyz and /metrics")


def _refused_head(state: GatewayState, listener: str) -> Callable[[HTTPProtocol, int, str], None]:
    """What accounts for a request of `listener` that the HTTP edge refused before its handler saw it (no peer:
    the join's clients are not peers)."""
    return lambda proto, code, reason: state.accounting.refused_head(listener, "-", code, reason)
