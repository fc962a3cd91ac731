"""Kubernetes Status objects: every refusal the gateway makes, in the shape kubectl and client-go show."""

from __future__ import annotations

import json

from contract import reasons
from contract.errors import Refusal
from gateway.upstream import CERTIFICATE_REFUSED, UpstreamError


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


def upstream_refusal(err: UpstreamError, peering: str | None = None) -> Refusal:
    """What a failed upstream (kube-apiserver, or the entrance of the peer of `peering` for the egress) means to the
    client: a peer's entrance refusing our client certificate is PeerRefusedCertificate, as the ClusterPeer says
    (its Ready message, rules/renewal.py, says the same for the same alert)."""
    if err.kind == CERTIFICATE_REFUSED and peering is not None:
        if "EXPIRED" in err.detail:
            todo = ("it expired while the peers were apart, and the peer's entrance checks its dates in the handshake "
                    "(a module older than this one, which cannot renew it after an outage): update the module there, "
                    "or establish the peering anew")
        elif "UNKNOWN_CA" in err.detail:
            todo = ("the peer no longer trusts this cluster's peering CA (its module was disabled and enabled again): "
                    "establish the peering anew on both clusters")
        else:
            todo = "the peer has probably revoked the peering, so the ClusterPeer is to be deleted here too"
        return Refusal(503, reasons.PEER_REFUSED_CERTIFICATE, f"the peer's entrance refuses this cluster's client "
                       f"certificate of peering {peering} (TLS alert {err.detail.lower()}): its ClusterPeer says "
                       f"PeerRefusedCertificate, and its Ready message tells the administrator what to do: {todo}")
    if err.kind == "connect":
        return Refusal(503, reasons.UPSTREAM_UNAVAILABLE, f"the upstream API server cannot be reached "
                       f"({err.detail}); retry later")
    return Refusal(502, reasons.UPSTREAM_FAILED, f"the upstream API server failed the request ({err.detail}); retry")
