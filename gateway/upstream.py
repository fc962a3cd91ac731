"""A lean HTTP/1.1 client for the proxy's hot path: pooled TLS connections to one upstream. aiohttp's ClientSession
costs about as much CPU per request as everything else the gateway does together; a proxy writes the head it has,
follows the answer with the one response framer (`framing.ResponseFramer`) and streams the body. Dex and the
TokenReview, which are not per request, keep using ClientSession."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, AsyncIterator, Awaitable, Callable, Generic, TypeVar

from gateway import tlsstream
from gateway.framing import Data, FramingError, ResponseFramer, ResponseHead
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


class BodyStream:
    """The payload of one answer as it arrives (the egress's reading side). While more
    than `high` bytes wait to be read, the upstream connection stops reading."""

    __slots__ = ("_conn", "_chunks", "_size", "_eof", "_exc", "_waiter")

    high = 2 ** 16

    def __init__(self, conn: "_Connection") -> None:
        self._conn = conn
        self._chunks: list[bytes] = []
        self._size = 0
        self._eof = False
        self._exc: UpstreamError | None = None
        self._waiter: asyncio.Future | None = None

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > self.high:
            self._conn.pause_reading()
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def set_exception(self, exc: UpstreamError) -> None:
        if not self._eof:
            self._exc = exc
            self._wake()

    def at_eof(self) -> bool:
        """Everything was read and the answer ended cleanly."""
        return self._eof and not self._chunks and self._exc is None

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def readany(self) -> bytes:
        """The next bytes of the payload; b"" at its end; UpstreamError when it ended early."""
        while not self._chunks:
            if self._exc is not None:
                raise self._exc
            if self._eof:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        data = b"".join(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
        self._chunks.clear()
        self._size = 0
        self._conn.resume_reading()
        return data

    async def read(self) -> bytes:
        """The whole payload."""
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)


class _Connection(PooledIdle, asyncio.Protocol):
    """One TLS connection, one request at a time. The answer is followed by the data plane's one framer
    (framing.ResponseFramer, decoding); framing decides reuse."""

    __slots__ = ("pool", "transport", "framer", "waiter", "head", "body", "reuse", "last_read", "broken", "timer",
                 "idle_since", "_write_paused", "_drain")

    def __init__(self, pool: "UpstreamPool") -> None:
        self.pool = pool
        self.transport: Any = None
        self.framer = ResponseFramer(decode=True)
        self.waiter: asyncio.Future | None = None
        self.head: ResponseHead | None = None
        self.body: BodyStream | None = None
        self.reuse = False
        self.last_read = pool.loop.time()
        self.broken = False
        self.timer: asyncio.TimerHandle | None = None
        self.idle_since = 0.0
        self._write_paused = False
        self._drain: asyncio.Future | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    # --- request ---
    def begin(self, head_only: bool) -> asyncio.Future:
        self.framer.start(head_only)
        self.waiter = self.pool.loop.create_future()
        self.head = None
        self.body = None
        self.reuse = False
        self.last_read = self.pool.loop.time()
        self._arm_idle()
        return self.waiter

    def _exchanging(self) -> bool:
        # Only the wait for the response head is timed: once an answer streams (a watch), silence is a client
        # waiting, and a dead upstream is found by TCP keepalive.
        return self.waiter is not None and self.framer.waiting_for_head

    def _idle_expired(self, why: str) -> None:
        self._fail(UpstreamError("request", why))
        if self.transport is not None:
            self.transport.abort()

    # --- protocol ---
    def data_received(self, data: bytes) -> None:
        self.last_read = self.pool.loop.time()
        try:
            events = self.framer.feed(data)
        except FramingError as exc:  # a malformed answer, or bytes nobody asked for: never reuse
            self._fail(UpstreamError("request", f"malformed response ({exc})"))
            if self.transport is not None:
                self.transport.abort()
            return
        self._handle(events)

    def _handle(self, events: list) -> None:
        for event in events:
            if isinstance(event, Data):
                assert self.body is not None
                self.body.feed(event.data)
            elif isinstance(event, ResponseHead):
                self.head, self.body = event, BodyStream(self)
                if self.waiter is not None and not self.waiter.done():
                    self.waiter.set_result((event, self.body))
            else:  # EndOfMessage
                self.reuse = event.reuse
                assert self.body is not None
                self.body.feed_eof()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.broken = True
        self._stop_idle()
        alert = refused_certificate(exc)
        if alert is not None:
            self._fail(UpstreamError(CERTIFICATE_REFUSED, alert))
        if self.framer.in_answer:
            try:
                self._handle(self.framer.feed_eof())
            except FramingError as err:
                self._fail(UpstreamError("request", str(err)))
        self._fail(UpstreamError("request", "the upstream closed the connection"))
        self.pool.forget(self)
        self.transport = None
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_exception(ConnectionResetError("the upstream closed the connection"))
            drain.exception()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    async def drain(self) -> None:
        """Wait until the transport takes more (ConnectionError once the connection is gone)."""
        if self.transport is None:
            raise ConnectionResetError("the upstream closed the connection")
        if self._write_paused:
            self._drain = self.pool.loop.create_future()
            await self._drain

    def pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def _fail(self, err: UpstreamError) -> None:
        self.broken = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(err)
            self.waiter.exception()  # retrieved: the caller may be gone
        if self.body is not None:
            self.body.set_exception(err)

    def finished(self) -> bool:
        """The answer was read to its end and the connection may carry another request."""
        return not self.broken and self.reuse and self.body is not None and self.body.at_eof()

    def release(self, reuse: bool) -> None:
        # The idle timer stays armed: it stops itself once it finds no request, saving a timer per request.
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


class UpstreamPool(TLSPool[_Connection]):
    """The proxy's lean HTTP/1.1 client over pooled TLS connections to one upstream."""

    def _usable(self, conn: _Connection) -> bool:
        return super()._usable(conn) and not conn.broken

    async def _connect(self) -> _Connection:
        return await self.open(lambda: _Connection(self))

    async def request(self, head: bytes, body: AsyncIterator[bytes] | None, *, head_only: bool, chunked: bool,
                      on_response: Callable[[ResponseHead, BodyStream], Awaitable[None]]) -> None:
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
                answer, payload = await self._attempt(conn, head, head_only, body, chunked, sent)
            except UpstreamError:
                if fresh or conn.framer.started:
                    raise
                # A pooled connection the upstream had closed meanwhile: once more on a new one.
                conn.release(False)
                conn = await self._connect()
                again = None if body is None else _replay(sent or [], body)
                answer, payload = await self._attempt(conn, head, head_only, again, chunked, None)
            await on_response(answer, payload)
            reuse = conn.finished() and len(self.idle) < self.max_idle
        finally:
            conn.release(reuse)

    async def _attempt(self, conn: _Connection, head: bytes, head_only: bool, body: AsyncIterator[bytes] | None,
                       chunked: bool, sent: list[bytes] | None) -> tuple[ResponseHead, BodyStream]:
        waiter = conn.begin(head_only)
        assert conn.transport is not None
        conn.transport.write(head)
        if body is not None:
            try:
                await self._send_body(conn, body, chunked, sent)
            except UpstreamError:
                if conn.head is not None and waiter.done() and not waiter.cancelled() \
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
                await conn.drain()
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
