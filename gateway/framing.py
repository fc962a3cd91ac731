"""HTTP/1.1 framing as sans-I/O objects: bytes in, events out, no socket and no protocol object (h11's readers
are the model). The heads are read by llhttp with the module's checks on top (heads.py); the bodies are followed
here with a few integers of state.

- `RequestHeadReader` reads the entrance's request heads (HTTP/1.1; an origin-form target; well-formed fields
  within the limits; a body framing it can read, `request_framing`); anything else is `Refused`, with the answer
  to give (431 over the limits, 400 AmbiguousBodyLength or MalformedRequest).
- `RequestBodyReader` follows a request's body (Content-Length or chunked, `request_framing` says which) with the
  same chunk reader as the response framer, bounded by a limit, and gives back the bytes after it (the next
  request's).
- `ResponseFramer` follows an upstream's answer: its head (`ResponseHead`), its body (`Data`) and its end
  (`EndOfMessage`, which says whether the connection may carry another request). It is the data plane's one
  response framer: the entrance relays the body as it came (`decode=False`), the egress reads
  the payload (`decode=True`, chunk framing removed). Anything that cannot be relayed safely (a smuggling shape,
  a coding the client would not see, an interim answer, a bare LF in a chunk line) is a `FramingError`.
"""

from __future__ import annotations

import re

from gateway.heads import (CHUNKED, LENGTH, MAX_RESPONSE_HEAD, NEED_DATA, NO_BODY, UNTIL_CLOSE, AmbiguousLength,
                           FramingError, Refused, Request, RequestHeadReader, ResponseHead, parse_request_head,
                           parse_response_head, relay_head, request_framing)

__all__ = ["CHUNKED", "Refused", "LENGTH", "NEED_DATA", "NO_BODY", "UNTIL_CLOSE", "AmbiguousLength", "BodyTooLarge",
           "Data", "EndOfMessage", "FramingError", "Request", "RequestBodyReader", "RequestHeadReader",
           "ResponseFramer", "ResponseHead", "parse_request_head", "parse_response_head", "relay_head",
           "request_framing"]

MAX_CHUNK_LINE = 4096
"""Longest chunk-size or trailer line of a chunked body."""


