"""The gateway process edge: four listeners, the registry swap, certificate reloads, and the request paths.

The rules live in headers.py, tokens.py and exchange.py; this file only moves requests and bytes between them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, Callable

import aiohttp
from aiohttp import web
from aiohttp.client_exceptions import ClientPayloadError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from yarl import URL

from contract import reasons
from gateway.config import GatewayConfig
from gateway.entrance import EntranceProtocol, RelayPool
from gateway.exchange import DexClient, ExchangeCache
from gateway.headers import bearer, check_request, forwarded_headers, request_head, response_headers
from gateway.http import JSON, HTTPProtocol, HTTPServer, status_response
from gateway.metrics import Metrics
from gateway.protocol import ControlHandlers, JoinCall, PeerCall
from contract.names import SA_PREFIX, audience
from contract.paths import JOIN_PATH, PEER_OPS, PEER_PREFIX
from contract.errors import Refusal
from gateway.registry import Peer, Registry
from gateway.resolve import OverrideResolver
from gateway.tls import TLSAcceptor, client_context, peer_fingerprint, server_context
from gateway.upstream import UpstreamError, UpstreamPool
from gateway.tokens import KeySets, VerifiedToken, unverified_expiry, verify_peer_token

access_log = logging.getLogger("gateway.access")
log = logging.getLogger("gateway")

_CHUNK = 64 * 1024
_SMALL_BODY = 64 * 1024  # answers up to this size are sent in one write; larger ones stream


@dataclass(frozen=True)
class _Certificates:
    entrance: ssl.SSLContext
    egress: ssl.SSLContext


class Gateway:
    """The data plane. Build it with a config and the control loop's handlers, `await start()`, then feed it
    registries with `publish` and certificates with `reload_certificates`."""

    def __init__(self, config: GatewayConfig, handlers: ControlHandlers) -> None:
        self.config = config
        self.handlers = handlers
        self.metrics = Metrics()
        # Metric children looked up once: labels() takes a lock and builds a tuple on every call.
        self._in_flight = {n: self.metrics.in_flight.labels(n) for n in ("entrance", "egress")}
        self._latency = {n: self.metrics.latency.labels(n) for n in ("entrance", "egress", "join")}
        self._request_counters: dict[tuple, Any] = {}
        self.entrance_port = 0
        self.join_port = 0
        self.egress_port = 0
        self.ops_port = 0
        self._registry = Registry.empty()
        self._certs: _Certificates | None = None
        self._verified: dict[bytes, VerifiedToken] = {}
        self._keysets = KeySets()
        # Entrance connections by client certificate fingerprint (raw-path EntranceProtocol or aiohttp's).
        self._by_fp: dict[str | None, set[Any]] = {}
        self._servers: list[asyncio.AbstractServer] = []
        self._http: list[HTTPServer] = []
        self._acceptors: list[TLSAcceptor] = []
        self._api_session: aiohttp.ClientSession | None = None
        self._dex_session: aiohttp.ClientSession | None = None
        self._peer_pools: dict[str, tuple[bytes, UpstreamPool]] = {}
        self._retired_pools: list[UpstreamPool] = []
        self._api_pool: UpstreamPool | None = None
        self._relay_pool: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._resolver: OverrideResolver | None = None
        self._exchange: ExchangeCache | None = None
        self._reviews: ExchangeCache | None = None
        self._join_failures: dict[str, list[float]] = {}
        #: The last failed token exchange per Dex connector, (reason, message), cleared by a success; the control
        #: loop shows it in the ClusterPeer's TokenExchangeReady. Workers report theirs to the parent.
        self.exchange_failures: dict[str, tuple[str, str]] = {}
        #: Called with the connector whenever its entry in `exchange_failures` changes.
        self.on_exchange_change: Callable[[str], None] | None = None
        self._pool: Any = None
        self._started = False
        limits = config.limits
        self._api_base = config.api_server.rstrip("/")
        self._stream_timeout = aiohttp.ClientTimeout(total=None, connect=limits.upstream_connect_timeout,
                                                     sock_read=limits.idle_timeout)

    # ----- lifecycle ---------------------------------------------------------------------------------------
    async def start(self, sockets: dict[str, socket.socket] | None = None) -> None:
        """Bind all listeners (or serve the given pre-bound sockets, as a worker does) and open the sessions.
        With more than one worker, the entrance and egress are served by worker processes."""
        cfg, limits = self.config, self.config.limits
        loop = self.loop = asyncio.get_running_loop()
        workers = cfg.workers if cfg.workers > 0 else (os.cpu_count() or 1)
        if workers > 1 and not sockets:
            from gateway.workers import WorkerPool
            self._pool = WorkerPool(cfg, self.handlers, lambda: self._registry, workers,
                                    on_exchange=self.exchange_outcome)
            sockets = {}
            try:
                await self._pool.start()
            except BaseException:
                await self.stop()
                raise
            self.entrance_port, self.egress_port = self._pool.entrance_port, self._pool.egress_port
        self._resolver = OverrideResolver(cfg.resolve)
        self._api_session = self._session(client_context(cfg.api_ca_pem), 16)
        self._api_pool = UpstreamPool(URL(cfg.api_server).raw_authority, client_context(cfg.api_ca_pem),
                                      self._resolver, connect_timeout=limits.upstream_connect_timeout,
                                      idle_timeout=limits.idle_timeout, max_idle=limits.upstream_pool_size,
                            reuse_idle=limits.upstream_reuse_idle)
        self._relay_pool = RelayPool(URL(cfg.api_server).raw_authority, client_context(cfg.api_ca_pem),
                                     self._resolver, connect_timeout=limits.upstream_connect_timeout,
                                     idle_timeout=limits.idle_timeout, max_idle=limits.upstream_pool_size,
                            reuse_idle=limits.upstream_reuse_idle)
        self._api_prefix = URL(cfg.api_server).raw_path.rstrip("/")
        self._dex_session = self._session(client_context(cfg.dex_ca_pem), 64, skip=("User-Agent",))
        dex = DexClient(self._dex_session, cfg.token_endpoint, cfg.dex_client_id, cfg.dex_client_secret,
                        cfg.dex_audience, limits.exchange_timeout, self._observe_dex, self.exchange_outcome)
        self._exchange = ExchangeCache(dex, margin=limits.exchange_refresh_margin)
        self._reviews = ExchangeCache(self._token_review, margin=0)
        http_kwargs = dict(max_line_size=limits.max_header_bytes, max_field_size=limits.max_header_bytes,
                           max_headers=limits.max_headers, keepalive_timeout=limits.idle_timeout,
                           auto_decompress=False, read_bufsize=_CHUNK)
        entrance_http = HTTPServer(self._entrance, **http_kwargs)
        egress_http = HTTPServer(self._egress, **http_kwargs)
        join_http = HTTPServer(self._join, **http_kwargs)
        ops_http = HTTPServer(self._ops, **http_kwargs)
        self._http = [entrance_http, egress_http, join_http, ops_http]
        entrance = TLSAcceptor(name="entrance", context=lambda: self._certs and self._certs.entrance,
                               make_protocol=lambda: EntranceProtocol(self, entrance_http), admit=self._admit_entrance,
                               count_failure=lambda reason: self.metrics.handshake_failures.labels("entrance", reason).inc(),
                               handshake_timeout=limits.handshake_timeout, max_connections=limits.max_connections,
                               on_connect=self._track)
        egress = TLSAcceptor(name="egress", context=lambda: self._certs and self._certs.egress,
                             make_protocol=egress_http, admit=lambda transport: True,
                             count_failure=lambda reason: self.metrics.handshake_failures.labels("egress", reason).inc(),
                             handshake_timeout=limits.handshake_timeout, max_connections=limits.max_connections)
        self._acceptors = [entrance, egress]
        sockets = sockets or {}
        plan = [("entrance", entrance, cfg.entrance_host, cfg.entrance_port),
                ("egress", egress, cfg.egress_host, cfg.egress_port),
                ("join", join_http, cfg.join_host, cfg.join_port),
                ("ops", ops_http, cfg.ops_host, cfg.ops_port)]
        if self._pool is not None:
            plan = plan[2:]
        self._started = True
        try:
            for name, factory, host, port in plan:
                if sockets:
                    if name not in sockets:
                        continue
                    server = await loop.create_server(factory, sock=sockets[name], backlog=4096)
                else:
                    server = await loop.create_server(factory, host, port, backlog=4096, reuse_address=True)
                self._servers.append(server)
                setattr(self, f"{name}_port", server.sockets[0].getsockname()[1])
        except BaseException:
            await self.stop()
            raise

    def _session(self, ctx: ssl.SSLContext, limit: int,
                 skip: tuple[str, ...] = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
                 ) -> aiohttp.ClientSession:
        # Proxied requests carry exactly the client's headers: aiohttp adds none of its own.
        connector = aiohttp.TCPConnector(ssl=ctx, limit=0, limit_per_host=limit, resolver=self._resolver,
                                         keepalive_timeout=self.config.limits.idle_timeout, ttl_dns_cache=None,
                                         enable_cleanup_closed=False)
        return aiohttp.ClientSession(connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                                     skip_auto_headers=skip,
                                     timeout=self._stream_timeout)

    async def stop(self) -> None:
        """Close the listeners, every connection and every upstream session (and the workers)."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.stop()
        for server in self._servers:
            server.close()
        for acceptor in self._acceptors:
            await acceptor.close()
        for conns in list(self._by_fp.values()):
            for conn in list(conns):
                if conn.transport is not None:
                    conn.transport.abort()
        for http in self._http:
            for conn in http.connections:
                if conn.transport is not None:
                    conn.transport.abort()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        for cache in (self._exchange, self._reviews):
            if cache is not None:
                await cache.close()
        for session in (self._api_session, self._dex_session):
            if session is not None:
                await session.close()
        for pool in (self._api_pool, self._relay_pool, *(p for _, p in self._peer_pools.values()), *self._retired_pools):
            if pool is not None:
                await pool.close()
        self._peer_pools.clear()
        self._retired_pools.clear()
        if self._resolver is not None:
            await self._resolver.close()
        # Let handler tasks that the aborts above cancelled run to their end.
        for _ in range(3):
            await asyncio.sleep(0)

    # ----- inputs from the control loop ----------------------------------------------------------------------
    def publish(self, registry: Registry) -> None:
        """Swap the registry; connections of peers that left it are closed now."""
        old, self._registry = self._registry, registry
        if self._pool is not None:
            self._pool.publish(registry)
        if old.generation != registry.generation or old is not registry:
            self._verified = {}
        for fp in [fp for fp in self._by_fp if fp not in registry.by_fingerprint]:
            for conn in list(self._by_fp.get(fp, ())):
                if conn.transport is not None:
                    self.metrics.revoked.inc()
                    conn.transport.abort()

    def reload_certificates(self, *, entrance_cert_pem: bytes, entrance_key_pem: bytes, ca_pem: bytes,
                            egress_cert_pem: bytes, egress_key_pem: bytes) -> None:
        """Serve new handshakes with these certificates; open connections keep theirs. Raises ValueError with
        what is wrong when they do not load, and keeps the previous ones then."""
        self._certs = _Certificates(
            entrance=server_context(entrance_cert_pem, entrance_key_pem, ca_pem),
            egress=server_context(egress_cert_pem, egress_key_pem, None))
        if self._pool is not None:
            self._pool.reload_certificates(dict(
                entrance_cert_pem=entrance_cert_pem, entrance_key_pem=entrance_key_pem, ca_pem=ca_pem,
                egress_cert_pem=egress_cert_pem, egress_key_pem=egress_key_pem))

    @property
    def registry(self) -> Registry:
        return self._registry

    def readiness(self) -> tuple[bool, str]:
        if self._certs is None:
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

    # ----- entrance ------------------------------------------------------------------------------------------
    def _admit_entrance(self, transport: asyncio.BaseTransport) -> str | None | bool:
        fp = peer_fingerprint(transport)
        conns = self._by_fp.get(fp)
        if conns is not None and len(conns) >= self.config.limits.max_connections_per_peer:
            self.metrics.handshake_failures.labels("entrance", "peer_connection_limit").inc()
            return False
        return fp

    def _track(self, proto: HTTPProtocol, fp: str | None) -> None:
        proto.peering_fp = fp
        self._by_fp.setdefault(fp, set()).add(proto)
        proto._peering_on_lost = self._untrack

    def _untrack(self, proto: HTTPProtocol) -> None:
        conns = self._by_fp.get(proto.peering_fp)
        if conns is not None:
            conns.discard(proto)
            if not conns:
                del self._by_fp[proto.peering_fp]

    async def _entrance(self, request: web.BaseRequest) -> web.StreamResponse:
        start = time.perf_counter()
        proto: HTTPProtocol = request.protocol  # type: ignore[assignment]
        registry = self._registry
        peer = registry.by_fingerprint.get(proto.peering_fp)  # type: ignore[arg-type]
        peer_name = peer.name if peer is not None else "-"
        caps = "-"
        code = 500
        metrics = self.metrics
        in_flight = self._in_flight["entrance"]
        in_flight.inc()
        try:
            if peer is None:
                raise Refusal(403, reasons.PEER_UNKNOWN, "this client certificate belongs to no live peering of this "
                              "cluster; if the ClusterPeer was deleted, create the peering again")
            path = request.raw_path
            if path.startswith(PEER_PREFIX):
                resp = await self._peer_call(request, peer, path)
                code = resp.status
                return resp
            check_request(request.raw_headers)
            token = bearer(request.headers.get("Authorization"), self.config.limits.max_token_bytes)
            token_hash = hashlib.sha256(token.encode()).digest()
            verified = self._verified.get(token_hash)
            now = time.time()
            if verified is None or verified.peer != peer.name:
                verified = self._verify_token(token, token_hash, peer, registry, now)
            elif verified.expires + self.config.limits.token_skew <= now:
                self._verified.pop(token_hash, None)
                raise Refusal(401, reasons.TOKEN_EXPIRED, "the token has expired; read the projected token file again")
            caps = ",".join(sorted(verified.capabilities))
            assert self._exchange is not None
            exchanged = self._exchange.cached(peer.connector_id, token_hash)
            if exchanged is None:
                not_after = time.monotonic() + (verified.expires - now)
                exchanged = await self._exchange.get(peer.connector_id, token_hash, token, not_after=not_after)
            else:
                metrics.exchange_hits.inc()
            resp = await self._proxy(request, "entrance", peer_name, self._api_pool, self._api_prefix + path,
                                     b"Bearer " + exchanged.encode())
            code = resp.status
            return resp
        except Refusal as refusal:
            code = refusal.code
            return status_response(refusal.code, refusal.reason, refusal.message, close=refusal.reason == reasons.PEER_UNKNOWN)
        finally:
            in_flight.dec()
            self._finish("entrance", peer_name, caps, request.method, request.path, code, start)

    def _verify_token(self, token: str, token_hash: bytes, peer: Peer, registry: Registry,
                      now: float) -> VerifiedToken:
        """Verify a peer's token (raises Refusal) and remember it by its hash until the next registry."""
        verified = verify_peer_token(token, peer, registry, self._keysets, now=now,
                                     skew=self.config.limits.token_skew,
                                     max_bytes=self.config.limits.max_token_bytes)
        if len(self._verified) > 100_000:
            self._verified.clear()
        self._verified[token_hash] = verified
        return verified

    async def _peer_call(self, request: web.BaseRequest, peer: Peer, path: str) -> web.StreamResponse:
        op = path[len(PEER_PREFIX):].split("?", 1)[0]
        method = PEER_OPS.get(op)
        if method is None:
            raise Refusal(404, reasons.UNKNOWN_OPERATION, f"/peering/v1/{op[:40]} is not a peering operation; this gateway "
                          f"serves {', '.join(sorted(PEER_OPS))}")
        if request.method != method:
            raise Refusal(405, reasons.METHOD_NOT_ALLOWED, f"/peering/v1/{op} takes {method}")
        body = None
        if method == "POST":
            body = await _read_json(request, self.config.limits.max_peer_call_bytes)
        try:
            answer = await self.handlers.peer_call(PeerCall(peer=peer, op=op, body=body))
        except Refusal as err:
            return status_response(err.code, err.reason, err.message)
        return web.Response(body=json.dumps(answer).encode(), content_type=JSON)

    # ----- egress --------------------------------------------------------------------------------------------
    async def _egress(self, request: web.BaseRequest) -> web.StreamResponse:
        start = time.perf_counter()
        peer_name, caps, code = "-", "-", 500
        self._in_flight["egress"].inc()
        try:
            path = request.raw_path
            if not path.startswith("/peers/"):
                raise Refusal(404, reasons.NOT_FOUND, "the egress serves /peers/<clusterpeer>/<Kubernetes API path>")
            name, _, rest = path[len("/peers/"):].partition("/")
            registry = self._registry
            peer = registry.peers.get(name)
            if peer is None:
                raise Refusal(404, reasons.PEER_NOT_FOUND, f"no live ClusterPeer named {name[:63]!r}; check "
                              "`kubectl get clusterpeers` and status.access.endpoint")
            peer_name = peer.name
            if not peer.entrance or not peer.peer_ca_pem or not peer.client_cert_pem or not peer.client_key_pem:
                raise Refusal(503, reasons.PEER_NOT_CONNECTED, f"the peering {peer.name} has no credentials toward the "
                              "peer yet; wait until its phase is Active")
            check_request(request.raw_headers)
            token = bearer(request.headers.get("Authorization"), self.config.limits.max_token_bytes)
            allowed = await self._review(token, peer, registry)
            caps = ",".join(sorted(allowed))
            pool = self._peer_pool(peer)
            resp = await self._proxy(request, "egress", peer_name, pool, "/" + rest, b"Bearer " + token.encode())
            code = resp.status
            return resp
        except Refusal as refusal:
            code = refusal.code
            return status_response(refusal.code, refusal.reason, refusal.message)
        finally:
            self._in_flight["egress"].dec()
            self._finish("egress", peer_name, caps, request.method, request.path, code, start)

    async def _review(self, token: str, peer: Peer, registry: Registry) -> frozenset[str]:
        if not peer.effective:
            raise Refusal(403, reasons.NO_EFFECTIVE_CAPABILITY, f"no capability is effective for peering {peer.name}; "
                          "open one in spec.capabilities on both clusters")
        assert self._reviews is not None
        token_hash = hashlib.sha256(token.encode()).digest()
        key = f"{peer.name}/{registry.generation}"
        exp = unverified_expiry(token)
        not_after = time.monotonic() + min(self.config.limits.token_review_ttl,
                                           (exp - time.time()) if exp else self.config.limits.token_review_ttl)
        cached = self._reviews.cached(key, token_hash)
        result = cached if cached is not None else await self._reviews.get(key, token_hash, token,
                                                                            not_after=not_after)
        return frozenset(result.split(",")) if result else frozenset()

    async def _token_review(self, key: str, token: str) -> tuple[str, float]:
        """TokenReview of a local consumer's token for the audiences of the peer's effective capabilities."""
        registry = self._registry
        peer = registry.peers.get(key.rsplit("/", 1)[0])
        if peer is None:
            raise Refusal(404, reasons.PEER_NOT_FOUND, "the peering was removed while the request was checked")
        wanted = {audience(peer.uuid, c): c for c in sorted(peer.effective)}
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                  "spec": {"token": token, "audiences": list(wanted)}}
        assert self._api_session is not None
        try:
            async with self._api_session.post(
                    URL(self._api_base + "/apis/authentication.k8s.io/v1/tokenreviews", encoded=True),
                    data=json.dumps(review).encode(),
                    headers={"Authorization": "Bearer " + self.config.api_token(), "Content-Type": JSON,
                             "Accept": JSON},
                    timeout=aiohttp.ClientTimeout(total=self.config.limits.exchange_timeout)) as resp:
                body = await resp.json(content_type=None) if resp.status in (200, 201) else None
                status = resp.status
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            self.metrics.upstream_errors.labels("egress", "token_review").inc()
            raise Refusal(503, reasons.TOKEN_REVIEW_UNAVAILABLE, f"the API server cannot review the token now "
                          f"({type(exc).__name__}); retry") from None
        if not isinstance(body, dict):
            raise Refusal(503, reasons.TOKEN_REVIEW_UNAVAILABLE, f"the API server answered {status} to the TokenReview; "
                          "check the gateway's RBAC for tokenreviews")
        result = body.get("status") or {}
        if not result.get("authenticated"):
            raise Refusal(401, reasons.TOKEN_INVALID, "the token is not valid for this peering; request a projected "
                          "ServiceAccount token with one of the audiences in status.access.audiences")
        username = (result.get("user") or {}).get("username") or ""
        ns, _, name = username[len(SA_PREFIX):].partition(":") if username.startswith(SA_PREFIX) else ("", "", "")
        # An authenticator that is not audience-aware answers no audiences: that is no grant, not every one.
        granted = [wanted[a] for a in result.get("audiences") or () if a in wanted]
        if not granted:
            raise Refusal(401, reasons.TOKEN_AUDIENCE_MISMATCH, "the token's audience names no capability effective for "
                          f"peering {peer.name}; use an audience listed in its status.access.audiences")
        allowed = sorted(c for c in granted if (cap := registry.capabilities.get(c)) is not None and cap.accepted
                         and (ns, name) in cap.consumers)
        if not allowed:
            raise Refusal(403, reasons.NOT_A_CONSUMER, f"{username or 'the caller'} is not a consumer of a capability "
                          f"effective for peering {peer.name}; add it to spec.consumers of the PeeringCapability")
        return ",".join(allowed), self.config.limits.token_review_ttl

    def _peer_pool(self, peer: Peer) -> UpstreamPool:
        ident = hashlib.sha256(b"\0".join([peer.peer_ca_pem or b"", peer.client_cert_pem or b"",
                                           peer.client_key_pem or b"", (peer.entrance or "").encode()])).digest()
        entry = self._peer_pools.get(peer.name)
        if entry is not None and entry[0] == ident:
            return entry[1]
        try:
            ctx = client_context(peer.peer_ca_pem, peer.client_cert_pem, peer.client_key_pem)
        except (ValueError, ssl.SSLError):
            raise Refusal(503, reasons.PEER_CREDENTIALS_INVALID, f"the credentials of peering {peer.name} do not load; "
                          f"check the Secret peer-{peer.name}") from None
        limits = self.config.limits
        assert self._resolver is not None and peer.entrance
        pool = UpstreamPool(peer.entrance, ctx, self._resolver, connect_timeout=limits.upstream_connect_timeout,
                            idle_timeout=limits.idle_timeout, max_idle=limits.upstream_pool_size,
                            reuse_idle=limits.upstream_reuse_idle)
        if entry is not None:
            # In-flight requests (watches) keep the old pool's connections until they end or the gateway stops.
            self._retired_pools.append(entry[1])
        self._peer_pools[peer.name] = (ident, pool)
        return pool

    # ----- the proxy -----------------------------------------------------------------------------------------
    async def _proxy(self, request: web.BaseRequest, listener: str, peer: str, pool: UpstreamPool, target: str,
                     authorization: bytes) -> web.StreamResponse:
        limits = self.config.limits
        length = request.content_length
        if length is not None and length > limits.max_body_bytes:
            raise Refusal(413, reasons.REQUEST_ENTITY_TOO_LARGE, f"the request body is larger than {limits.max_body_bytes} "
                          "bytes")
        body = None
        chunked = False
        if request.body_exists:
            body = _bounded_body(request, limits.max_body_bytes)
            chunked = length is None
        head = request_head(request.method, target, pool.authority, forwarded_headers(request.raw_headers),
                            authorization, length, chunked)
        is_watch = _is_watch(target.partition("?")[2])
        result: list[web.StreamResponse] = []

        async def relay(message: Any, payload: Any) -> None:
            headers = response_headers(message.headers.items())
            length = message.headers.get("Content-Length")
            if length is not None and not message.chunked and length.isdigit() and int(length) <= _SMALL_BODY:
                # Most API answers are small: one write of head and body, one TLS record, no chunk loop.
                try:
                    body = await payload.read()
                except ClientPayloadError as exc:
                    raise UpstreamError("request", f"the response body ended early ({exc})") from None
                resp = web.Response(status=message.code, reason=message.reason, body=body, headers=headers)
                result.append(resp)
                return
            resp = web.StreamResponse(status=message.code, reason=message.reason, headers=headers)
            if length is not None and not message.chunked and length.isdigit():
                resp.content_length = int(length)
            result.append(resp)
            await resp.prepare(request)
            if is_watch:
                self.metrics.watches.labels(listener, peer).inc()
            try:
                while True:
                    chunk = await payload.readany()
                    if not chunk:
                        break
                    await resp.write(chunk)
                await resp.write_eof()
            except ClientPayloadError as exc:
                # Headers are out: the only honest signal left is to cut the client's connection.
                self.metrics.upstream_errors.labels(listener, "stream").inc()
                if request.transport is not None:
                    request.transport.abort()
                log.info("upstream stream of %s ended early: %r", listener, exc)
            finally:
                if is_watch:
                    self.metrics.watches.labels(listener, peer).dec()

        try:
            await pool.request(head, body, head_only=request.method == "HEAD", chunked=chunked, on_response=relay)
        except _BodyTooLarge:
            raise Refusal(413, reasons.REQUEST_ENTITY_TOO_LARGE, f"the request body is larger than {limits.max_body_bytes} "
                          "bytes") from None
        except UpstreamError as err:
            if result:
                if request.transport is not None:
                    request.transport.abort()
                return result[0]
            self.metrics.upstream_errors.labels(listener, err.kind).inc()
            if err.kind == "connect":
                raise Refusal(503, reasons.UPSTREAM_UNAVAILABLE, f"the upstream API server cannot be reached "
                              f"({err.detail}); retry later") from None
            raise Refusal(502, reasons.UPSTREAM_FAILED, f"the upstream API server failed the request ({err.detail}); "
                          "retry") from None
        return result[0]

    # ----- join and ops --------------------------------------------------------------------------------------
    async def _join(self, request: web.BaseRequest) -> web.StreamResponse:
        start = time.perf_counter()
        code = 500
        remote = request.remote or "-"
        try:
            if request.path != JOIN_PATH:
                raise Refusal(404, reasons.NOT_FOUND, "the join listener serves POST /v1/join only")
            if request.method != "POST":
                raise Refusal(405, reasons.METHOD_NOT_ALLOWED, "/v1/join takes POST")
            now = time.monotonic()
            recent = [t for t in self._join_failures.get(remote, ()) if t > now - 60]
            if len(recent) >= self.config.limits.join_failures_per_minute:
                raise Refusal(429, reasons.TOO_MANY_ATTEMPTS, "too many refused join attempts from this address; wait a "
                              "minute and check the connection string")
            body = await _read_json(request, self.config.limits.max_join_bytes)
            try:
                answer = await self.handlers.join(JoinCall(body=body, remote=remote))
            except Refusal as err:
                if 400 <= err.code < 500:
                    if len(self._join_failures) > 10_000:
                        self._join_failures.clear()
                    self._join_failures[remote] = [*recent, now]
                code = err.code
                return status_response(err.code, err.reason, err.message)
            code = 200
            return web.Response(body=json.dumps(answer).encode(), content_type=JSON)
        except Refusal as refusal:
            code = refusal.code
            return status_response(refusal.code, refusal.reason, refusal.message)
        finally:
            self._finish("join", "-", "-", request.method, request.path, code, start)

    async def _ops(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path == "/healthz":
            return web.Response(text="ok")
        if path == "/readyz":
            ready, why = self.readiness()
            return web.Response(status=200 if ready else 503, text=why)
        if path == "/metrics":
            body = generate_latest(self.metrics.registry)
            if self._pool is not None:
                body = await self._pool.scrape(body.decode())
            return web.Response(body=body,
                                headers={"Content-Type": CONTENT_TYPE_LATEST})
        return status_response(404, reasons.NOT_FOUND, "the ops listener serves /healthz, /readyz and /metrics")

    # ----- observation ---------------------------------------------------------------------------------------
    def exchange_outcome(self, connector_id: str, failure: tuple[str, str] | None) -> None:
        """Record how the last exchange through `connector_id` went (None: it worked)."""
        if self.exchange_failures.get(connector_id) == failure:
            return
        if failure is None:
            self.exchange_failures.pop(connector_id, None)
        else:
            if len(self.exchange_failures) >= 10_000 and connector_id not in self.exchange_failures:
                return  # bounded: far more connectors than peers means something else is wrong
            self.exchange_failures[connector_id] = failure
        if self.on_exchange_change is not None:
            self.on_exchange_change(connector_id)

    def _observe_dex(self, seconds: float, outcome: str) -> None:
        self.metrics.dex_latency.observe(seconds)
        self.metrics.exchange_calls.labels(outcome).inc()

    def _finish(self, listener: str, peer: str, caps: str, method: str, path: str, code: int,
                start: float) -> None:
        elapsed = time.perf_counter() - start
        key = (listener, peer, caps, code // 100)
        counter = self._request_counters.get(key)
        if counter is None:
            if len(self._request_counters) > 10_000:
                self._request_counters.clear()
            counter = self._request_counters[key] = self.metrics.requests.labels(listener, peer, caps,
                                                                                 f"{code // 100}xx")
        counter.inc()
        self._latency[listener].observe(elapsed)
        if self.config.access_log and access_log.isEnabledFor(logging.INFO):
            access_log.info(json.dumps({"listener": listener, "peer": peer, "capabilities": caps,
                                        "method": method, "path": path, "code": code,
                                        "ms": round(elapsed * 1000, 3)}, separators=(",", ":")))


class _BodyTooLarge(Exception):
    pass


async def _bounded_body(request: web.BaseRequest, limit: int):
    seen = 0
    content = request.content
    while True:
        chunk = await content.readany()
        if not chunk:
            return
        seen += len(chunk)
        if seen > limit:
            raise _BodyTooLarge(f"request body over {limit} bytes")
        yield chunk


async def _read_json(request: web.BaseRequest, limit: int) -> dict:
    if request.content_length is not None and request.content_length > limit:
        raise Refusal(413, reasons.REQUEST_ENTITY_TOO_LARGE, f"the body is larger than {limit} bytes")
    chunks, seen = [], 0
    while True:
        chunk = await request.content.readany()
        if not chunk:
            break
        seen += len(chunk)
        if seen > limit:
            raise Refusal(413, reasons.REQUEST_ENTITY_TOO_LARGE, f"the body is larger than {limit} bytes")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except ValueError:
        raise Refusal(400, reasons.MALFORMED_BODY, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise Refusal(400, reasons.MALFORMED_BODY, "the body is not a JSON object")
    return body


def _is_watch(query: str) -> bool:
    if "watch" not in query:
        return False
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name == "watch" and value.lower() in ("1", "true", "t", "yes"):
            return True
    return False
