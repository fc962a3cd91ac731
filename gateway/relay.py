"""The engine's upstream side: pooled TLS connections to one upstream (kube-apiserver for the entrance, a peer's
entrance for the egress, with our client certificate) whose answers are relayed to the client as bytes. The answer
is followed by the data plane's one framer (`framing.ResponseFramer`, relaying): only the head is rewritten
(`framing.relay_head`), the body goes as it came, to the connection that owns the exchange (which alone writes to
its client), and the framing decides when both connections are free for the next request."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from gateway.framing import Data, FramingError, ResponseFramer, ResponseHead, relay_head
from gateway.tlsalerts import refused_certificate
from gateway.upstream import CERTIFICATE_REFUSED, PooledIdle, TLSPool, UpstreamError


class RelayOwner(Protocol):
    """What a Relay reports to during an exchange (serving.Serving); the answer's bytes go to it as well, and it
    alone writes to its client."""

    def response_started(self, head: ResponseHead) -> None: ...

    def response_bytes(self, data: bytes) -> None: ...

    def response_done(self) -> None: ...

    def upstream_failed(self, err: UpstreamError, got: bool) -> None: ...

    def upstream_writable(self, writable: bool) -> None: ...


class RelayPool(TLSPool["Relay"]):
    """Keep-alive TLS connections to one upstream for the engine; each carries one exchange at a time."""

    async def connect(self) -> "Relay":
        return await self.open(lambda: Relay(self))


class Relay(PooledIdle, asyncio.Protocol):
    """One upstream TLS connection. During an exchange its answer's bytes go to the owner; `sending` while the
    request's body is still being sent (`send`, `end_body`): such a connection is never reused."""

    __slots__ = ("pool", "transport", "owner", "framer", "last_read", "timer", "idle_since", "sending")

    def __init__(self, pool: RelayPool) -> None:
        self.pool = pool
        self.transport: Any = None
        self.owner: RelayOwner | None = None
        self.framer = ResponseFramer(decode=False)
        self.last_read = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.idle_since = 0.0
        self.sending = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def start(self, owner: RelayOwner, head: bytes, head_only: bool, body: bool = False) -> None:
        """Send a request head (`body`: a body follows, `send` and `end_body`); the answer goes to `owner`."""
        self.owner = owner
        self.sending = body
        self.framer.start(head_only)
        self.last_read = self.pool.loop.time()
        self._arm_idle()
        self.transport.write(head)

    def send(self, data: bytes) -> None:
        """Bytes of the request's body, as the client framed them."""
        if self.transport is not None:
            self.last_read = self.pool.loop.time()  # the wait for the answer is timed from the body's last bytes
            self.transport.write(data)

    def end_body(self) -> None:
        self.sending = False

    def pause_writing(self) -> None:
        if self.owner is not None:
            self.owner.upstream_writable(False)

    def resume_writing(self) -> None:
        if self.owner is not None:
            self.owner.upstream_writable(True)

    def _exchanging(self) -> bool:
        # Only the wait for the first byte of the answer is timed; a streaming answer (a watch) may be silent.
        return self.owner is not None and not self.framer.started

    def _idle_expired(self, why: str) -> None:
        self._fail(why)

    def data_received(self, data: bytes) -> None:
        owner = self.owner
        if owner is None:
            if data and self.transport is not None:
                self.transport.abort()  # bytes nobody asked for: this connection is not reused
            return
        self.last_read = self.pool.loop.time()
        try:
            events = self.framer.feed(data)
        except FramingError as exc:
            self._fail(f"malformed response ({exc})")
            return
        out = b""
        done = None
        for event in events:
            kind = type(event)
            if kind is Data:
                out = out + event.data if out else event.data
            elif kind is ResponseHead:
                owner.response_started(event)
                if self.owner is not owner:
                    return  # the owner let this answer go unread (detach): nothing more of it is relayed
                out = relay_head(event)
            else:
                done = event
        if out:
            owner.response_bytes(out)  # a head and the body's first bytes in one write: one TLS record
        if done is not None:
            self._done(done.reuse)

    def _done(self, reuse: bool) -> None:
        owner, self.owner = self.owner, None
        pool = self.pool
        if reuse and not self.sending and len(pool.idle) < pool.max_idle and self.transport is not None \
                and not self.transport.is_closing():
            pool.park(self)
        elif self.transport is not None:
            self.transport.abort()
        if owner is not None:
            owner.response_done()

    def _fail(self, detail: str, kind: str = "request") -> None:
        owner, self.owner = self.owner, None
        if self.transport is not None:
            self.transport.abort()
        if owner is not None:
            owner.upstream_failed(UpstreamError(kind, detail), self.framer.started)

    def detach(self) -> None:
        """The client went away mid-exchange: this connection's answer is unread, so it is dropped."""
        self.owner = None
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_idle()
        self.pool.forget(self)
        self.transport = None
        if self.owner is not None:
            alert = refused_certificate(exc)
            if alert is not None:
                # A TLS 1.3 server (a peer's entrance) refuses our client certificate on the first read.
                self._fail(alert, CERTIFICATE_REFUSED)
                return
            try:
                events = self.framer.feed_eof()
            except FramingError as err:
                self._fail(str(err))
                return
            if events:
                self._done(False)  # an answer framed by the close: complete
            else:
                self._fail("the upstream closed the connection")