class Data:
    """Body bytes: as they came on the wire (relaying) or the payload alone (decoding)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Data) and self.data == other.data

    def __repr__(self) -> str:
        return f"Data({self.data!r})"


class EndOfMessage:
    """The answer is complete; `reuse` says whether its connection may carry the next request."""

    __slots__ = ("reuse",)

    def __init__(self, reuse: bool) -> None:
        self.reuse = reuse

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EndOfMessage) and self.reuse == other.reuse

    def __repr__(self) -> str:
        return f"EndOfMessage(reuse={self.reuse})"


# The two ends there are, made once: the framer hands these out rather than a new object per answer.
_END = {True: EndOfMessage(True), False: EndOfMessage(False)}


# Framer states: no exchange, waiting for the head, in the body (by framing), the answer complete.
_IDLE, _HEAD, _LENGTH, _CHUNK_LINE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _UNTIL_CLOSE, _DONE = range(9)
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?")


class _Chunks:
    """The chunked transfer coding followed through bytes as they arrive, with a few integers of state: what the
    response framer and the request body reader share. `TRAILERS` says whether trailer fields may follow."""

    __slots__ = ("state", "remaining", "line")
    TRAILERS = True

    def _chunk_sized(self, size: int) -> None:
        """A chunk of `size` bytes begins (0: the last)."""

    def _chunk_events(self, data: bytes, events: list) -> int:
        """The `Data` of `data` appended to `events`: as it came, or the payload alone when `decode` (of the
        subclass) is set; the index just past the body's end, or -1."""
        pieces: list[bytes] | None = [] if self.decode else None  # type: ignore[attr-defined]
        end = self._chunked(data, pieces)
        if pieces is None:
            body = data if end < 0 else data[:end]
            if body:
                events.append(Data(body))
        elif pieces:
            events.append(Data(b"".join(pieces)))
        return end

    def _chunked(self, data: bytes, pieces: list[bytes] | None) -> int:
        """Follow the chunked encoding through `data` (payload into `pieces` when decoding); the index just past
        the body's end, or -1. Strict: CRLF line ends only, a hexadecimal size, no more than MAX_CHUNK_LINE bytes
        in a size or trailer line."""
        i, n = 0, len(data)
        while i < n:
            if self.state == _CHUNK_DATA:
                take = min(self.remaining, n - i)
                if pieces is not None:
                    pieces.append(data[i:i + take])
                i += take
                self.remaining -= take
                if not self.remaining:
                    self.state = _CHUNK_CRLF
                continue
            j = data.find(b"\n", i)
            if j < 0:
                self.line += data[i:]
                if len(self.line) > MAX_CHUNK_LINE:
                    raise FramingError("chunk line too long")
                return -1
            line = self.line + data[i:j]
            self.line = b""
            i = j + 1
            if not line.endswith(b"\r"):
                raise FramingError("chunk line not ended by CRLF")
            line = line[:-1]
            if len(line) > MAX_CHUNK_LINE:
                raise FramingError("chunk line too long")
            if self.state == _CHUNK_LINE:
                m = _CHUNK_SIZE.fullmatch(line)
                if m is None:
                    raise FramingError("bad chunk size")
                size = int(m.group(1), 16)
                self._chunk_sized(size)
                if size:
                    self.state, self.remaining = _CHUNK_DATA, size
                else:
                    self.state = _TRAILER
            elif self.state == _CHUNK_CRLF:
                if line:
                    raise FramingError("chunk not followed by CRLF")
                self.state = _CHUNK_LINE
            elif not line:  # _TRAILER: an empty line ends the body
                self.state = _DONE
                return i
            elif not self.TRAILERS:
                raise FramingError("trailer fields after a chunked body")
        return -1


class ResponseFramer(_Chunks):
    """The answers on one upstream connection, one exchange at a time: `start(head_only)` when a request has
    been sent, then `feed(data)` and `feed_eof()` return the events the bytes make. The head is read by llhttp
    (`parse_response_head`); the body's framing is followed here with a few integers of state, so that a
    connection streaming a watch keeps no parser. A `FramingError` means the answer (and the connection) cannot
    be used."""

    __slots__ = ("decode", "head", "started", "reuse", "head_only")

    def __init__(self, *, decode: bool) -> None:
        self.decode = decode
        self.state = _IDLE
        self.head = b""
        self.remaining = 0
        self.line = b""
        self.started = False
        self.reuse = False
        self.head_only = False

    def start(self, head_only: bool) -> None:
        """A request was sent: expect its answer."""
        self.state = _HEAD
        self.head = b""
        self.line = b""
        self.remaining = 0
        self.started = False
        self.head_only = head_only

    @property
    def waiting_for_head(self) -> bool:
        return self.state == _HEAD

    @property
    def in_answer(self) -> bool:
        """An exchange is under way (started and not complete)."""
        return _HEAD <= self.state < _DONE

    def feed(self, data: bytes) -> list:
        if not data:
            return []
        state = self.state
        if state == _IDLE or state == _DONE:
            raise FramingError("bytes nobody asked for")
        if not self.started:
            self.started = True
        events: list = []
        if state == _HEAD:
            buf = self.head + data if self.head else data
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_RESPONSE_HEAD:
                    raise FramingError("the response head is too large")
                self.head = buf
                return events
            self.head = b""
            if end > MAX_RESPONSE_HEAD:
                raise FramingError("the response head is too large")
            head = parse_response_head(buf[:end], self.head_only)
            events.append(head)
            self.reuse = head.keep_alive
            framing = head.framing
            if framing == LENGTH and head.length:
                state, self.remaining = _LENGTH, head.length
            elif framing == CHUNKED:
                state = _CHUNK_LINE
            elif framing == UNTIL_CLOSE:
                state = _UNTIL_CLOSE
            else:
                state = _DONE
            self.state = state
            data = buf[end + 4:]
        if state == _LENGTH:
            if len(data) < self.remaining:
                self.remaining -= len(data)
                if data:
                    events.append(Data(data))
                return events
            if len(data) > self.remaining:
                self.reuse = False  # more than the announced body: never reuse
                data = data[:self.remaining]
            self.remaining = 0
            if data:
                events.append(Data(data))
            self.state = _DONE
        elif state == _UNTIL_CLOSE:
            if data:
                events.append(Data(data))
            return events
        elif state != _DONE:
            end = self._chunk_events(data, events)
            if end < 0:
                return events
            if end < len(data):
                self.reuse = False
        elif data:
            self.reuse = False  # bytes after an answer without a body
        events.append(_END[self.reuse])
        return events

    def feed_eof(self) -> list:
        """The upstream closed the connection: the end of an answer framed by the close, else a FramingError."""
        state = self.state
        if state == _UNTIL_CLOSE:
            self.state = _DONE
            return [_END[False]]
        if state == _HEAD and not self.started:
            raise FramingError("the upstream closed the connection before answering")
        if _HEAD <= state < _DONE:
            raise FramingError("the upstream closed the connection in the middle of the answer")
        return []


