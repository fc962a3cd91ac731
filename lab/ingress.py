"""The lab's load-balancing edge: an ingress-nginx stand-in and a TCP passthrough.

`Ingress` terminates TLS for `peering.<c>.lab` and forwards over plain HTTP to the peering process's join
listener, as the cluster's ingress-nginx does: streaming both ways, hop-by-hop headers dropped, and the client's
address put in `X-Forwarded-For` (replacing whatever the client sent, as ingress-nginx does when it does not
trust forwarded headers). It listens from the start so that its address can go into every resolver map before the
peering process exists; until `set_backends()` it answers 503, as ingress-nginx does for a Service without
endpoints.

`TcpPassthrough` stands for the LoadBalancer Service (or ingress-nginx SSL passthrough) in front of the entrance,
and for the `peering-gateway.d8-peering.svc` Service in front of the egress: it splices TCP bytes and never
touches TLS, so the peering process's own certificates and client-certificate checks are what a client sees.

Both spread connections across several backends (the replicas of the Deployment behind one Service): round robin,
a new upstream connection per client connection (the ingress: per request). A backend that refuses the connection
is skipped and the next one tried, as ingress-nginx's `proxy_next_upstream error` and kube-proxy's skipping of an
endpoint that is gone do; a request already sent to a backend that then fails is not sent again (502, or the
client's connection closed; a backend's reset is passed on at once). `served` counts the connections each backend
port was given.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import ssl
from typing import Iterable

import aiohttp
from aiohttp import web

log = logging.getLogger(__name__)

# RFC 9110 §7.6.1 connection-specific headers, plus those the proxy computes itself.
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "TE",
        "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
    )
)
_FORWARDED = frozenset(("x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-port", "x-real-ip", "forwarded"))
# ingress-nginx's default proxy-body-size.
MAX_BODY = 1024 * 1024


def forward_headers(incoming: "aiohttp.typedefs.LooseHeaders", client_ip: str, host: str, port: int) -> dict[str, str]:
    """The request headers the backend gets: the client's, without hop-by-hop or forged forwarding headers."""
    items = incoming.items() if hasattr(incoming, "items") else incoming
    connection_tokens = set()
    out: dict[str, str] = {}
    for name, value in items:
        lname = name.lower()
        if lname == "connection":
            connection_tokens |= {t.strip().lower() for t in value.split(",")}
            continue
        if lname in _HOP_BY_HOP or lname in _FORWARDED:
            continue
        out[name] = value
    for name in list(out):
        if name.lower() in connection_tokens:
            del out[name]
    out["X-Forwarded-For"] = client_ip
    out["X-Real-IP"] = client_ip
    out["X-Forwarded-Host"] = host
    out["X-Forwarded-Proto"] = "https"
    out["X-Forwarded-Port"] = str(port)
    out["X-Scheme"] = "https"
    # ingress-nginx gives every request an id unless the client brought one.
    if not any(k.lower() == "x-request-id" for k in out):
        out["X-Request-ID"] = secrets.token_hex(16)
    return out


def response_headers(upstream: "aiohttp.typedefs.LooseHeaders") -> dict[str, str]:
    items = upstream.items() if hasattr(upstream, "items") else upstream
    return {k: v for k, v in items if k.lower() not in _HOP_BY_HOP}


async def pass_back(request: web.Request, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
    """`upstream`'s answer passed back to `request`'s client as it comes: status, end-to-end headers, the length
    it declared, the body chunk by chunk (a watch's stream too). One side gone mid-answer ends the other: a client
    that left stops the reading, and an upstream cut mid-answer aborts the client's connection, so that the client
    sees the cut as a real proxy shows it, never a shorter answer that looks whole."""
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                  headers=response_headers(upstream.headers))
    if upstream.content_length is not None:
        response.content_length = upstream.content_length
    try:
        await response.prepare(request)
        while True:
            try:
                chunk = await upstream.content.readany()
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                log.info("%s %s: the upstream cut its answer (%s); so is the client's", request.method, request.path,
                         type(e).__name__)
                if request.transport is not None:
                    request.transport.abort()
                return response
            if not chunk:
                break
            await response.write(chunk)
        await response.write_eof()
    except ConnectionResetError:  # the client left (a watch it ended): nothing more to pass on
        pass
    return response


class Backends:
    """The ports behind one Service, taken in turn: `order()` gives every live port once, starting with the next
    one of the round robin, so that a caller tries the others when one refuses."""

    def __init__(self, ports: Iterable[int] = ()) -> None:
        self._turn = itertools.count()
        self.served: dict[int, int] = {}
        self.set(ports)

    def set(self, ports: Iterable[int | None]) -> None:
        self.ports = [p for p in ports if p is not None]

    def order(self) -> list[int]:
        ports = self.ports
        if not ports:
            return []
        start = next(self._turn) % len(ports)
        return ports[start:] + ports[:start]

    def given(self, port: int) -> None:
        self.served[port] = self.served.get(port, 0) + 1


