"""HTTP/1.1 framing as sans-I/O objects: bytes in, events out, no socket and no protocol object (h11's readers
are the model), on llhttp (through httptools), the parser of Node.js, which bench/gateway_framing.py measured
four to five times faster than the regex reader the gateway had and as strict once the checks below are added.

- `RequestHeadReader` reads the heads of the plain requests the entrance's raw path serves (HTTP/1.1; GET, HEAD,
  DELETE or OPTIONS; an origin-form target; no body framing; well-formed fields within the limits). For
  anything else it answers `HANDOVER`, and the bytes it holds (`take()`) go to the strict aiohttp path, which
  answers them, refusals included.
- `ResponseFramer` follows an upstream's answer: its head (`ResponseHead`), its body (`Data`) and its end
  (`EndOfMessage`, which says whether the connection may carry another request). It is the data plane's one
  response framer: the raw path relays the body (`decode=False`: chunked bodies stay chunked, re-framed chunk by
  chunk, trailers dropped), the aiohttp path and the egress read the payload (`decode=True`). Anything that
  cannot be relayed safely (a smuggling shape, a coding the client would not see, an interim answer) is a
  `FramingError`.

llhttp refuses bare LF line ends, obs-fold, invalid field names and values, conflicting Content-Lengths and
Content-Length with Transfer-Encoding; on top of it this module refuses every transfer coding but a single
`chunked`, interim answers, other HTTP versions, targets that are not origin-form, and heads over the limits.
"""

from __future__ import annotations

import re

import httptools

from gateway.headers import connection_tokens, response_drop, response_fields

_PLAIN_METHODS = frozenset({b"GET", b"HEAD", b"DELETE", b"OPTIONS"})
_TARGET = re.compile(rb"/[\x21-\x7e]*")
# Request fields that send a request to the aiohttp path: a body, or an interim answer to give.
_NOT_PLAIN = frozenset({b"content-length", b"transfer-encoding", b"expect"})
_OWS = b" \t"

MAX_RESPONSE_HEAD = 64 * 1024
MAX_CHUNK_LINE = 4096
"""Most bytes of a chunked body that may pass without a byte of payload (a chunk-size line, its extensions)."""

Fields = list[tuple[bytes, bytes]]


class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA = _Sentinel("NEED_DATA")
"""The reader needs more bytes before it can say anything."""
HANDOVER = _Sentinel("HANDOVER")
"""The request at the start of the buffer is not one the raw path serves: hand the connection over."""


class Request:
    """A plain request head: method, origin-form target and the fields exactly as they came."""

    __slots__ = ("method", "target", "fields")

    def __init__(self, method: bytes, target: bytes, fields: Fields) -> None:
        self.method = method
        self.target = target
        self.fields = fields

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Request) and (self.method, self.target, self.fields) == (
            other.method, other.target, other.fields)

    def __repr__(self) -> str:
        return f"Request({self.method!r}, {self.target!r}, {self.fields!r})"


class RequestHeadReader:
    """Request heads of one client connection, from the bytes as they arrive.

    `next_event()` answers a `Request` (its bytes are consumed), `NEED_DATA`, or `HANDOVER` for a request the raw
    path does not serve: one that is not plain, a head over `max_head_bytes`, or a target under
    `handover_prefix` (the peer protocol). After `HANDOVER` the bytes from that request on are in `take()`."""

    __slots__ = ("buffer", "max_head_bytes", "max_headers", "handover_prefix", "_parser", "_url", "_fields")

    def __init__(self, *, max_head_bytes: int, max_headers: int, handover_prefix: bytes | None = None) -> None:
        self.buffer = b""
        self.max_head_bytes = max_head_bytes
        self.max_headers = max_headers
        self.handover_prefix = handover_prefix
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._fields: Fields = []

    # llhttp's callbacks
    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields.append((name, value.rstrip(_OWS)))

    def feed(self, data: bytes) -> None:
        self.buffer = self.buffer + data if self.buffer else data

    def next_event(self) -> Request | _Sentinel:
        buf = self.buffer
        if not buf:
            return NEED_DATA
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return HANDOVER if len(buf) > self.max_head_bytes else NEED_DATA
        if end > self.max_head_bytes:
            return HANDOVER
        request = self._parse(buf[:end + 4])
        if request is None or (self.handover_prefix is not None
                               and request.target.startswith(self.handover_prefix)):
            return HANDOVER
        self.buffer = buf[end + 4:]
        return request

    def _parse(self, head: bytes) -> Request | None:
        self._url, self._fields = b"", []
        parser = self._parser
        try:
            parser.feed_data(head)
        except httptools.HttpParserUpgrade:
            # llhttp stops at an upgrade; the request is plain all the same, and admission refuses it.
            self._parser = httptools.HttpRequestParser(self)
        except httptools.HttpParserError:
            self._parser = httptools.HttpRequestParser(self)
            return None
        fields = self._fields
        method = parser.get_method()
        if (method not in _PLAIN_METHODS or parser.get_http_version() != "1.1" or len(fields) > self.max_headers
                or _TARGET.fullmatch(self._url) is None):
            self._parser = httptools.HttpRequestParser(self)
            return None
        for name, _ in fields:
            if name.lower() in _NOT_PLAIN:
                self._parser = httptools.HttpRequestParser(self)  # it waits for a body now
                return None
        return Request(method, self._url, fields)

    def take(self) -> bytes:
        """The bytes not consumed yet (for the aiohttp path after `HANDOVER`)."""
        buf, self.buffer = self.buffer, b""
        return buf