class BodyTooLarge(FramingError):
    """A request body over the reader's limit."""


class RequestBodyReader(_Chunks):
    """The body of one request on a client connection, from the bytes as they arrive: `start(length, chunked)`
    with the request's framing (`request_framing`), then `feed(data)` answers the events the bytes make (`Data`,
    then `EndOfMessage` once the body is complete) and the bytes after the body, which belong to the next request.
    Relaying (`decode=False`) the bytes go as they came, chunk framing included; decoding, the payload alone.
    More than `limit` bytes of payload is a `BodyTooLarge`, a chunked body that is not strictly well formed (or
    has trailer fields, which nothing upstream needs and a smuggler could use) a `FramingError`. One per
    connection, reused for each request with a body."""

    __slots__ = ("decode", "limit", "seen")
    TRAILERS = False

    def __init__(self, *, decode: bool, limit: int) -> None:
        self.decode = decode
        self.limit = limit
        self.state = _IDLE
        self.remaining = 0
        self.line = b""
        self.seen = 0

    def start(self, length: int | None, chunked: bool, *, decode: bool | None = None, limit: int | None = None
              ) -> None:
        """A body of this framing follows; `decode` and `limit`, when given, hold for it and those after it."""
        if decode is not None:
            self.decode = decode
        if limit is not None:
            self.limit = limit
        self.line, self.seen = b"", 0
        if chunked:
            self.state, self.remaining = _CHUNK_LINE, 0
        else:
            self._chunk_sized(length or 0)
            self.state, self.remaining = (_LENGTH, length) if length else (_DONE, 0)

    @property
    def done(self) -> bool:
        return self.state == _DONE

    def _chunk_sized(self, size: int) -> None:
        self.seen += size
        if self.seen > self.limit:
            raise BodyTooLarge(f"the request body is larger than {self.limit} bytes")

    def feed(self, data: bytes) -> tuple[list, bytes]:
        """The events of `data` and what follows the body in it (b"" while the body goes on)."""
        state = self.state
        if state == _IDLE:
            raise FramingError("no request body is being read")
        if state == _DONE:
            return [], data
        events: list = []
        if state == _LENGTH:
            take = min(self.remaining, len(data))
            if take:
                events.append(Data(data[:take] if take < len(data) else data))
            self.remaining -= take
            if self.remaining:
                return events, b""
            self.state = _DONE
            events.append(_END[True])
            return events, data[take:]
        end = self._chunk_events(data, events)
        if end < 0:
            return events, b""
        events.append(_END[True])
        return events, data[end:]

