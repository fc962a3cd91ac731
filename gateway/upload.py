"""The body of a request on the entrance's raw path, on its way upstream: read as it arrives (framing's
`RequestBodyReader`, the bytes relayed as the client framed them, bounded by `Limits.max_body_bytes`), queued
while the request waits for its admission or an upstream connection, sent once a relay takes it, and kept until
the answer begins, so that a pooled connection the upstream had closed meanwhile can be retried with the whole
body (as `upstream.UpstreamPool` does for the aiohttp path). After the answer, or a refusal, what is left of the
body is read and dropped, so that the connection can serve the next request. Sans-I/O but for the relay's
`send`; the entrance protocol feeds it and decides what a failure means."""

from __future__ import annotations

from typing import Protocol

from contract import reasons
from contract.errors import Refusal
from gateway.framing import BodyTooLarge, Data, FramingError, RequestBodyReader

#: Bytes of a body queued before a relay takes them, past which the client's connection stops being read.
QUEUE_HIGH = 64 * 1024


class BodySink(Protocol):
    """Where a body goes (relay.Relay)."""

    def send(self, data: bytes) -> None: ...

    def end_body(self) -> None: ...


class Upload:
    """The body of the request in progress on one connection (one object per connection, reused). `active`: the
    request in progress has a body; `open`: more of it is still to come from the client."""

    __slots__ = ("reader", "active", "open", "queue", "queued", "kept", "sink")

    def __init__(self, limit: int) -> None:
        self.reader = RequestBodyReader(decode=False, limit=limit)
        self.active = False
        self.open = False
        self.queue: list[bytes] | None = None
        self.queued = 0
        self.kept: list[bytes] | None = None
        self.sink: BodySink | None = None

    def begin(self, length: int | None, chunked: bool, keep: bool) -> None:
        """A request head with this framing was read: its body follows. `keep` False: it is read and dropped (the
        request was refused). BodyTooLarge when a Content-Length says it is over the limit."""
        self.sink = None
        self.queue, self.kept, self.queued = ([], [], 0) if keep else (None, None, 0)
        self.reader.start(length, chunked)
        self.active = keep
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
        if sink is not None:
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

    def drop(self) -> None:
        """The request is over: the rest of its body, if any, is read and dropped."""
        self.sink = None
        self.queue = self.kept = None
        self.queued = 0
        self.active = False


def body_refusal(exc: FramingError, limit: int) -> Refusal:
    """What a client is answered for a body that cannot be relayed (`Upload.feed`'s error)."""
    if isinstance(exc, BodyTooLarge):
        return Refusal(413, reasons.REQUEST_ENTITY_TOO_LARGE, f"the request body is larger than {limit} bytes")
    return Refusal(400, reasons.MALFORMED_REQUEST, f"the request body is not valid HTTP/1.1 ({exc}); send a "
                   "well-formed body")