def parse_request_head(head: bytes, max_headers: int) -> Request | None:
    """The plain request in `head` (without its final CRLF CRLF), or None when the raw path does not serve it."""
    return RequestHeadReader(max_head_bytes=len(head) + 4, max_headers=max_headers)._parse(head + b"\r\n\r\n")


# ----- responses -----------------------------------------------------------------------------------------------
# How an answer's body is framed.
LENGTH, CHUNKED, UNTIL_CLOSE, NO_BODY = "length", "chunked", "until-close", "no-body"


class FramingError(ValueError):
    """An answer that cannot be relayed safely; the message says what was wrong with it."""


class ResponseHead:
    """An upstream's response head. `status` is the status line after the version ("200 OK"); `framing` one of
    LENGTH, CHUNKED, UNTIL_CLOSE or NO_BODY; `length` the Content-Length (None without one); `keep_alive`
    whether the upstream allows another request on the connection; `named` the options of its Connection
    fields."""

    __slots__ = ("code", "status", "fields", "framing", "length", "keep_alive", "named")

    def __init__(self, code: int, status: bytes, fields: Fields, framing: str, length: int | None,
                 keep_alive: bool, named: set[bytes] | None) -> None:
        self.code = code
        self.status = status
        self.fields = fields
        self.framing = framing
        self.length = length
        self.keep_alive = keep_alive
        self.named = named

    def kept_fields(self) -> Fields:
        """The fields to pass back to the client (headers.response_fields)."""
        return response_fields(self.fields, self.named)

    @property
    def reason(self) -> str:
        return self.status[4:].decode("latin-1")

    def __repr__(self) -> str:
        return f"ResponseHead({self.code}, {self.framing}, length={self.length}, keep_alive={self.keep_alive})"


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


def response_head(version: str, code: int, reason: bytes, fields: Fields, head_only: bool) -> ResponseHead:
    """The ResponseHead of what llhttp read, to a request that was HEAD or not; a FramingError when the answer
    cannot be relayed safely."""
    if version not in ("1.1", "1.0"):
        raise FramingError("not HTTP/1.x")
    if code < 200:
        raise FramingError("interim answer")  # never asked for: Expect and upgrades are not forwarded
    keep_alive = version == "1.1"
    length: int | None = None
    coded = False
    named: set[bytes] | None = None
    for name, value in fields:
        low = name.lower()
        if low == b"connection":
            tokens = connection_tokens(value)
            named = tokens if named is None else named | tokens
            if b"close" in tokens:
                keep_alive = False
        elif low == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                raise FramingError("bad Content-Length")
            length = int(value)
        elif low == b"transfer-encoding":
            # Only plain chunked framing is relayed: another coding (gzip, chunked) would have to be restated
            # exactly, and the API server never sends one.
            if coded or value.lower() != b"chunked":
                raise FramingError("unsupported transfer coding")
            coded = True
    if coded and length is not None:
        raise FramingError("Content-Length with Transfer-Encoding")
    if head_only or code in (204, 304):
        framing = NO_BODY
    elif coded:
        framing = CHUNKED
    elif length is not None:
        framing = LENGTH
    else:
        framing, keep_alive = UNTIL_CLOSE, False
    status = b"%d %s" % (code, reason) if reason else b"%d" % code
    return ResponseHead(code, status, fields, framing, length, keep_alive, named)


def parse_response_head(head: bytes, head_only: bool) -> ResponseHead:
    """The response head in `head` (without its final CRLF CRLF); a FramingError when the answer cannot be
    relayed safely."""
    framer = ResponseFramer(decode=True)
    framer.start(head_only)
    events = framer.feed(head + b"\r\n\r\n")
    if not events or not isinstance(events[0], ResponseHead):
        raise FramingError("not a whole response head")
    return events[0]


def relay_head(head: ResponseHead) -> bytes:
    """The head to send the client for `head`: hop-by-hop fields dropped (headers.response_fields), the framing
    restated as the body will be relayed."""
    out = [b"HTTP/1.1 ", head.status, b"\r\n"]
    drop = response_drop(head.named)  # headers.response_fields, in the same pass that writes the head
    for name, value in head.fields:
        if name.lower() not in drop:
            out += (name, b": ", value, b"\r\n")
    framing = head.framing
    if framing == LENGTH:
        out.append(b"Content-Length: %d\r\n" % head.length)
    elif framing == CHUNKED:
        out.append(b"Transfer-Encoding: chunked\r\n")
    elif framing == UNTIL_CLOSE:
        out.append(b"Connection: close\r\n")  # the end of the body is the end of the client's connection too
    elif head.length is not None and head.code != 204:
        out.append(b"Content-Length: %d\r\n" % head.length)  # the answer to HEAD, a 304
    out.append(b"\r\n")
    return b"".join(out)


