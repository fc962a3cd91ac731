"""The data plane's HTTP/1.1 engine: every request of the entrance (peers, mTLS) and of the egress (local
consumers, toward a peer's entrance) is served here, on raw bytes, by one protocol class.

aiohttp's server builds a request object, a header multidict, a URL, a response object and a writer per request;
for a proxy whose answers are the upstream's own bytes that is most of the CPU a request costs. This protocol only
moves bytes: request heads are read by `framing.RequestHeadReader` (what it cannot read safely is refused, and the
connection ends), admitted by the connection's listener (`listeners.Entrance`, `listeners.Egress`: the one
admission chain of admission.py), the upstream head goes to a pooled connection of the listener's
`relay.RelayPool` with the body after it (`upload.Upload`, relayed as the client framed it), and the answer comes
back as bytes through `relay.Relay`; calls of the peer protocol under /peering/v1/ are answered here too, on the
entrance (`calls.PeerCalls`). The head deadline, the idle timeout, withdrawal (`authority.OpenStreams`), the
watch gauge, the accounting and the refusals are this class's, for both listeners.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from contract import reasons
from contract.errors import Refusal
from contract.paths import PEER_PREFIX
from gateway.accounting import ANSWERED, CLIENT_CLOSED, CLIENT_CLOSED_CODE, ERROR, INTERRUPTED, REFUSED, WITHDRAWN
from gateway.admission import Admitted, ClientState, Decision, caught_up, closes_connection, complete, known_peer, \
    not_held
from gateway.authority import Authority
from gateway.calls import PeerCalls
from gateway.catchup import AwaitRegistry
from gateway.framing import NEED_DATA, UNTIL_CLOSE, Refused, Request, RequestHeadReader, ResponseHead
from gateway.listeners import Listener
from gateway.protocol import ControlHandlers
from gateway.relay import Relay, RelayPool
from gateway.state import GatewayState
from gateway.status import status_answer
from gateway.upload import Upload, Uploading
from gateway.upstream import CERTIFICATE_REFUSED, UpstreamError

log = logging.getLogger("gateway")

_PEER_PREFIX = PEER_PREFIX.encode()


class Connection(PeerCalls, Uploading, asyncio.Protocol):
    """One TLS client connection of `listener` (the entrance or the egress), served on raw bytes."""

    __slots__ = ("state", "handlers", "listener", "call", "transport", "peering_fp", "reader", "client", "busy",
                 "relay", "task", "close_after", "last", "timer", "paused", "reading_paused", "code", "method",
                 "path", "start", "watch", "head", "retried", "head_timer", "outcome", "upload",
                 "body_held", "pool", "authority")

    def __init__(self, state: GatewayState, handlers: ControlHandlers, listener: Listener,
                 peering_fp: str | None) -> None:
        self.state = state
        self.handlers = handlers
        self.listener = listener
        #: A peer call's request and admission, waiting for the rest of its body.
        self.call: tuple[Request, object] | None = None
        self.transport: Any = None
        #: The client certificate's fingerprint (the connection's, from its handshake; None on the egress).
        self.peering_fp = peering_fp
        # Made with the first bytes and the first request: a connection that only holds costs neither.
        self.reader: RequestHeadReader | None = None
        self.client: ClientState | None = None
        self.busy = False
        self.relay: Relay | None = None
        self.task: asyncio.Task | None = None
        self.close_after = False
        self.last = 0.0
        self.timer: asyncio.TimerHandle | None = None
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
        self.retried = False
        self.head_timer: asyncio.TimerHandle | None = None
        #: The body of the request in progress (made with the first request that has one).
        self.upload: Upload | None = None
        #: The client is not read while a body waits for an upstream that does not take it yet.
        self.body_held = False
        #: Where the request in progress goes, and what admitted it (the listener's answers, once it is admitted).
        self.pool: RelayPool | None = None
        self.authority: Authority | None = None

    # ----- connection -------------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        loop = self.state.loop
        self.last = loop.time()
        self.timer = loop.call_at(self.last + self.state.limits.idle_timeout, self._idle_check)

    def _idle_check(self) -> None:
        self.timer = None
        if self.transport is None:
            return
        loop = self.state.loop
        due = self.last + self.state.limits.idle_timeout
        if not self.busy and loop.time() >= due:
            self.transport.close()  # an idle keep-alive connection: closed after `idle_timeout`, as the join's is
            return
        self.timer = loop.call_at(max(due, loop.time() + 1), self._idle_check)

    def data_received(self, data: bytes) -> None:
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
        if self.transport is not None:
            if self.reading_paused or self.body_held:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def pause_writing(self) -> None:
        self.paused = True
        if self.relay is not None:
            self.relay.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if self.relay is not None:
            self.relay.resume_reading()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._head_done()
        if self.task is not None:
            self.task.cancel()
            self.task = None
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
        while not self.busy and self.transport is not None:
            event = self.reader.next_event()
            if event is NEED_DATA:
                break
            if type(event) is Refused:
                self._refuse_head(event.code, event.reason, event.message)  # type: ignore[union-attr]
                return
            self.last = self.state.loop.time()
            if self.head_timer is not None:
                self._head_done()
            self._request(event)  # type: ignore[arg-type]
        if not self.busy and self.transport is not None:
            if self.reader.buffer and self.head_timer is None:  # a head begun: it has a deadline from now
                self.head_timer = self.state.loop.call_later(self.state.limits.request_head_timeout, self._head_late)
            if self.reading_paused:
                self.reading_paused = False
                self._reading()

    def _head_done(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_late(self) -> None:
        """A request head not complete in time (a slow client trickling it): 408, and the connection ends."""
        self.head_timer = None
        if self.transport is None or self.busy:
            return
        limit = self.state.limits.request_head_timeout
        self._refuse_head(408, reasons.REQUEST_TIMEOUT, f"the request head was not complete within {limit:g} s; "
                          "send the whole head at once")

    def _refuse_head(self, code: int, reason: str, message: str) -> None:
        """A request head refused before admission (too slow, too large, malformed): answered, and the connection
        ends, as what follows cannot be told apart from the rest of it."""
        self._head_done()
        self.transport.write(status_answer(code, reason, message, close=True))
        self.transport.close()
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
        state.accounting.in_flight[listener.name].inc()
        client = self.client
        if client is None:
            client = self.client = ClientState()
        if request.expects_continue and request.has_body:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # its body follows once the client reads this
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
        head_only = request.method == b"HEAD"
        if isinstance(decision, AwaitRegistry):
            self.task = state.loop.create_task(self._slow(decision, head_only, request))
            return
        self.watch = decision.watch  # type: ignore[union-attr]
        if isinstance(decision, Admitted):
            self.head = decision.head
            pool = self.pool = listener.pool(state, decision)
            self.authority = listener.authority(client, decision)
            relay = pool.take()
            if relay is not None:
                self._send(relay, head_only)
                return
        self.task = state.loop.create_task(self._slow(decision, head_only))  # type: ignore[arg-type]

    async def _slow(self, decision: Decision | AwaitRegistry | None, head_only: bool,
                    request: Request | None = None) -> None:
        """The parts of a request that wait: a newer registry (`request` is admitted again on it), a token
        exchange at Dex or a TokenReview, a new upstream connection. None: the request goes again, as it was
        admitted, on a new connection of its pool."""
        state, listener = self.state, self.listener
        try:
            if isinstance(decision, AwaitRegistry):
                decision = await caught_up(state, decision, listener.admit, state, self.client,  # type: ignore
                                           self.peering_fp, request)
                self.close_after = self.client.close  # type: ignore[union-attr]
                self.watch = decision.watch  # type: ignore[union-attr]
            if decision is not None:
                self.head = (await complete(state, self.client, decision)).head  # type: ignore[arg-type]
                self.pool = listener.pool(state, decision)  # type: ignore[arg-type]
                self.authority = listener.authority(self.client, decision)  # type: ignore[arg-type]
            pool: RelayPool = self.pool  # type: ignore[assignment]
            relay = pool.take()
            if relay is None:
                relay = await pool.connect()
                # A body sent on a fresh connection that fails is not sent again: that upstream really failed.
                self.retried = self.retried or (self.upload is not None and self.upload.active)
        except Exception as exc:
            self._failed(exc)
            return
        self.task = None
        if self.transport is None:
            pool.park(relay)
            return
        self._send(relay, head_only)

    def _send(self, relay: Relay, head_only: bool) -> None:
        state = self.state
        authority = self.authority
        if authority is None or not state.streams.add(self, authority, self._withdrawn, state.registry,
                                                      self.listener.namespace(self.path, self.watch)):
            relay.pool.park(relay)
            self._refuse(not_held(authority))
            return
        self.relay = relay
        upload = self.upload
        body = upload is not None and upload.active
        relay.start(self, self.head, head_only, body)
        if body:
            upload.attach(relay)  # type: ignore[union-attr]
            if self.body_held:
                self.body_held = False
                self._reading()
        if self.paused:
            relay.pause_reading()

    # ----- callbacks of the relay (relay.RelayOwner) ------------------------------------------------------
    def response_started(self, head: ResponseHead) -> None:
        self.code = head.code
        if self.upload is not None:
            self.upload.answered()
        if head.framing == UNTIL_CLOSE:
            self.close_after = True  # the body ends when the upstream closes: so does the client's connection
        self.head = b""  # kept only to retry on a fresh connection before any answer; a watch holds no copy
        if self.watch:
            self.state.metrics.watches.labels(self.listener.name, self.client.peer).inc()

    def response_bytes(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def response_done(self) -> None:
        relay, self.relay = self.relay, None
        if self.upload is not None:
            self.upload.detach()
        if relay is not None and self.paused:
            relay.resume_reading()
        if self.watch and self.code:
            self.state.metrics.watches.labels(self.listener.name, self.client.peer).dec()
        self._end(self.code, ANSWERED)

    def upstream_failed(self, err: UpstreamError, got: bool) -> None:
        self.relay = None
        if self.upload is not None:
            self.upload.detach()
        if self.code:
            # The answer had started: the only honest signal left is to cut the client's connection.
            self.state.accounting.upstream_error(self.listener.name, "stream")
            if self.watch:
                self.state.metrics.watches.labels(self.listener.name, self.client.peer).dec()
            code = self.code
            self.busy = False
            self._finish(code, self.outcome or INTERRUPTED)
            if self.transport is not None:
                self.transport.abort()
            return
        if not got and not self.retried and err.kind != CERTIFICATE_REFUSED:
            # A pooled connection the upstream had closed meanwhile: retry once on a new one (a refused client
            # certificate would be refused again).
            self.retried = True
            self.task = self.state.loop.create_task(self._slow(None, self.method == b"HEAD"))
            return
        self._upstream_refusal(err)

    def _upstream_refusal(self, err: UpstreamError) -> None:
        self.state.accounting.upstream_error(self.listener.name, err.kind)
        self._refuse(self.listener.upstream_refusal(err, self.client))  # type: ignore[arg-type]

    def _failed(self, exc: Exception) -> None:
        """A request that failed while it waited (`self.task`'s): its Refusal, the upstream's failure before any
        answer, or a fault inside the gateway."""
        self.task = None
        if isinstance(exc, Refusal):
            self._refuse(exc)
        elif isinstance(exc, UpstreamError):
            self._upstream_refusal(exc)
        else:
            self._internal_error(exc)

    def _internal_error(self, exc: Exception) -> None:
        """A fault inside the gateway: 500, logged with its traceback (which names code, never the request's
        headers or body), and the connection ends."""
        log.error("request failed inside the gateway: %s", type(exc).__name__, exc_info=exc)
        self.close_after = True
        self._refuse(Refusal(500, reasons.INTERNAL_ERROR, "the gateway failed to answer this request; it is logged"),
                     ERROR)

    # ----- answers ------------------------------------------------------------------------------------------
    def _refuse(self, refusal: Refusal, outcome: str = REFUSED) -> None:
        close = closes_connection(refusal)
        if self.transport is not None:
            self.transport.write(status_answer(refusal.code, refusal.reason, refusal.message,
                                               close=close or self.close_after, retry_after=refusal.retry_after))
        if close:
            self.close_after = True
        self._end(refusal.code, outcome, refusal.reason)

    def _withdrawn(self) -> None:
        """What admitted the request in progress was withdrawn (authority.OpenStreams): the connection ends."""
        if self.busy and self.outcome is None:
            self.outcome = WITHDRAWN
        if self.transport is not None:
            self.transport.abort()

    def _end(self, code: int, outcome: str, reason: str | None = None) -> None:
        self.state.streams.discard(self)
        self.busy = False
        self._finish(code, outcome, reason)
        self.last = self.state.loop.time()
        upload = self.upload
        if upload is not None:
            upload.drop()
        if self.body_held:
            self.body_held = False
            self._reading()
        if self.transport is None:
            return
        if self.close_after:
            self.transport.close()
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
