"""One client connection of the data plane's HTTP/1.1 engine, sans-I/O, in mitmproxy's shape: every request of
the entrance (peers, mTLS) and of the egress (local consumers, toward a peer's entrance) is served by a `Serving`.

Events in, as calls: the client's bytes (`received`), backpressure (`writable`), its end (`lost`), the timers it
asked for (`idle_due`, `head_due`), the end of a wait (the `then` its `wait` command named: `_caught_up`,
`_completed`, `_connected`, `_paused`, `_call_answered`; `failed`), a withdrawal (`withdrawn`,
authority.OpenStreams), the relay's answer (relay.RelayOwner, answering.py). Commands out: to the client's side
through `io` (`ConnectionIo`; engine.Connection carries them out, the tests record them), to the upstream's through
the relay and its pool. Request heads are read
by `framing.RequestHeadReader` (what it cannot read safely is refused), admitted by the listener (listeners.py: the
one admission chain of admission.py), relayed with their body (`upload.Upload`, as the client framed it) and
answered as bytes (`relay.Relay`); peer calls under /peering/v1/ are answered here too (`calls.PeerCalls`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Awaitable, Callable, Protocol

from contract import reasons
from contract.errors import Refusal
from contract.paths import PEER_PREFIX
from gateway.accounting import CLIENT_CLOSED, CLIENT_CLOSED_CODE, ERROR, REFUSED, WITHDRAWN
from gateway.answering import Answering
from gateway.admission import Admitted, ClientState, Decision, caught_up, closes_connection, complete, known_peer, \
    not_held
from gateway.authority import Authority
from gateway.calls import PeerCalls
from gateway.catchup import AwaitRegistry
from gateway.framing import NEED_DATA, Refused, Request, RequestHeadReader
from gateway.listeners import Listener
from gateway.protocol import ControlHandlers
from gateway.relay import Relay, RelayPool
from gateway.state import GatewayState
from gateway.status import status_answer
from gateway.upload import Upload, Uploading
from gateway.upstream import UpstreamError

log = logging.getLogger("gateway")

_PEER_PREFIX = PEER_PREFIX.encode()


class ConnectionIo(Protocol):
    """The commands a `Serving` gives its client's side (engine.Connection carries them out): `now` the loop's
    clock; `close` once what was written is sent, `abort` at once; `reading` on or off; `idle_at` calls `idle_due`
    at a time of that clock and `head_deadline` calls `head_due` after a delay (None: not any more); `wait` awaits
    `start()` and hands the result to `then` or the exception to `failed`, unless `cancel` abandons it."""

    def now(self) -> float: ...

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...

    def reading(self, on: bool) -> None: ...

    def idle_at(self, when: float | None) -> None: ...

    def head_deadline(self, delay: float | None) -> None: ...

    def wait(self, start: Callable[[], Awaitable[Any]], then: Callable[[Any], None]) -> None: ...

    def cancel(self) -> None: ...


class Serving(Answering, PeerCalls, Uploading):
    """One client connection of `listener` (the entrance or the egress)."""

    __slots__ = ("state", "handlers", "listener", "io", "clock", "call", "open", "peering_fp", "reader", "client", "busy",
                 "relay", "waiting", "close_after", "last", "paused", "reading_paused", "code", "method", "path",
                 "start", "watch", "head", "head_only", "retried", "head_armed", "outcome", "upload", "body_held",
                 "decision", "pool", "authority", "settling", "settling_start", "tries")

    def __init__(self, state: GatewayState, handlers: ControlHandlers, listener: Listener, peering_fp: str | None,
                 io: ConnectionIo) -> None:
        self.state = state
        self.handlers = handlers
        self.listener = listener
        self.io = io
        #: `io.now`, looked up once (read twice a request).
        self.clock = io.now
        #: A peer call's request and admission, waiting for the rest of its body.
        self.call: tuple[Request, object] | None = None
        self.open = False
        #: The client certificate's fingerprint (the connection's, from its handshake; None on the egress).
        self.peering_fp = peering_fp
        # Made with the first bytes and the first request: a connection that only holds costs neither.
        self.reader: RequestHeadReader | None = None
        self.client: ClientState | None = None
        self.busy = False
        self.relay: Relay | None = None
        #: A `wait` command is in progress (its `then` or `failed` follows, unless it is cancelled).
        self.waiting = False
        self.close_after = False
        self.last = 0.0
        self.paused = False
        self.reading_paused = False
        self.code = 0
        #: WITHDRAWN once the gateway cut the request in progress (authority.OpenStreams), so that the connection's
        #: end is not taken for the client's (accounting.OUTCOMES).
        self.outcome: str | None = None
        self.method = b""
        self.path = b""
        self.start = 0.0
        self.watch = False
        self.head = b""
        self.head_only = False
        self.retried = False
        self.head_armed = False
        #: The body of the request in progress (made with the first request that has one).
        self.upload: Upload | None = None
        #: The client is not read while a body waits for an upstream that does not take it yet.
        self.body_held = False
        #: Where the request in progress goes, and what admitted it (the listener's answers, once it is admitted).
        self.pool: RelayPool | None = None
        self.authority: Authority | None = None
        #: The admission's decision for the request in progress, once no registry is waited for.
        self.decision: Decision | None = None
        #: Until when a 403 of the API server to the request that started at `settling_start` is tried again
        #: (grantlag.py; -1 for never), and how often it was: worked out at its first 403 only.
        self.settling = 0.0
        self.settling_start = -1.0
        self.tries = 0

    # ----- the client's connection -------------------------------------------------------------------------
    def opened(self) -> None:
        self.open = True
        self.last = self.clock()
        self.io.idle_at(self.last + self.state.limits.idle_timeout)

    def idle_due(self) -> None:
        if not self.open:
            return
        now = self.clock()
        due = self.last + self.state.limits.idle_timeout
        if not self.busy and now >= due:
            self.io.close()  # an idle keep-alive connection: closed after `idle_timeout`, as the join's is
            return
        self.io.idle_at(max(due, now + 1))

    def received(self, data: bytes) -> None:
        reader = self.reader
        if reader is None:
            limits = self.state.limits
            reader = self.reader = RequestHeadReader(max_head_bytes=limits.max_header_bytes,
                                                     max_headers=limits.max_headers)
        upload = self.upload
        if upload is not None and upload.open:
            if not self._feed_body(data) or upload.open:
                return
            if self.call is not None:
                self._call(*self.call)  # the peer call's body is complete
        else:
            reader.feed(data)
        if not self.busy:
            self._next()
        elif len(reader.buffer) > self.state.limits.max_header_bytes and not self.reading_paused:
            self.reading_paused = True  # a client sending ahead of its answers waits for them
            self._reading()

    def _reading(self) -> None:
        """Read the client unless it sends ahead of its answers, or its body waits for the upstream."""
        if self.open:
            self.io.reading(not (self.reading_paused or self.body_held))

    def writable(self, on: bool) -> None:
        """The client's transport takes more, or asks for no more for now: the answer's upstream is read alike."""
        self.paused = not on
        if self.relay is not None:
            (self.relay.resume_reading if on else self.relay.pause_reading)()

    def lost(self) -> None:
        self.open = False
        self.io.idle_at(None)
        self._head_done()
        if self.waiting:
            self.waiting = False
            self.io.cancel()
        relay, self.relay = self.relay, None
        if relay is not None:
            relay.detach()
        self.state.streams.discard(self)
        if self.busy:
            self.busy = False
            if self.watch and self.code:
                self.state.metrics.watches.labels(self.listener.name, self.client.peer).dec()
            # The client went away (it ended its watch), unless the gateway cut it for a withdrawal.
            self._finish(self.code or CLIENT_CLOSED_CODE, self.outcome or CLIENT_CLOSED)

    # ----- requests ---------------------------------------------------------------------------------------
    def _next(self) -> None:
        while not self.busy and self.open:
            event = self.reader.next_event()
            if event is NEED_DATA:
                break
            if type(event) is Refused:
                self._refuse_head(event.code, event.reason, event.message)  # type: ignore[union-attr]
                return
            self.last = self.clock()
            if self.head_armed:
                self._head_done()
            self._request(event)  # type: ignore[arg-type]
        if not self.busy and self.open:
            if self.reader.buffer and not self.head_armed:  # a head begun: it has a deadline from now
                self.head_armed = True
                self.io.head_deadline(self.state.limits.request_head_timeout)
            if self.reading_paused:
                self.reading_paused = False
                self._reading()

    def _head_done(self) -> None:
        if self.head_armed:
            self.head_armed = False
            self.io.head_deadline(None)

    def head_due(self) -> None:
        """A request head not complete in time (a slow client trickling it): 408, and the connection ends."""
        self.head_armed = False
        if not self.open or self.busy:
            return
        limit = self.state.limits.request_head_timeout
        self._refuse_head(408, reasons.REQUEST_TIMEOUT, f"the request head was not complete within {limit:g} s; "
                          "send the whole head at once")

    def _refuse_head(self, code: int, reason: str, message: str) -> None:
        """A request head refused before admission (too slow, too large, malformed): answered, and the connection
        ends, as what follows cannot be told apart from the rest of it."""
        self._head_done()
        self.io.write(status_answer(code, reason, message, close=True))
        self.io.close()
        self.state.accounting.refused_head(self.listener.name, known_peer(self.state, self.peering_fp), code, reason)

    def _request(self, request: Request) -> None:
        state = self.state
        listener = self.listener
        self.busy = True
        self.start = time.perf_counter()
        self.method, self.path = request.method, request.target
        self.code = 0
        self.outcome = None
        self.retried = False
        self.watch = False
        self.head_only = request.method == b"HEAD"
        state.accounting.in_flight[listener.name].inc()
        client = self.client
        if client is None:
            client = self.client = ClientState()
        if request.expects_continue and request.has_body:
            self.io.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # its body follows once the client reads this
        if listener.peer_calls and request.target.startswith(_PEER_PREFIX):
            self._peer_call(request, client)
            return
        try:
            decision = listener.admit(state, client, self.peering_fp, request)
        except Refusal as refusal:
            self.close_after = client.close
            if not request.has_body or self._open_body(request, keep=False):
                self._refuse(refusal)
            return
        self.close_after = client.close
        if request.has_body and not self._open_body(request, keep=True):
            return
        if isinstance(decision, AwaitRegistry):
            self._wait(lambda: caught_up(state, decision, listener.admit, state, client, self.peering_fp, request),
                       self._caught_up)
            return
        self._decided(decision)  # type: ignore[arg-type]

    def _wait(self, start: Callable[[], Awaitable[Any]], then: Callable[[Any], None]) -> None:
        self.waiting = True
        self.io.wait(start, then)

    def _caught_up(self, decision: Decision) -> None:
        """The registry the request waited for came (or the wait's bound passed): its admission on it."""
        self.waiting = False
        self.close_after = self.client.close  # type: ignore[union-attr]
        self._decided(decision)

    def _decided(self, decision: Decision) -> None:
        """Admission's decision on the request in progress: upstream at once, or an exchange at Dex or a
        TokenReview first. The keep-alive request takes this path as every other: a Refusal of the listener's pool
        (the egress's peer gone since admission) is answered, never raised into the transport."""
        self.watch = decision.watch
        self.decision = decision
        if isinstance(decision, Admitted):
            self._completed(decision)
        else:
            self._wait(lambda: complete(self.state, self.client, decision), self._completed)  # type: ignore

    def _completed(self, admitted: Admitted) -> None:
        """The request is admitted: `admitted.head` goes upstream, on a pooled connection or a new one."""
        self.waiting = False
        decision, self.decision = self.decision, None
        self.head = admitted.head
        try:
            self.pool = self.listener.pool(self.state, decision)  # type: ignore[arg-type]
            self.authority = self.listener.authority(self.client, decision)  # type: ignore[arg-type]
        except Exception as exc:  # a Refusal when no pool can take it (the egress's peer is gone)
            self.failed(exc)
            return
        self._go()

    def _go(self) -> None:
        """The request in progress goes upstream: on a pooled connection, or a new one."""
        pool: RelayPool = self.pool  # type: ignore[assignment]
        relay = pool.take()
        if relay is None:
            self._wait(pool.connect, self._connected)
        elif self.open:
            self._send(relay)
        else:
            pool.park(relay)

    def _connected(self, relay: Relay) -> None:
        """A new upstream connection for the request in progress."""
        self.waiting = False
        # A body sent on a fresh connection that fails is not sent again: that upstream really failed.
        self.retried = self.retried or (self.upload is not None and self.upload.active)
        if not self.open:
            self.pool.park(relay)  # type: ignore[union-attr]
            return
        self._send(relay)

    def _send(self, relay: Relay) -> None:
        state = self.state
        authority = self.authority
        if authority is None or not state.streams.add(self, authority, self.withdrawn, state.registry,
                                                      self.listener.namespace(self.path, self.watch)):
            relay.pool.park(relay)
            self._refuse(not_held(authority))
            return
        self.relay = relay
        upload = self.upload
        body = upload is not None and upload.active
        relay.start(self, self.head, self.head_only, body)
        if body:
            upload.attach(relay)  # type: ignore[union-attr]
            if self.body_held:
                self.body_held = False
                self._reading()
        if self.paused:
            relay.pause_reading()

    def failed(self, exc: Exception) -> None:
        """A wait of the request in progress failed: its Refusal, the upstream's failure before any answer, or a
        fault inside the gateway."""
        self.waiting = False
        if isinstance(exc, Refusal):
            self._refuse(exc)
        elif isinstance(exc, UpstreamError):
            self._upstream_refusal(exc)
        else:  # a fault inside the gateway: 500, logged with its traceback (which names code, never the request's
            # headers or body), and the connection ends
            log.error("request failed inside the gateway: %s", type(exc).__name__, exc_info=exc)
            self.close_after = True
            self._refuse(Refusal(500, reasons.INTERNAL_ERROR, "the gateway failed to answer this request; it is "
                                 "logged"), ERROR)

    # ----- answers ------------------------------------------------------------------------------------------
    def _refuse(self, refusal: Refusal, outcome: str = REFUSED) -> None:
        close = closes_connection(refusal)
        if self.open:
            self.io.write(status_answer(refusal.code, refusal.reason, refusal.message,
                                        close=close or self.close_after, retry_after=refusal.retry_after))
        if close:
            self.close_after = True
        self._end(refusal.code, outcome, refusal.reason)

    def withdrawn(self) -> None:
        """What admitted the request in progress was withdrawn (authority.OpenStreams): the connection ends."""
        if self.busy and self.outcome is None:
            self.outcome = WITHDRAWN
        if self.open:
            self.io.abort()

    def _end(self, code: int, outcome: str, reason: str | None = None) -> None:
        self.state.streams.discard(self)
        self.busy = False
        self._finish(code, outcome, reason)
        self.last = self.clock()
        upload = self.upload
        if upload is not None:
            upload.drop()
        if self.body_held:
            self.body_held = False
            self._reading()
        if not self.open:
            return
        if self.close_after:
            self.io.close()
            return
        if upload is not None and upload.open:
            return  # the rest of its body is read and dropped first
        if self.reader.buffer:
            self._next()
        elif self.reading_paused:
            self.reading_paused = False
            self._reading()

    def _finish(self, code: int, outcome: str, reason: str | None = None) -> None:
        accounting = self.state.accounting
        accounting.in_flight[self.listener.name].dec()
        accounting.finish(self.listener.name, self.client.peer, self.client.capabilities, self.method.decode(),
                          self.path.split(b"?", 1)[0].decode("latin-1"), code, self.start, outcome, reason)
