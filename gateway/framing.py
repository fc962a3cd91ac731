"""HTTP/1.1 framing as sans-I/O objects: bytes in, events out, no socket and no protocol object (h11's readers
are the model).

- `RequestHeadReader` reads the heads of the plain requests the entrance's raw path serves (HTTP/1.1; GET, HEAD,
  DELETE or OPTIONS; no body framing; well-formed fields within the limits). For anything else it answers
  `HANDOVER`, and the bytes it holds (`take()`) go to the strict aiohttp path, which answers them, refusals
  included.
- `ResponseFramer` follows an upstream's answer: its head (`ResponseHead`), its body (`Data`) and its end
  (`EndOfMessage`, which says whether the connection may carry another request). It is the data plane's one
  response framer: the raw path relays the body's bytes as they came (`decode=False`, chunk framing kept), the
  aiohttp path and the egress read the payload (`decode=True`, chunk framing removed). Anything that cannot be
  relayed safely (a smuggling shape, a coding the client would not see, an interim answer) is a `FramingError`.

Both are strict where a lenient reader would let two parsers disagree: CRLF line ends only, no obs-fold, token
field names, one consistent Content-Length, `chunked` as the only transfer coding.
"""

from __future__ import annotations

import re

from gateway.headers import connection_tokens, response_drop, response_fields

_REQUEST_LINE = re.compile(rb"(GET|HEAD|DELETE|OPTIONS) (/[\x21-\x7e]*) HTTP/1\.1")
# A header field as RFC 9110 has it: a token name, a value of visible characters, spaces and tabs (no obs-fold).
_FIELD = rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([\x21-\x7e\x80-\xff]*(?:[ \t]+[\x21-\x7e\x80-\xff]+)*)[ \t]*\r\n"
_FIELDS = re.compile(rb"(?:" + _FIELD + rb")*")
_FIELD_RE = re.compile(_FIELD)
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: [\t\x20-\x7e\x80-\xff]*)?")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?")
# Request fields that send a request to the aiohttp path: a body, or an interim answer to give.
_NOT_PLAIN = frozenset({b"content-length", b"transfer-encoding", b"expect"})

MAX_RESPONSE_HEAD = 64 * 1024
MAX_CHUNK_LINE = 4096

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


def parse_request_head(head: bytes, max_headers: int) -> Request | None:
    """The plain request in `head` (without its final CRLF CRLF), or None when the raw path does not serve it."""
    line_end = head.find(b"\r\n")
    line = head if line_end < 0 else head[:line_end]
    m = _REQUEST_LINE.fullmatch(line)
    if m is None:
        return None
    block = b"" if line_end < 0 else head[line_end + 2:] + b"\r\n"
    if _FIELDS.fullmatch(block) is None:
        return None
    fields = _FIELD_RE.findall(block)
    if len(fields) > max_headers:
        return None
    for name, _ in fields:
        if name.lower() in _NOT_PLAIN:
            return None
    return Request(m.group(1), m.group(2), fields)


class RequestHeadReader:
    """Request heads of one client connection, from the bytes as they arrive.

    `next_event()` answers a `Request` (its bytes are consumed), `NEED_DATA`, or `HANDOVER` for a request the raw
    path does not serve: one that is not plain, a head over `max_head_bytes`, or a target under
    `handover_prefix` (the peer protocol). After `HANDOVER` the bytes from that request on are in `take()`."""

    __slots__ = ("buffer", "max_head_bytes", "max_headers", "handover_prefix")

    def __init__(self, *, max_head_bytes: int, max_headers: int, handover_prefix: bytes | None = None) -> None:
        self.buffer = b""
        self.max_head_bytes = max_head_bytes
        self.max_headers = max_headers
        self.handover_prefix = handover_prefix

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
        request = parse_request_head(buf[:end], self.max_headers)
        if request is None or (self.handover_prefix is not None
                               and request.target.startswith(self.handover_prefix)):
            return HANDOVER
        self.buffer = buf[end + 4:]
        return request

    def take(self) -> bytes:
        """The bytes not consumed yet (for the aiohttp path after `HANDOVER`)."""
        buf, self.buffer = self.buffer, b""
        return buf


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


def parse_response_head(head: bytes, head_only: bool) -> ResponseHead:
    """The response head in `head` (without its final CRLF CRLF) of an answer to a request that was HEAD or not.
    Raises FramingError when the answer cannot be relayed safely."""
    line_end = head.find(b"\r\n")
    line = head if line_end < 0 else head[:line_end]
    m = _STATUS_LINE.fullmatch(line)
    if m is None:
        raise FramingError("malformed status line")
    code = int(m.group(2))
    if code < 200:
        raise FramingError("interim answer")  # never asked for: Expect and upgrades are not forwarded
    block = b"" if line_end < 0 else head[line_end + 2:] + b"\r\n"
    if _FIELDS.fullmatch(block) is None:
        raise FramingError("malformed header field")
    fields = _FIELD_RE.findall(block)
    keep_alive = m.group(1) == b"1"
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
    return ResponseHead(code, line[9:], fields, framing, length, keep_alive, named)


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


# Framer states: no exchange, waiting for the head, in the body (by framing), the answer complete.
_IDLE, _HEAD, _LENGTH, _CHUNK_LINE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _UNTIL_CLOSE, _DONE = range(9)


class ResponseFramer:
    """The answers on one upstream connection, one exchange at a time: `start(head_only)` when a request has
    been sent, then `feed(data)` and `feed_eof()` return the events the bytes make. A `FramingError` means the
    answer (and the connection) cannot be used."""

    __slots__ = ("decode", "state", "head", "remaining", "line", "started", "reuse", "head_only")

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
            pieces: list[bytes] | None = [] if self.decode else None
            end = self._chunked(data, pieces)
            if pieces is None:
                body = data if end < 0 else data[:end]
                if body:
                    events.append(Data(body))
            elif pieces:
                events.append(Data(b"".join(pieces)))
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

    def _chunked(self, data: bytes, pieces: list[bytes] | None) -> int:
        """Follow the chunked encoding through `data` (payload into `pieces` when decoding); the index just past
        the body's end, or -1."""
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
            if self.state == _CHUNK_LINE:
                m = _CHUNK_SIZE.fullmatch(line)
                if m is None:
                    raise FramingError("bad chunk size")
                size = int(m.group(1), 16)
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
            elif len(line) > MAX_CHUNK_LINE:
                raise FramingError("trailer line too long")
        return -1
