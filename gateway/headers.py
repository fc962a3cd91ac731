"""Header rules of both request paths: what is refused, and what never reaches the upstream or the client.

Request headers are handled as the raw bytes the parser saw, so that what is forwarded is exactly what came in,
minus what the rules remove, with no decoding on the hot path.
"""

from __future__ import annotations

from typing import Iterable

from contract import reasons
from contract.errors import Refusal

Fields = list[tuple[bytes, bytes]]
"""Header fields as the raw bytes the parser saw."""

# Hop-by-hop headers (RFC 9110 7.6.1) plus the framing and routing headers a proxy regenerates itself.
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate",
                        b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade", b"host",
                        b"content-length", b"expect"})
# `Expect: 100-continue` is between the client and the gateway: forwarded, the upstream's interim 100 answer
# would be taken for the final one.
# The client's identity and the proxy chain it claims: only the gateway speaks for the client.
_DROP_EXACT = frozenset({b"authorization", b"forwarded", b"x-real-ip", b"x-forwarded-for", b"x-client-ip",
                         b"true-client-ip", b"cookie"})
_DROP_PREFIXES = (b"x-forwarded-", b"x-remote-")


def check_request(raw_headers: Iterable[tuple[bytes, bytes]]) -> None:
    """Raise a Refusal for a request the gateway never proxies: impersonation and connection upgrades."""
    for name, value in raw_headers:
        low = name.lower()
        if low.startswith(b"impersonate"):
            raise Refusal(403, reasons.IMPERSONATION_REFUSED,
                          f"header {name.decode('latin-1')} is not allowed through the peering gateway; "
                          "call the API as the consumer itself, without impersonation")
        if low == b"upgrade" or (low == b"connection" and b"upgrade" in value.lower()):
            raise Refusal(400, reasons.UPGRADE_REFUSED,
                          "connection upgrades (exec, attach, port-forward, websockets) are not allowed through "
                          "the peering gateway; use plain HTTP requests and watches")


def forwarded_headers(raw_headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The request headers to forward: the client's identity, proxy chain and hop-by-hop headers removed."""
    items = list(raw_headers)
    named: set[bytes] = set()
    for name, value in items:
        if name.lower() == b"connection":
            named.update(t.strip().lower() for t in value.split(b","))
    out = []
    for name, value in items:
        low = name.lower()
        if (low in HOP_BY_HOP or low in _DROP_EXACT or low.startswith(_DROP_PREFIXES) or low in named
                or low.startswith(b"impersonate")):
            continue
        out.append((name, value))
    return out


def screen_request(raw_headers: Iterable[tuple[bytes, bytes]]
                   ) -> tuple[list[tuple[bytes, bytes]], bytes | None, bool]:
    """check_request, forwarded_headers and the Authorization lookup in one pass over the fields, for the hot path:
    raises the same Refusal check_request would (on the first offending field), else returns the fields to forward
    (exactly what forwarded_headers returns), the first Authorization value and whether the client asked to close.
    """
    out: list[tuple[bytes, bytes, bytes]] = []
    named: set[bytes] | None = None
    authorization = None
    close = False
    for name, value in raw_headers:
        low = name.lower()
        if low.startswith(b"impersonate") or low == b"upgrade" or (low == b"connection"
                                                                    and b"upgrade" in value.lower()):
            check_request(((name, value),))  # raises, with check_request's own words
        if low == b"connection":
            tokens = {t.strip().lower() for t in value.split(b",")}
            named = tokens if named is None else named | tokens
            close = close or b"close" in tokens
        elif low == b"authorization":
            if authorization is None:
                authorization = value
        elif not (low in HOP_BY_HOP or low in _DROP_EXACT or low.startswith(_DROP_PREFIXES)):
            out.append((low, name, value))
    if named:
        return [(n, v) for low, n, v in out if low not in named], authorization, close
    return [(n, v) for _, n, v in out], authorization, close


def request_head(method: bytes, target: bytes, host: bytes, headers: list[tuple[bytes, bytes]],
                 authorization: bytes, length: int | None, chunked: bool) -> bytes:
    """The HTTP/1.1 request head sent upstream."""
    parts = [method, b" ", target, b" HTTP/1.1\r\nHost: ", host, b"\r\n"]
    for name, value in headers:
        parts.append(name + b": " + value + b"\r\n")
    parts.append(b"Authorization: " + authorization + b"\r\n")
    if length is not None:
        parts.append(b"Content-Length: %d\r\n" % length)
    elif chunked:
        parts.append(b"Transfer-Encoding: chunked\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def connection_tokens(value: bytes) -> set[bytes]:
    """The options of a Connection field, lowercased: `close`, and the names of fields that are hop-by-hop."""
    return {t.strip().lower() for t in value.split(b",")}


def response_drop(named: set[bytes] | None) -> frozenset[bytes]:
    """The names of the response fields never passed back: hop-by-hop ones, and those its Connection fields name
    (`named`); the framing is restated by whoever relays the answer."""
    return HOP_BY_HOP | named if named else HOP_BY_HOP


def response_fields(fields: Iterable[tuple[bytes, bytes]], named: set[bytes] | None = None
                    ) -> list[tuple[bytes, bytes]]:
    """The upstream's response fields to pass back (`response_drop`); `named` are the options of its Connection
    fields when the caller has read them already."""
    items = fields if isinstance(fields, list) else list(fields)
    if named is None:
        for name, value in items:
            if name.lower() == b"connection":
                named = connection_tokens(value) if named is None else named | connection_tokens(value)
    drop = response_drop(named)
    return [(n, v) for n, v in items if n.lower() not in drop]


def bearer(value: str | None, max_bytes: int) -> str:
    """The token of an `Authorization: Bearer` header, or a Refusal saying what was wrong with it."""
    if not value:
        raise Refusal(401, reasons.TOKEN_MISSING, "no bearer token: send Authorization: Bearer <ServiceAccount token>")
    scheme, _, token = value.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Refusal(401, reasons.TOKEN_MISSING, "the Authorization header is not a bearer token")
    if len(token) > max_bytes:
        raise Refusal(401, reasons.TOKEN_TOO_LARGE, f"the bearer token is longer than {max_bytes} bytes")
    return token