# Framer states: no exchange, waiting for the head, in the body, the answer complete.
_IDLE, _HEAD, _BODY, _DONE = range(4)


class ResponseFramer:
    """The answers on one upstream connection, one exchange at a time: `start(head_only)` when a request has
    been sent, then `feed(data)` and `feed_eof()` return the events the bytes make. A `FramingError` means the
    answer (and the connection) cannot be used."""

    __slots__ = ("decode", "state", "started", "reuse", "head_only", "_parser", "_status", "_fields", "_events",
                 "_head_bytes", "_framing", "_error", "_stalled")

    def __init__(self, *, decode: bool) -> None:
        self.decode = decode
        self.state = _IDLE
        self.started = False
        self.reuse = False
        self.head_only = False
        self._parser: httptools.HttpResponseParser | None = None
        self._status = b""
        self._fields: Fields = []
        self._events: list = []
        self._head_bytes = 0
        self._framing = NO_BODY
        self._error: FramingError | None = None
        self._stalled = 0

    def start(self, head_only: bool) -> None:
        """A request was sent: expect its answer."""
        self._parser = httptools.HttpResponseParser(self)  # a parser per exchange: cheaper than its state kept
        self.state = _HEAD
        self.started = False
        self.head_only = head_only
        self._status, self._fields, self._head_bytes, self._error, self._stalled = b"", [], 0, None, 0

    @property
    def waiting_for_head(self) -> bool:
        return self.state == _HEAD

    @property
    def in_answer(self) -> bool:
        """An exchange is under way (started and not complete)."""
        return self.state == _HEAD or self.state == _BODY

    # llhttp's callbacks
    def on_status(self, status: bytes) -> None:
        self._status += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.state == _HEAD:  # trailers of a chunked body are dropped
            self._fields.append((name, value.rstrip(_OWS)))

    def on_headers_complete(self) -> None:
        parser = self._parser
        try:
            head = response_head(parser.get_http_version(), parser.get_status_code(),  # type: ignore[union-attr]
                                 self._status, self._fields, self.head_only)
        except FramingError as exc:
            self._error = exc
            raise
        self._events.append(head)
        self.reuse = head.keep_alive
        self._framing = head.framing
        self.state = _DONE if head.framing == NO_BODY else _BODY

    def on_body(self, body: bytes) -> None:
        if self.state != _BODY:
            self.reuse = False  # bytes after an answer without a body
        elif self.decode or self._framing != CHUNKED:
            self._events.append(Data(body))
        else:
            self._events.append(Data(b"%x\r\n%b\r\n" % (len(body), body)))

    def on_message_begin(self) -> None:
        if self.state == _DONE:
            self.reuse = False  # a second answer nobody asked for

    def on_message_complete(self) -> None:
        if self.state == _BODY:
            if self._framing == CHUNKED and not self.decode:
                self._events.append(Data(b"0\r\n\r\n"))
            self.state = _DONE

    def feed(self, data: bytes) -> list:
        if not data:
            return []
        state = self.state
        if state == _IDLE or state == _DONE:
            raise FramingError("bytes nobody asked for")
        if not self.started:
            self.started = True
        events = self._events = []
        in_head = state == _HEAD
        try:
            self._parser.feed_data(data)  # type: ignore[union-attr]
        except httptools.HttpParserCallbackError:
            raise self._error or FramingError("malformed response") from None
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if self.state != _DONE:
                raise FramingError(f"malformed response ({exc})") from None
            self.reuse = False  # whatever follows a complete answer is not read
        if self.state == _HEAD:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_RESPONSE_HEAD:
                raise FramingError("the response head is too large")
        elif self.state == _DONE:
            events.append(_END[self.reuse])
        elif self._framing == CHUNKED:
            # llhttp keeps nothing of a chunk-size line, but an answer that sends no payload for this long is not
            # an API server's. The bytes after the head count from the read the head ended in.
            if any(type(e) is Data for e in events):
                self._stalled = 0
            elif in_head:
                end = data.find(b"\r\n\r\n")
                self._stalled = len(data) - end - 4 if end >= 0 else 0
            else:
                self._stalled += len(data)
            if self._stalled > MAX_CHUNK_LINE:
                raise FramingError("chunk line too long")
        return events

    def feed_eof(self) -> list:
        """The upstream closed the connection: the end of an answer framed by the close, else a FramingError."""
        state = self.state
        if state == _BODY and self._framing == UNTIL_CLOSE:
            self.state = _DONE
            return [_END[False]]
        if state == _HEAD and not self.started:
            raise FramingError("the upstream closed the connection before answering")
        if state == _HEAD or state == _BODY:
            raise FramingError("the upstream closed the connection in the middle of the answer")
        return []
