"""A lean HTTP/1.1 client for the proxy's hot path: pooled TLS connections to one upstream.

aiohttp's ClientSession costs about as much CPU per request as everything else the gateway does together
(URL objects, header multidicts, timers, traces, cookie handling). A proxy needs none of that: it writes the head
it already has, lets aiohttp's C parser (llhttp) read the response, and streams the body. Dex and TokenReview,
which are not per request, keep using ClientSession.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, AsyncIterator, Awaitable, Callable, Generic, TypeVar

from aiohttp.base_protocol import BaseProtocol
from aiohttp.client_exceptions import ClientPayloadError
from aiohttp.http_parser import HttpResponseParser, RawResponseMessage
from aiohttp.streams import StreamReader

from gateway import tlsstream
from gateway.resolve import OverrideResolver, split_authority

_READ_LIMIT = 2 ** 16
#: A pooled connection idle for longer is not used again: safely below kube-apiserver's 90 s idle timeout (Go's
#: http.Server IdleTimeout there), so that the gateway never sends into the upstream's close.
REUSE_IDLE_SECONDS = 60.0


class UpstreamError(Exception):
    """The upstream could not be reached (`connect`) or failed the exchange (`request`)."""

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


class _Connection(PooledIdle, BaseProtocol):
    """One TLS connection, one request at a time. Parsing is llhttp's; framing decides reuse."""

    __slots__ = ("pool", "waiter", "payload", "message", "last_read", "broken", "timer", "idle_since")

    def __init__(self, pool: "UpstreamPool") -> None:
        super().__init__(pool.loop)
        self.pool = pool
        self.waiter: asyncio.Future | None = None
        self.payload: StreamReader | None = None
        self.message: RawResponseMessage | None = None
        self.last_read = pool.loop.time()
        self.broken = False
        self.timer: asyncio.TimerHandle | None = None
        self.idle_since = 0.0

    # --- request ---
    def begin(self, head_only: bool) -> asyncio.Future:
        self._parser = HttpResponseParser(self, self.pool.loop, _READ_LIMIT, payload_exception=ClientPayloadError,
                                         response_with_body=not head_only, read_until_eof=True,
                                         auto_decompress=False, max_line_size=self.pool.max_line,
                                         max_field_size=self.pool.max_line, max_headers=self.pool.max_headers)
        self.waiter = self.pool.loop.create_future()
        self.payload = None
        self.message = None
        self.last_read = self.pool.loop.time()
        self._arm_idle()
        return self.waiter

    def _exchanging(self) -> bool:
        # Only the wait for the response head is timed: once an answer streams (a watch), silence is a client
        # waiting, and a dead upstream is found by TCP keepalive.
        return self._parser is not None and self.message is None

    def _idle_expired(self, why: str) -> None:
        self._fail(UpstreamError("request", why))
        if self.transport is not None:
            self.transport.abort()

    # --- protocol ---
    def data_received(self, data: bytes) -> None:
        self.last_read = self.pool.loop.time()
        if self._parser is None:
            if not data:
                return  # resume_reading after the response ended
            self.broken = True  # bytes nobody asked for: never reuse this connection
            if self.transport is not None:
                self.transport.abort()
            return
        try:
            messages, upgraded, tail = self._parser.feed_data(data)
        except BaseException as exc:  # a malformed response: fail the request, drop the connection
            self._fail(UpstreamError("request", f"malformed response ({type(exc).__name__})"))
            if self.transport is not None:
                self.transport.abort()
            return
        for message, payload in messages:
            self.message, self.payload = message, payload
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result((message, payload))
        if upgraded:
            self.broken = True

    def connection_lost(self, exc: BaseException | None) -> None:
        self.broken = True
        self._stop_idle()
        if self._parser is not None:
            try:
                messages, _, _ = self._parser.feed_eof() or ((), False, b"")
            except Exception:
                messages = ()
            for message, payload in messages or ():
                if self.waiter is not None and not self.waiter.done():
                    self.waiter.set_result((message, payload))
        self._fail(UpstreamError("request", "the upstream closed the connection"))
        self.pool._forget(self)
        super().connection_lost(exc)

    def _fail(self, err: UpstreamError) -> None:
        self.broken = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(err)
            self.waiter.exception()  # retrieved: the caller may be gone
        if self.payload is not None and not self.payload.is_eof():
            self.payload.set_exception(ClientPayloadError(err.detail))

    def finished(self) -> bool:
        """The response was read to its end and the connection may carry another request."""
        return (not self.broken and self.message is not None and not self.message.should_close
                and self.payload is not None and self.payload.is_eof() and self.payload.exception() is None)

    def release(self, reuse: bool) -> None:
        # The idle timer stays armed: it stops itself once it finds no request, saving a timer per request.
        self._parser = None
        self.waiter = None
        if reuse and self.transport is not None and not self.transport.is_closing():
            self.pool.park(self)
        elif self.transport is not None:
            self.transport.abort()


