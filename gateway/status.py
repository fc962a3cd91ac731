"""Kubernetes Status objects: every refusal the gateway makes, in the shape kubectl and client-go show."""

from __future__ import annotations

import json

from contract import reasons
from contract.errors import Refusal


def unknown_certificate() -> Refusal:
    """The refusal of a client certificate (of our CA: TLS verified it) that no live peering holds: 403
    PeerUnknown, which the peer's module shows as "the peer has probably revoked us"; the connection is closed."""
    return Refusal(403, reasons.PEER_UNKNOWN, "this client certificate belongs to no live peering of this "
                   "cluster; if the ClusterPeer was deleted, create the peering again")


def status_body(code: int, reason: str, message: str, retry_after: int | None = None) -> bytes:
    """The JSON of a failed Status. `reason` is the gateway's own machine-readable cause (kubectl prints it as
    "Error from server (<reason>)"), so that the person reading it knows which rule refused the request;
    `retry_after` goes into details.retryAfterSeconds, as kube-apiserver's own 429 has it."""
    details: dict = {"causes": [{"reason": reason, "message": message}]}
    if retry_after is not None:
        details["retryAfterSeconds"] = retry_after
    return json.dumps({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "details": details, "code": code,
    }, separators=(",", ":")).encode()


_PHRASES = {400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found",
            405: b"Method Not Allowed", 408: b"Request Timeout", 413: b"Request Entity Too Large",
            429: b"Too Many Requests", 431: b"Request Header Fields Too Large", 500: b"Internal Server Error",
            502: b"Bad Gateway", 503: b"Service Unavailable"}


def status_answer(code: int, reason: str, message: str, *, close: bool = False,
                  retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 answer carrying a Kubernetes Status (the raw path's refusals)."""
    body = status_body(code, reason, message, retry_after)
    extra = (b"Connection: close\r\n" if close else b"") + (
        b"Retry-After: %d\r\n" % retry_after if retry_after is not None else b"")
    return b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        code, _PHRASES.get(code, b"Error"), len(body), extra, body)
