"""Header rules of both request paths: what is refused, and what never reaches the upstream or the client."""

from __future__ import annotations

from typing import Iterable

from gateway.status import Refusal

# Hop-by-hop headers (RFC 9110 7.6.1) plus the ones a proxy must regenerate itself.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length"})
_DROP_PREFIXES = ("x-forwarded-", "x-remote-")
_DROP_EXACT = frozenset({"authorization", "forwarded", "x-real-ip", "x-forwarded-for"})


def refuse_request(headers: Iterable[tuple[str, str]]) -> None:
    """Raise a Refusal for a request the gateway never proxies: impersonation and connection upgrades."""
    for name, value in headers:
        low = name.lower()
        if low.startswith("impersonate"):
            raise Refusal(403, "ImpersonationRefused",
                          f"header {name} is not allowed through the peering gateway; "
                          "call the API as the consumer itself, without impersonation")
        if low == "upgrade" or (low == "connection" and "upgrade" in value.lower()):
            raise Refusal(400, "UpgradeRefused",
                          "connection upgrades (exec, attach, port-forward, websockets) are not allowed through "
                          "the peering gateway; use plain HTTP requests and watches")


def upstream_headers(headers: Iterable[tuple[str, str]], authorization: str | None) -> list[tuple[str, str]]:
    """The request headers to forward: the client's identity, proxy chain and hop-by-hop headers removed."""
    connection_named: set[str] = set()
    items = list(headers)
    for name, value in items:
        if name.lower() == "connection":
            connection_named.update(t.strip().lower() for t in value.split(","))
    out = []
    for name, value in items:
        low = name.lower()
        if (low in HOP_BY_HOP or low in _DROP_EXACT or low.startswith(_DROP_PREFIXES) or low in connection_named
                or low.startswith("impersonate")):
            continue
        out.append((name, value))
    if authorization is not None:
        out.append(("Authorization", authorization))
    return out


def response_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The upstream's response headers to pass back: hop-by-hop ones are the gateway's own business."""
    connection_named: set[str] = set()
    items = list(headers)
    for name, value in items:
        if name.lower() == "connection":
            connection_named.update(t.strip().lower() for t in value.split(","))
    return [(n, v) for n, v in items
            if n.lower() not in HOP_BY_HOP and n.lower() not in connection_named]


def bearer(value: str | None, max_bytes: int) -> str:
    """The token of an `Authorization: Bearer` header, or a Refusal saying what was wrong with it."""
    if not value:
        raise Refusal(401, "TokenMissing", "no bearer token: send Authorization: Bearer <ServiceAccount token>")
    scheme, _, token = value.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Refusal(401, "TokenMissing", "the Authorization header is not a bearer token")
    if len(token) > max_bytes:
        raise Refusal(401, "TokenTooLarge", f"the bearer token is longer than {max_bytes} bytes")
    return token