_P = TypeVar("_P", bound=asyncio.BaseProtocol)


class TLSPool(Generic[_P]):
    """Keep-alive TLS connections to one upstream `host[:port]` (resolved through the override map), each a
    protocol `_P` with a `transport`: what the proxy's HTTP client and the raw path's relay share."""

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
        try:
            target = (await self.resolver.resolve(self.host, self.port))[0]
            conn = await tlsstream.connect(factory, target["host"], target["port"], self.ssl,
                                           server_hostname=self.host, timeout=self.connect_timeout)
        except (OSError, TimeoutError, IndexError, ssl.SSLError, ValueError) as exc:
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


class UpstreamPool(TLSPool[_Connection]):
    """The proxy's lean HTTP/1.1 client over pooled TLS connections to one upstream."""

    def __init__(self, authority: str, ssl_context: ssl.SSLContext, resolver: OverrideResolver, *,
                 connect_timeout: float, idle_timeout: float, max_idle: int, max_line: int = 65536,
                 max_headers: int = 256, reuse_idle: float = REUSE_IDLE_SECONDS) -> None:
        super().__init__(authority, ssl_context, resolver, connect_timeout=connect_timeout,
                         idle_timeout=idle_timeout, max_idle=max_idle, reuse_idle=reuse_idle)
        self.max_line = max_line
        self.max_headers = max_headers

    def _usable(self, conn: _Connection) -> bool:
        return super()._usable(conn) and not conn.broken

    async def _connect(self) -> _Connection:
        return await self.open(lambda: _Connection(self))

    def _forget(self, conn: _Connection) -> None:
        self.all.discard(conn)
        try:
            self.idle.remove(conn)
        except ValueError:
            pass

    async def request(self, head: bytes, body: AsyncIterator[bytes] | None, *, head_only: bool, chunked: bool,
                      on_response: Callable[[RawResponseMessage, StreamReader], Awaitable[None]]) -> None:
        """Send `head` (and the body), hand the parsed response head and its body stream to `on_response`, and
        put the connection back in the pool only if the exchange ended cleanly.

        A pooled connection may have been closed by the upstream a moment ago. When it fails before any byte of
        an answer, the request goes again on a fresh connection, with its body too: the body sent on the pooled
        one is kept until the answer starts (at most the gateway's body limit, which the caller enforces), so
        that no request is lost to that race."""
        conn = self.take()
        fresh = conn is None
        if conn is None:
            conn = await self._connect()
        sent: list[bytes] | None = [] if not fresh and body is not None else None
        reuse = False
        try:
            try:
                message, payload = await self._attempt(conn, head, head_only, body, chunked, sent)
            except UpstreamError:
                if fresh or conn.message is not None:
                    raise
                # A pooled connection the upstream had closed meanwhile: once more on a new one.
                conn.release(False)
                conn = await self._connect()
                again = None if body is None else _replay(sent or [], body)
                message, payload = await self._attempt(conn, head, head_only, again, chunked, None)
            await on_response(message, payload)
            reuse = conn.finished() and len(self.idle) < self.max_idle
        finally:
            conn.release(reuse)

    async def _attempt(self, conn: _Connection, head: bytes, head_only: bool, body: AsyncIterator[bytes] | None,
                       chunked: bool, sent: list[bytes] | None) -> tuple[RawResponseMessage, StreamReader]:
        waiter = conn.begin(head_only)
        assert conn.transport is not None
        conn.transport.write(head)
        if body is not None:
            try:
                await self._send_body(conn, body, chunked, sent)
            except UpstreamError:
                if conn.message is not None and waiter.done() and not waiter.cancelled() \
                        and waiter.exception() is None:
                    return waiter.result()  # it answered (a refusal, say) before taking the whole body
                raise
        return await waiter

    async def _send_body(self, conn: _Connection, body: AsyncIterator[bytes], chunked: bool,
                         sent: list[bytes] | None = None) -> None:
        transport = conn.transport
        assert transport is not None
        async for chunk in body:
            if sent is not None:
                sent.append(chunk)  # before the write: a chunk taken from the client must not be lost
            if transport.is_closing():
                raise UpstreamError("request", "the upstream closed the connection while the body was sent")
            if chunked:
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
            else:
                transport.write(chunk)
            try:
                await conn._drain_helper()
            except ConnectionError:
                raise UpstreamError("request", "the upstream closed the connection while the body was sent") \
                    from None
        if chunked:
            transport.write(b"0\r\n\r\n")


class _replay:
    """The chunks already taken from the client, then the ones it has not sent yet (an async iterator)."""

    def __init__(self, sent: list[bytes], rest: AsyncIterator[bytes]) -> None:
        self._sent = iter(sent)
        self._rest = rest

    def __aiter__(self) -> "_replay":
        return self

    async def __anext__(self) -> bytes:
        chunk = next(self._sent, None)
        if chunk is not None:
            return chunk
        return await self._rest.__anext__()
