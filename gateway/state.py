"""What one gateway process decides and forwards requests with, handed to its protocols and handlers: the
registry snapshot, the settings, the verified-token, exchange and review caches, the upstream pools, the entrance's
connections by peer, and the metrics. Built by `Gateway.start` (`GatewayState.open`), closed by `Gateway.stop`."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from typing import Callable

import aiohttp
from yarl import URL

from contract import reasons
from contract.errors import Refusal
from contract.names import peer_secret_name
from gateway.accounting import Accounting
from gateway.authority import OpenStreams
from gateway.grantlag import FreshGrants
from gateway.config import GatewayConfig
from gateway.connections import PeerConnections
from gateway.exchange import DexClient, ExchangeCache, PeerRate
from gateway.metrics import Metrics
from gateway.registry import Peer, Registry
from gateway.relay import RelayPool
from gateway.resolve import OverrideResolver
from gateway.tls import client_context
from gateway.tokenreview import TokenReviewer
from gateway.tokens import VerifiedTokens


class GatewayState:
    def __init__(self, config: GatewayConfig, metrics: Metrics, registry: Registry,
                 loop: asyncio.AbstractEventLoop, resolver: OverrideResolver, api_session: aiohttp.ClientSession,
                 dex_session: aiohttp.ClientSession,
                 on_exchange: Callable[[str, tuple[str, str] | None], None] | None) -> None:
        limits = config.limits
        self.config = config
        self.limits = limits
        self.metrics = metrics
        self.accounting = Accounting(metrics, config)
        self.exchange_hits = metrics.exchange_hits
        self.loop = loop
        self.registry = registry
        self.tokens = VerifiedTokens()
        self.connections = PeerConnections(limits.max_connections_per_peer, self.accounting, lambda: self.registry,
                                           lambda: self.limits.registry_catch_up)
        #: Set (and replaced) at every publish: requests waiting for a newer registry (catchup.py) wake on it.
        self.published = asyncio.Event()
        #: The open proxied requests with what admitted them: closed when a registry or the clock withdraws it.
        self.streams = OpenStreams(loop)
        #: When each grant appeared, for the entrance's catch-up with the API server's authorizer.
        self.fresh_grants = FreshGrants()
        self.fresh_grants.update(registry, loop.time())
        self.resolver = resolver
        self.api_session = api_session
        self.dex_session = dex_session
        api = URL(config.api_server)
        self.api_authority = api.raw_authority.encode()
        self.api_prefix = api.raw_path.rstrip("/").encode()
        api_ca = client_context(config.api_ca_pem)
        pool_kwargs = dict(connect_timeout=limits.upstream_connect_timeout, idle_timeout=limits.idle_timeout,
                           max_idle=limits.upstream_pool_size, reuse_idle=limits.upstream_reuse_idle)
        #: kube-apiserver, for the entrance (one pool: the egress's go to the peers' entrances).
        self.relay_pool = RelayPool(api.raw_authority, api_ca, resolver, **pool_kwargs)  # type: ignore[arg-type]
        self._peer_pools: dict[str, tuple[bytes, RelayPool]] = {}
        self._retired_pools: list[RelayPool] = []
        self._on_exchange = on_exchange
        dex = DexClient(dex_session, config.token_endpoint, config.dex_client_id, config.dex_client_secret,
                        config.dex_audience, limits.exchange_timeout, self._observe_dex, self._exchange_outcome)
        self.exchange = ExchangeCache(dex, margin=limits.exchange_refresh_margin, rate=PeerRate(
            limits.exchanges_per_peer_per_second, limits.exchange_burst_per_peer))
        reviewer = TokenReviewer(api_session, config.api_server, config.api_token, timeout=limits.exchange_timeout,
                                 ttl=limits.token_review_ttl, registry=lambda: self.registry,
                                 on_unavailable=lambda: self.accounting.upstream_error("egress", "token_review"))
        self.reviews = ExchangeCache(reviewer, margin=0)

    @classmethod
    def open(cls, config: GatewayConfig, metrics: Metrics, registry: Registry,
             on_exchange: Callable[[str, tuple[str, str] | None], None] | None = None) -> "GatewayState":
        """The state of a starting gateway, with its client sessions (inside the running loop)."""
        loop = asyncio.get_running_loop()
        resolver = OverrideResolver(config.resolve)
        timeout = aiohttp.ClientTimeout(total=None, connect=config.limits.upstream_connect_timeout,
                                        sock_read=config.limits.idle_timeout)
        api_session = _session(client_context(config.api_ca_pem), 16, resolver, config, timeout)
        dex_session = _session(client_context(config.dex_ca_pem), 64, resolver, config, timeout, skip=("User-Agent",))
        return cls(config, metrics, registry, loop, resolver, api_session, dex_session, on_exchange)

    def publish(self, registry: Registry) -> None:
        """Decide on `registry` from now on; the entrance's connections of peers that left it are closed now."""
        old, self.registry = self.registry, registry
        if old.generation != registry.generation or old is not registry:
            self.tokens.clear()
        self.connections.close_gone(registry.by_fingerprint)
        published, self.published = self.published, asyncio.Event()
        published.set()
        self.streams.recheck(registry)
        self.fresh_grants.update(registry, self.loop.time())

    def peer_pool(self, peer: Peer) -> RelayPool:
        """The pooled mTLS connections toward `peer`'s entrance, made anew when its credentials change."""
        ident = hashlib.sha256(b"\0".join([peer.peer_ca_pem or b"", peer.client_cert_pem or b"",
                                           peer.client_key_pem or b"", (peer.entrance or "").encode()])).digest()
        entry = self._peer_pools.get(peer.name)
        if entry is not None and entry[0] == ident:
            return entry[1]
        try:
            ctx = client_context(peer.peer_ca_pem, peer.client_cert_pem, peer.client_key_pem)
        except (ValueError, ssl.SSLError):
            raise Refusal(503, reasons.PEER_CREDENTIALS_INVALID, f"the credentials of peering {peer.name} do not load; "
                          f"check the Secret {peer_secret_name(peer.name)}") from None
        limits = self.limits
        assert peer.entrance
        pool = RelayPool(peer.entrance, ctx, self.resolver, connect_timeout=limits.upstream_connect_timeout,
                            idle_timeout=limits.idle_timeout, max_idle=limits.upstream_pool_size,
                            reuse_idle=limits.upstream_reuse_idle)
        if entry is not None:
            # In-flight requests (watches) keep the old pool's connections until they end or the gateway stops.
            self._retired_pools.append(entry[1])
        self._peer_pools[peer.name] = (ident, pool)
        return pool

    async def close(self) -> None:
        self.streams.close_all()
        for cache in (self.exchange, self.reviews):
            await cache.close()
        for session in (self.api_session, self.dex_session):
            await session.close()
        for pool in (self.relay_pool, *(p for _, p in self._peer_pools.values()),
                     *self._retired_pools):
            await pool.close()
        self._peer_pools.clear()
        self._retired_pools.clear()
        await self.resolver.close()

    def _observe_dex(self, seconds: float, outcome: str) -> None:
        self.metrics.dex_latency.observe(seconds)
        self.metrics.exchange_calls.labels(outcome).inc()

    def _exchange_outcome(self, connector_id: str, failure: tuple[str, str] | None) -> None:
        # Counted here, in the process that called Dex: a worker reports only changes to its parent.
        if failure is not None:
            # The peer whose connector it is: a connector's name is bounded for long ClusterPeer names, never
            # parsed back.
            peer = next((p.name for p in self.registry.peers.values() if p.connector_id == connector_id), "-")
            self.metrics.exchange_failures.labels(peer, failure[0]).inc()
        if self._on_exchange is not None:
            self._on_exchange(connector_id, failure)


def _session(ctx: ssl.SSLContext, limit: int, resolver: OverrideResolver, config: GatewayConfig,
             timeout: aiohttp.ClientTimeout,
             skip: tuple[str, ...] = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
             ) -> aiohttp.ClientSession:
    # Requests carry exactly the headers given: aiohttp adds none of its own.
    connector = aiohttp.TCPConnector(ssl=ctx, limit=0, limit_per_host=limit, resolver=resolver,
                                     keepalive_timeout=config.limits.idle_timeout, ttl_dns_cache=None,
                                     enable_cleanup_closed=False)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                                 skip_auto_headers=skip, timeout=timeout)
