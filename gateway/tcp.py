"""TCP keepalive on every connection the gateway's TLS layer carries (tlsstream.TLSStream.begin), both ways."""

from __future__ import annotations

import socket
from typing import Any

#: TCP keepalive: a silent connection is probed after 30 s, every 10 s, and dropped after 3 unanswered probes.
#: The gateway cuts no stream for silence (a quiet watch is a client waiting); a peer or upstream that went away
#: without a word is found this way within about a minute.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 30, 10, 3


def keepalive(sock: Any) -> None:
    """Turn on TCP keepalive with the module's timings on `sock` (a socket, or uvloop's socket-like object)."""
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_COUNT)
    except OSError:
        pass  # the connection is already gone; its end is noticed on its own