class Ingress:
    """TLS-terminating reverse proxy on 127.0.0.1 for one host name, to `http://127.0.0.1:<backend port>`."""

    def __init__(self, host: str, ssl_context: ssl.SSLContext, backend_port: int | None = None) -> None:
        self.host = host
        self._ssl = ssl_context
        self.backends = Backends([backend_port] if backend_port is not None else [])
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def backend_port(self) -> int | None:
        """The first backend (of one, before replicas)."""
        return self.backends.ports[0] if self.backends.ports else None

    def set_backend(self, port: int | None) -> None:
        """One backend, or none (503)."""
        self.set_backends([] if port is None else [port])

    def set_backends(self, ports: Iterable[int]) -> None:
        """The join listeners of every live replica; none: 503."""
        self.backends.set(ports)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        # No pooling: each proxied request gets its own upstream connection, so a client going away
        # tears down exactly its own upstream stream.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=10),
        )
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._proxy)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=self._ssl)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        order = self.backends.order()
        if not order:
            return web.Response(status=503, text="503 Service Temporarily Unavailable: the backend has no endpoints yet\n")
        if request.headers.get("Upgrade"):
            return web.Response(status=400, text="connection upgrades are not served on this host\n")
        if request.content_length is not None and request.content_length > MAX_BODY:
            return web.Response(status=413, text="413 Request Entity Too Large\n")
        assert self._session is not None
        peer = request.transport.get_extra_info("peername") if request.transport else None
        client_ip = peer[0] if peer else "127.0.0.1"
        headers = forward_headers(request.headers, client_ip, self.host, self.port)
        body = request.content if request.body_exists else None
        for port in order:
            url = f"http://127.0.0.1:{port}{request.rel_url}"
            try:
                async with self._session.request(
                    request.method, url, headers=headers, data=body, allow_redirects=False,
                ) as upstream:
                    self.backends.given(port)
                    return await pass_back(request, upstream)
            except aiohttp.ClientConnectorError as e:
                # Not connected, so nothing of the request was sent: the next backend gets it (proxy_next_upstream).
                log.info("ingress %s: backend 127.0.0.1:%s refused: %s; trying the next", self.host, port, e)
                continue
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
                log.info("ingress %s: backend 127.0.0.1:%s failed: %s", self.host, port, e)
                return web.Response(status=502, text="502 Bad Gateway\n")
        return web.Response(status=502, text="502 Bad Gateway: no backend accepted the connection\n")


class TcpPassthrough:
    """Splices TCP connections from its own loopback port to `127.0.0.1:<target port>`, TLS untouched."""

    def __init__(self, name: str, target_port: int | None = None) -> None:
        self.name = name
        self.backends = Backends([target_port] if target_port is not None else [])
        self.port = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task] = set()

    @property
    def target_port(self) -> int | None:
        """The first target (of one, before replicas)."""
        return self.backends.ports[0] if self.backends.ports else None

    def set_target(self, port: int | None) -> None:
        """One target, or none (connections closed at once)."""
        self.set_targets([] if port is None else [port])

    def set_targets(self, ports: Iterable[int]) -> None:
        """The listeners of every live replica, taken in turn; none: connections closed at once."""
        self.backends.set(ports)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = await asyncio.start_server(self._accept, host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._conns):
            task.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await self._splice(reader, writer)
        finally:
            self._conns.discard(task)

    async def _splice(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up = None
        for port in self.backends.order():
            try:
                up = await asyncio.open_connection("127.0.0.1", port)
            except OSError as e:
                log.info("passthrough %s: target 127.0.0.1:%s refused: %s; trying the next", self.name, port, e)
                continue
            self.backends.given(port)
            break
        if up is None:
            # No endpoints, or none accepts: the connection is closed, as a LoadBalancer without endpoints does.
            writer.close()
            return
        up_reader, up_writer = up

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> bool:
            """Copy until EOF (True, passed on as a half-close) or a reset (False)."""
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
                if dst.can_write_eof():
                    dst.write_eof()
                return True
            except (ConnectionError, OSError):
                return False

        a = asyncio.ensure_future(pump(reader, up_writer))
        b = asyncio.ensure_future(pump(up_reader, writer))
        try:
            # One direction ending (EOF) is a half-close: let the other finish, within bounds. A reset (a backend
            # that died) tears both sides down at once, as the kernel's connection tracking passes a RST on: the
            # client must not wait for an answer that cannot come.
            done, pending = await asyncio.wait([a, b], return_when=asyncio.FIRST_COMPLETED)
            if not all(t.result() for t in done):
                for w in (writer, up_writer):
                    w.transport.abort()
            elif pending:
                await asyncio.wait(pending, timeout=30)
        finally:
            for t in (a, b):
                t.cancel()
            await asyncio.gather(a, b, return_exceptions=True)
            for w in (writer, up_writer):
                w.close()
