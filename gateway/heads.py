"""HTTP/1.1 heads, read by llhttp (the parser of Node.js, through httptools) with the module's own checks on
top: the entrance's plain request heads (`RequestHeadReader`, `Request`) and the upstreams' response heads
(`parse_response_head`, `ResponseHead`, `relay_head`). Sans-I/O, like framing.py, which uses them.

llhttp refuses bare LF line ends, obs-fold, invalid field names and values, conflicting Content-Lengths and
Content-Length with Transfer-Encoding; on top of it this module refuses every transfer coding but a single
`chunked`, interim answers, other HTTP versions, targets that are not origin-form, and heads over the limits.
bench/gateway_framing.py measured llhttp against the regex reader the gateway had and h11.
"""

from __future__ import annotations

import re

import httptools

from contract import reasons
from gateway.headers import connection_tokens, response_drop, response_fields

_TARGET = re.compile(rb"/[\x21-\x7e]*")
_OWS = b" \t"

MAX_RESPONSE_HEAD = 64 * 1024

Fields = list[tuple[bytes, bytes]]


class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA = _Sentinel("NEED_DATA")
"""The reader needs more bytes before it can say anything."""


class Refused:
    """A request head the reader refuses: the answer's code, reason and message; the connection ends after it,
    since what follows cannot be told apart from the rest of this request."""

    __slots__ = ("code", "reason", "message")

    def __init__(self, code: int, reason: str, message: str) -> None:
        self.code, self.reason, self.message = code, reason, message

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Refused) and (self.code, self.reason) == (other.code, other.reason)

    def __repr__(self) -> str:
        return f"Refused({self.code}, {self.reason})"


TOO_LARGE_MESSAGE = "the request line or headers are too large or too many; send fewer or shorter headers"
AMBIGUOUS_MESSAGE = "the request has both Content-Length and Transfer-Encoding; send exactly one of them"
MALFORMED_MESSAGE = "the request is not valid HTTP/1.1: "
TOO_LARGE = Refused(431, reasons.REQUEST_HEADER_FIELDS_TOO_LARGE, TOO_LARGE_MESSAGE)
AMBIGUOUS = Refused(400, reasons.AMBIGUOUS_BODY_LENGTH, AMBIGUOUS_MESSAGE)


METHODS = frozenset({b"GET", b"HEAD", b"POST", b"PUT", b"PATCH", b"DELETE", b"OPTIONS"})
"""The methods of the Kubernetes API: the one allow-list of the entrance and the egress (CONNECT, TRACE and
anything else never reach an upstream)."""


def method_message(method: bytes) -> str:
    return (f"method {method.decode('latin-1')[:20]} is not allowed through the peering gateway; the Kubernetes API "
            "takes GET, HEAD, POST, PUT, PATCH, DELETE and OPTIONS")


def malformed(detail: str) -> Refused:
    return Refused(400, reasons.MALFORMED_REQUEST, MALFORMED_MESSAGE + detail[:200])


class Request:
    """A request head the raw path serves: method, origin-form target, the fields exactly as they came, and how a
    body follows it (`length`, its Content-Length, None without one; `chunked`), as `request_framing` read it."""

    __slots__ = ("method", "target", "fields", "length", "chunked", "expects_continue")

    def __init__(self, method: bytes, target: bytes, fields: Fields, length: int | None = None,
                 chunked: bool = False, expects_continue: bool = False) -> None:
        self.method = method
        self.target = target
        self.fields = fields
        self.length = length
        self.chunked = chunked
        #: Expect: 100-continue: the client waits for an interim answer before it sends the body.
        self.expects_continue = expects_continue

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.length)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Request) and (self.method, self.target, self.fields, self.length,
                                               self.chunked) == (other.method, other.target, other.fields,
                                                                 other.length, other.chunked)

    def __repr__(self) -> str:
        return f"Request({self.method!r}, {self.target!r}, {self.fields!r}, {self.length!r}, {self.chunked!r})"


class _HeadParser:
    """llhttp, fed one whole head at a time, its callbacks collecting the head. One per process and kind (the event
    loop runs one callback at a time, and a head is parsed within one), with a fresh llhttp state for every head
    (0.4 us): a connection keeps no parser of its own, so an idle one costs no more than its buffer, and nothing of
    one connection's head can carry over to another's."""

    __slots__ = ("_make", "parser", "url", "status", "fields", "complete")

    def __init__(self, make: type) -> None:
        self._make = make
        self.parser = make(self)
        self.url = b""
        self.status = b""
        self.fields: Fields = []
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_status(self, status: bytes) -> None:
        self.status += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value.rstrip(_OWS)))

    def on_headers_complete(self) -> None:
        self.complete = True

    def feed(self, head: bytes):
        """Parse `head` (request or status line, fields, CRLF CRLF) into `url`/`status`/`fields`; the parser it
        used (for its method, version, status code), or httptools' error."""
        self.url, self.status, self.fields, self.complete = b"", b"", [], False
        parser = self.parser = self._make(self)
        parser.feed_data(head)
        return parser

    def take(self) -> tuple[bytes, bytes, Fields]:
        """What the last head held, no longer referenced here."""
        taken = self.url, self.status, self.fields
        self.url, self.status, self.fields = b"", b"", []
        return taken


_REQUESTS = _HeadParser(httptools.HttpRequestParser)


