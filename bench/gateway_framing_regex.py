"""The regex reader and framer the gateway had before gateway/framing.py moved to llhttp (httptools), kept as a
candidate of bench/gateway_framing.py so that the comparison stays reproducible. Not used by the gateway."""

from __future__ import annotations

import re

from gateway.framing import (CHUNKED, HANDOVER, LENGTH, NEED_DATA, NO_BODY, UNTIL_CLOSE, Data, EndOfMessage,
                             FramingError, Request, ResponseHead)
from gateway.headers import connection_tokens

_END = {True: EndOfMessage(True), False: EndOfMessage(False)}

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


# ----- responses -----------------------------------------------------------------------------------------------
class RequestHeadReader:
    """framing.RequestHeadReader's interface over the regexes."""

    def __init__(self, *, max_head_bytes: int, max_headers: int, handover_prefix: bytes | None = None) -> None:
        self.buffer = b""
        self.max_head_bytes, self.max_headers, self.handover_prefix = max_head_bytes, max_headers, handover_prefix

    def feed(self, data: bytes) -> None:
        self.buffer = self.buffer + data if self.buffer else data

    def next_event(self):
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
        buf, self.buffer = self.buffer, b""
        return buf


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
