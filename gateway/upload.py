"""The body of a request on the engine's raw path (the entrance's and the egress's), on its way upstream: read as
it arrives (framing's `RequestBodyReader`, the bytes relayed as the client framed them, bounded by
`Limits.max_body_bytes`), queued while the request waits for its admission or an upstream connection, sent once a
relay takes it, and kept until the answer begins, so that a pooled connection the upstream had closed meanwhile
can be retried with the whole body. After the answer, or a refusal, what is left of the body is read and
dropped, so that the connection can serve the next request. `Upload` is sans-I/O but for the relay's `send`;
`Uploading` is the connection's part that feeds it and decides what a failure means."""

from __future__ import annotations

from typing import Any, Protocol

from contract import reasons
from contract.errors import Refusal
from gateway.accounting import INTERRUPTED
from gateway.framing import BodyTooLarge, Data, FramingError, Request, RequestBodyReader
from gateway.state import GatewayState

#: Bytes of a body queued before a relay takes them, past which the client's connection stops being read.
QUEUE_HIGH = 64 * 1024


class BodySink(Protocol):
    """Where a body goes (relay.Relay)."""

    def send(self, data: bytes) -> None: ...

    def end_body(self) -> None: ...


class Upload:
    """The body of the request in progress on one connection (one object per connection, reused). `active`: the
    request in progress has a body; `open`: more of it is still to come from the client."""

    __slots__ = ("reader", "limit", "active", "open", "queue", "queued", "kept", "sink", "collected")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reader = RequestBodyReader(decode=False, limit=limit)
        #: The payload of a body that is answered here (a peer call's), not relayed.
        self.collected: list[bytes] | None = None
        self.active = False
        self.open = False
        self.queue: list[bytes] | None = None
        self.queued = 0
        self.kept: list[bytes] | None = None
        self.sink: BodySink | None = None

    def begin(self, length: int | None, chunked: bool, keep: bool, collect: int | None = None) -> None:
        """A request head with this framing was read: its body follows. `keep` False: it is read and dropped (the
        request was refused); `collect`: its payload, of at most that many bytes, is kept in `collected` (`payload`)
        instead of relayed. BodyTooLarge when a Content-Length says it is over the limit."""
        self.sink = None
        self.queue, self.kept, self.queued = ([], [], 0) if keep and collect is None else (None, None, 0)
        self.collected = [] if keep and collect is not None else None
        self.reader.start(length, chunked, decode=collect is not None, limit=self.limit if collect is None else collect)
        self.active = keep and collect is None
        self.open = not self.reader.done

    def feed(self, data: bytes) -> bytes:
        """Bytes from the client while the body is open; what follows the body (the next request's), b"" while
        it goes on. FramingError (BodyTooLarge over the limit) for a body that cannot be relayed safely."""
        events, rest = self.reader.feed(data)
        for event in events:
            if type(event) is Data:
                self._out(event.data)
            else:
                self.open = False
                if self.sink is not None:
                    self.sink.end_body()
        return rest

    def _out(self, data: bytes) -> None:
        sink = self.sink
        if self.collected is not None:
            self.collected.append(data)
        elif sink is not None:
            sink.send(data)
            if self.kept is not None:
                self.kept.append(data)
        elif self.queue is not None:
            self.queue.append(data)
            self.queued += len(data)

    def attach(self, sink: BodySink) -> None:
        """A relay takes the body: what an earlier one was sent (a retry), then what waited for it."""
        self.sink = sink
        for data in self.kept or ():
            sink.send(data)
        if self.queue:
            for data in self.queue:
                sink.send(data)
            if self.kept is not None:
                self.kept += self.queue
            self.queue, self.queued = [], 0
        if not self.open:
            sink.end_body()

    def detach(self) -> None:
        """The relay is gone (failed, or its answer ended): what comes next waits for another, or is dropped."""
        self.sink = None

    def answered(self) -> None:
        """The answer began: no retry any more, nothing to keep."""
        self.kept = None

    def abandon(self) -> None:
        """The body cannot be read on (the connection ends): nothing more of it is expected."""
        self.open = False
        self.drop()

    def payload(self) -> bytes:
        """The collected body (`begin(..., collect=...)`), once it is complete."""
        return b"".join(self.collected or ())

    def drop(self) -> None:
        """The request is over: the rest of its body, if any, is read and dropped."""
        self.sink = None
        self.queue = self.kept = self.collected = None
        self.queued = 0
        self.active = False


