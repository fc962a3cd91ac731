"""Pooled TLS connections to one upstream, for the proxy's hot path (relay.RelayPool is the engine's): aiohttp's
ClientSession costs about as much CPU per request as everything else the gateway does together; a proxy writes
the head it has and relays the answer. Dex and the TokenReview, which are not per request, keep using
ClientSession. What a failed upstream is (`UpstreamError`), and the idle timer of a pooled connection."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, Callable, Generic, TypeVar

from gateway import tlsstream
from gateway.resolve import OverrideResolver, split_authority
from gateway.tlsalerts import refused_certificate

#: A pooled connection idle for longer is not used again: safely below kube-apiserver's 90 s idle timeout (Go's
#: http.Server IdleTimeout there), so that the gateway never sends into the upstream's close.
REUSE_IDLE_SECONDS = 60.0


CERTIFICATE_REFUSED = "certificate_refused"  # an upstream refused our client certificate (a TLS alert)


class UpstreamError(Exception):
    """The upstream could not be reached (`connect`), failed the exchange (`request`), or refused our client
    certificate (`certificate_refused`, the detail the alert's name)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


class PooledIdle:
    """The idle timer of a pooled upstream connection: one timer per connection, armed when an exchange starts and
    re-armed only when it fires (reads just stamp `last_read`). Needs `pool` (a TLSPool), `transport`, `timer`,
    `last_read`; `_exchanging()` says whether an exchange waits for data, `_idle_expired(why)` ends it."""

    __slots__ = ()

    def _arm_idle(self) -> None:
        if self.timer is None:  # type: ignore[attr-defined]
            self.timer = self.pool.loop.call_at(  # type: ignore[attr-defined]
                self.last_read + self.pool.idle_timeout, self._idle_check)  # type: ignore[attr-defined]

    def _idle_check(self) -> None:
        self.timer = None
        if not self._exchanging() or self.transport is None:  # type: ignore[attr-defined]
            return
        pool = self.pool  # type: ignore[attr-defined]
        due = self.last_read + pool.idle_timeout  # type: ignore[attr-defined]
        if pool.loop.time() >= due:
            self._idle_expired(f"no data from the upstream for {pool.idle_timeout:.0f} s")
        else:
            self.timer = pool.loop.call_at(due, self._idle_check)

    def _stop_idle(self) -> None:
        if self.timer is not None:  # type: ignore[attr-defined]
            self.timer.cancel()  # type: ignore[attr-defined]
            self.timer = None

    def _exchanging(self) -> bool:
        raise NotImplementedError

    def _idle_expired(self, why: str) -> None:
        raise NotImplementedError


_P = TypeVar("_P", bound=asyncio.BaseProtocol)


class TLSPool(Generic[_P]):
    """Keep-alive TLS connections to one upstream `host[:port]` (resolved through the override map), each a
    protocol `_P` with a `transport` (relay.Relay)."""

    def __init__(self, authority: str, ssl_context: ssl.SSLContext, resolver: OverrideResolver, *,
                 connect_timeout: float, idle_timeout: float, max_idle: int,
                 reuse_idle: float = REUSE_IDLE_SECONDS) -> None:
        self.host, self.port = split_authority(authority)
        self.reuse_idle = reuse_idle
        self.authority = authority
        self.ssl = ssl_context
        self.resolver = resolver
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.max_idle = max_idle
        self.loop = asyncio.get_running_loop()
        self.idle: list[_P] = []
        self.all: set[_P] = set()
        self.closed = False

    def _usable(self, conn: _P) -> bool:
        transport: Any = getattr(conn, "transport", None)
        return transport is not None and not transport.is_closing()

    def forget(self, conn: _P) -> None:
        """`conn`'s connection ended: it is neither counted nor offered any more."""
        self.all.discard(conn)
        try:
            self.idle.remove(conn)
        except ValueError:
            pass

    def park(self, conn: _P) -> None:
        """Keep `conn` for the next request."""
        conn.idle_since = self.loop.time()  # type: ignore[attr-defined]
        self.idle.append(conn)

    def take(self) -> _P | None:
        """The most recently idle connection still usable, or None. One idle for longer than `reuse_idle` is
        closed instead: the upstream may be closing it right now (kube-apiserver after 90 s), and a request sent
        into that close is lost. The most recent is on top, so whatever is below a stale one is staler."""
        oldest = self.loop.time() - self.reuse_idle
        while self.idle:
            conn = self.idle.pop()
            if conn.idle_since < oldest:  # type: ignore[attr-defined]
                for stale in (conn, *self.idle):
                    transport: Any = getattr(stale, "transport", None)
                    if transport is not None:
                        transport.abort()
                self.idle.clear()
                return None
            if self._usable(conn):
                return conn
        return None

    async def open(self, factory: Callable[[], _P]) -> _P:
        """A new connection made by `factory`, counted in `all`; UpstreamError when it cannot be made."""
        if self.closed:
            raise UpstreamError("connect", "the gateway is stopping")
        for attempt in (1, 2):
            try:
                target = (await self.resolver.resolve(self.host, self.port))[0]
                conn = await tlsstream.connect(factory, target["host"], target["port"], self.ssl,
                                               server_hostname=self.host, timeout=self.connect_timeout)
                break
            except (OSError, TimeoutError, IndexError, ssl.SSLError, ValueError) as exc:
                alert = refused_certificate(exc)
                if alert is not None:
                    raise UpstreamError(CERTIFICATE_REFUSED, alert) from None
                if attempt == 1 and isinstance(exc, (ConnectionRefusedError, ConnectionResetError)):
                    continue  # behind a Service the next connection may reach a live endpoint: once more
                raise UpstreamError("connect", type(exc).__name__) from None
        self.all.add(conn)
        return conn

    async def close(self) -> None:
        self.closed = True
        for conn in list(self.all):
            transport: Any = getattr(conn, "transport", None)
            if transport is not None:
                transport.abort()
        self.idle.clear()
        await asyncio.sleep(0)