def _parse_request(head: bytes, max_headers: int) -> Request | Refused:
    """The request of `head` (with its final CRLF CRLF), or the refusal of a head the raw path cannot read safely."""
    shared = _REQUESTS
    try:
        parser = shared.feed(head)
    except httptools.HttpParserUpgrade:
        parser = shared.parser  # llhttp stops at an upgrade; the request is plain all the same, admission refuses it
    except httptools.HttpParserError as exc:
        shared.take()
        text = str(exc)
        lowered = text.lower()
        return AMBIGUOUS if "content-length" in lowered and "transfer-encoding" in lowered else malformed(text)
    complete = shared.complete
    url, _, fields = shared.take()
    if len(fields) > max_headers:
        return TOO_LARGE
    method = parser.get_method()
    if method not in METHODS:  # whatever its target or version: CONNECT and TRACE are refused for what they are
        return Refused(405, reasons.METHOD_NOT_ALLOWED, method_message(method))
    version = parser.get_http_version()
    if not complete or version != "1.1":
        return malformed(f"HTTP/{version} is not served; send HTTP/1.1" if complete else "not a whole head")
    if _TARGET.fullmatch(url) is None:
        return malformed("the target is not an origin-form path of printable characters")
    expects_continue = False
    for name, value in fields:
        if name.lower() == b"expect":
            if value.lower() != b"100-continue":
                return malformed("the only expectation served is 100-continue")
            expects_continue = True
    try:
        length, chunked = request_framing(fields)
    except AmbiguousLength:
        return AMBIGUOUS
    except FramingError as exc:
        return malformed(str(exc))
    return Request(method, url, fields, length, chunked, expects_continue)


def request_framing(fields: Fields) -> tuple[int | None, bool]:
    """How a request's body is framed: its Content-Length (None without one) and whether it is chunked; a
    FramingError for what cannot be read safely (a Content-Length that is not one number, several that differ,
    a transfer coding other than one `chunked`, both framings at once: `AmbiguousLength`)."""
    length: int | None = None
    coded = False
    for name, value in fields:
        low = name.lower()
        if low == b"content-length" or low == b"transfer-encoding":
            length, coded = _framing_field(low, value, length, coded)
    if coded and length is not None:
        raise AmbiguousLength("Content-Length with Transfer-Encoding")
    return length, coded


def _framing_field(low: bytes, value: bytes, length: int | None, coded: bool) -> tuple[int | None, bool]:
    """What a Content-Length or Transfer-Encoding field (`low`, its lowercased name) adds to the framing read so
    far, for a request and an answer alike: one length (repeats must agree), or one plain `chunked` (another coding
    would have to be restated exactly, and neither side of the gateway sends one); a FramingError otherwise."""
    if low == b"content-length":
        if not value.isdigit() or len(value) > 15 or (length is not None and int(value) != length):
            raise FramingError("bad Content-Length")
        return int(value), coded
    if coded or value.lower() != b"chunked":
        raise FramingError("unsupported transfer coding")
    return length, True


class RequestHeadReader:
    """Request heads of one client connection, from the bytes as they arrive.

    `next_event()` answers a `Request` (its head's bytes are consumed; a body that follows is the caller's to read,
    framing.RequestBodyReader, from `take()`), `NEED_DATA`, or `Refused` for a head the raw path cannot read
    safely: not HTTP/1.1, not an origin-form target, malformed, with a body framing it cannot read or an Expect it
    does not serve, or over `max_head_bytes` or `max_headers`. Nothing is consumed after a `Refused`."""

    __slots__ = ("buffer", "max_head_bytes", "max_headers")

    def __init__(self, *, max_head_bytes: int, max_headers: int) -> None:
        self.buffer = b""
        self.max_head_bytes = max_head_bytes
        self.max_headers = max_headers

    def feed(self, data: bytes) -> None:
        self.buffer = self.buffer + data if self.buffer else data

    def next_event(self) -> Request | Refused | _Sentinel:
        buf = self.buffer
        if not buf:
            return NEED_DATA
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            # The CRLF CRLF may start up to 3 bytes before the buffer's end: past that, it would end over the limit
            # however the bytes were split.
            return TOO_LARGE if len(buf) > self.max_head_bytes + 3 else NEED_DATA
        if end > self.max_head_bytes:
            return TOO_LARGE
        request = _parse_request(buf[:end + 4], self.max_headers)
        if type(request) is Request:
            self.buffer = buf[end + 4:]
        return request

    def take(self) -> bytes:
        """The bytes not consumed yet (a body's, for its reader)."""
        buf, self.buffer = self.buffer, b""
        return buf


def parse_request_head(head: bytes, max_headers: int) -> Request | Refused:
    """The request in `head` (without its final CRLF CRLF), or the refusal of a head the raw path cannot read."""
    return _parse_request(head + b"\r\n\r\n", max_headers)


# ----- responses -----------------------------------------------------------------------------------------------
# How an answer's body is framed.
LENGTH, CHUNKED, UNTIL_CLOSE, NO_BODY = "length", "chunked", "until-close", "no-body"


class FramingError(ValueError):
    """A message that cannot be relayed safely; the message says what was wrong with it."""


class AmbiguousLength(FramingError):
    """A request with both Content-Length and Transfer-Encoding."""


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
        elif low == b"content-length" or low == b"transfer-encoding":
            length, coded = _framing_field(low, value, length, coded)
    if coded and length is not None:
        raise AmbiguousLength("Content-Length with Transfer-Encoding")
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


_RESPONSES = _HeadParser(httptools.HttpResponseParser)


def parse_response_head(head: bytes, head_only: bool) -> ResponseHead:
    """The response head in `head` (without its final CRLF CRLF) of an answer to a request that was HEAD or
    not; a FramingError when the answer cannot be relayed safely."""
    shared = _RESPONSES
    try:
        parser = shared.feed(head + b"\r\n\r\n")
    except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
        shared.take()
        raise FramingError(f"malformed response head ({exc})") from None
    complete = shared.complete
    _, status, fields = shared.take()
    if not complete:
        raise FramingError("not a whole response head")
    return response_head(parser.get_http_version(), parser.get_status_code(), status, fields, head_only)


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