def body_refusal(exc: FramingError, limit: int) -> Refusal:
    """What a client is answered for a body that cannot be relayed (`Upload.feed`'s error)."""
    if isinstance(exc, BodyTooLarge):
        return Refusal(413, reasons.REQUEST_ENTITY_TOO_LARGE, f"the request body is larger than {limit} bytes")
    return Refusal(400, reasons.MALFORMED_REQUEST, f"the request body is not valid HTTP/1.1 ({exc}); send a "
                   "well-formed body")


class Uploading:
    """The request bodies of one connection (serving.Serving, which this is a part of: it routes the client's
    bytes here while a body is open, and answers through its own `_refuse`)."""

    __slots__ = ()
    state: GatewayState
    upload: Upload | None
    reader: Any
    io: Any
    open: bool
    relay: Any
    waiting: bool
    busy: bool
    code: int
    outcome: str | None
    close_after: bool
    body_held: bool
    call: Any

    def _open_body(self, request: Request, keep: bool, call: bool = False) -> bool:
        """The request's body follows its head: read it, into the upstream (`keep`) or dropped (the request was
        refused). False when it failed at once (and was answered)."""
        upload = self.upload = self.upload or Upload(self.state.limits.max_body_bytes)
        try:
            upload.begin(request.length, request.chunked, keep,
                         self.state.limits.max_peer_call_bytes if call else None)
        except BodyTooLarge as exc:
            if keep:  # a peer call's (admission bounds a proxied request's Content-Length before)
                self._body_failed(body_refusal(exc, self.state.limits.max_peer_call_bytes))
                return False
            self.close_after = True  # refused already: a body over the limit is not read, the connection ends
            return True
        if not upload.open:
            return True
        buffered = self.reader.take()  # type: ignore[union-attr]
        return not buffered or self._feed_body(buffered)

    def _feed_body(self, data: bytes) -> bool:
        """Bytes of the open body; False when they broke it (then answered, or the connection ends)."""
        upload = self.upload
        try:
            rest = upload.feed(data)  # type: ignore[union-attr]
        except FramingError as exc:
            self._body_failed(body_refusal(exc, self.state.limits.max_body_bytes))
            return False
        if rest:
            self.reader.feed(rest)  # type: ignore[union-attr]
        if upload.queued > QUEUE_HIGH and not self.body_held:  # type: ignore[union-attr]
            self.body_held = True  # a body that waits for admission or a connection is not read ahead of it
            self._reading()
        return True

    def _body_failed(self, refusal: Refusal) -> None:
        """The body cannot be relayed (too large, malformed): refused if nothing was answered yet; the connection
        ends either way, as the rest of the stream cannot be read."""
        self.upload.abandon()  # type: ignore[union-attr]
        self.call = None
        self.close_after = True
        if not self.open:
            return
        if not self.busy:  # a refused request's body, read to be dropped
            self.io.close()
            return
        if self.code:  # the answer had begun
            self.outcome = self.outcome or INTERRUPTED
            self.io.abort()
            return
        relay, self.relay = self.relay, None
        if relay is not None:
            relay.detach()
        if self.waiting:
            self.waiting = False
            self.io.cancel()
        self._refuse(refusal)

    def upstream_writable(self, writable: bool) -> None:
        """The upstream's connection takes the body's bytes again, or does not (relay.RelayOwner)."""
        if self.body_held == writable:
            self.body_held = not writable
            self._reading()
