"""The regex heads the gateway read before gateway/framing.py moved to llhttp (httptools), kept as a candidate of
bench/gateway_framing.py so that the comparison stays reproducible. Not used by the gateway.

Only the head parsing is this module's own: the request line, the status line and the header fields by regex.
What a response head's fields mean (`gateway.heads.response_head`), the request head reader and the response
framer are the gateway's, their code run with these parsers in place of llhttp, so that the two candidates differ
in nothing but how a head is read.
"""

from __future__ import annotations

import re
import types

from gateway import framing, heads
from gateway.framing import FramingError, Request, ResponseHead

_REQUEST_LINE = re.compile(rb"(GET|HEAD|DELETE|OPTIONS) (/[\x21-\x7e]*) HTTP/1\.1")
# A header field as RFC 9110 has it: a token name, a value of visible characters, spaces and tabs (no obs-fold).
_FIELD = rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([\x21-\x7e\x80-\xff]*(?:[ \t]+[\x21-\x7e\x80-\xff]+)*)[ \t]*\r\n"
_FIELDS = re.compile(rb"(?:" + _FIELD + rb")*")
_FIELD_RE = re.compile(_FIELD)
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: ([\t\x20-\x7e\x80-\xff]*))?")
# Request fields that send a request to the aiohttp path: a body, or an interim answer to give.
_NOT_PLAIN = frozenset({b"content-length", b"transfer-encoding", b"expect"})


def _fields(head: bytes, line_end: int) -> list[tuple[bytes, bytes]] | None:
    """The header fields after the first line of `head`, or None when a line is not a well-formed field."""
    block = b"" if line_end < 0 else head[line_end + 2:] + b"\r\n"
    if _FIELDS.fullmatch(block) is None:
        return None
    return _FIELD_RE.findall(block)


def parse_request_head(head: bytes, max_headers: int) -> Request | None:
    """The plain request in `head` (without its final CRLF CRLF), or None when the raw path does not serve it."""
    line_end = head.find(b"\r\n")
    m = _REQUEST_LINE.fullmatch(head if line_end < 0 else head[:line_end])
    if m is None:
        return None
    fields = _fields(head, line_end)
    if fields is None or len(fields) > max_headers:
        return None
    if any(name.lower() in _NOT_PLAIN for name, _ in fields):
        return None
    return Request(m.group(1), m.group(2), fields)


def parse_response_head(head: bytes, head_only: bool) -> ResponseHead:
    """The response head in `head` (without its final CRLF CRLF) of an answer to a request that was HEAD or not.
    Raises FramingError when the answer cannot be relayed safely."""
    line_end = head.find(b"\r\n")
    m = _STATUS_LINE.fullmatch(head if line_end < 0 else head[:line_end])
    if m is None:
        raise FramingError("malformed status line")
    fields = _fields(head, line_end)
    if fields is None:
        raise FramingError("malformed header field")
    return heads.response_head(f"1.{m.group(1).decode()}", int(m.group(2)), m.group(3) or b"", fields, head_only)


def _run_with(cls: type, module: types.ModuleType, method: str, **names: object) -> types.FunctionType:
    """`cls.method`'s own code, with some of the names of its module bound to other objects."""
    fn = getattr(cls, method)
    return types.FunctionType(fn.__code__, {**vars(module), **names}, fn.__name__, fn.__defaults__, fn.__closure__)


class RequestHeadReader(heads.RequestHeadReader):
    """The gateway's request head reader, reading each head by regex."""

    __slots__ = ()
    next_event = _run_with(heads.RequestHeadReader, heads, "next_event",
                           _parse_request=lambda head, max_headers: parse_request_head(head[:-4], max_headers))


class ResponseFramer(framing.ResponseFramer):
    """The gateway's response framer, reading each head by regex."""

    __slots__ = ()
    feed = _run_with(framing.ResponseFramer, framing, "feed", parse_response_head=parse_response_head)
