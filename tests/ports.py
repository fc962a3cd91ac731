"""Loopback ports a test needs before anything listens on them, held so that no other socket can take them.

A port learnt by binding to 0 and closing again is free for the next socket on the machine: another test's
server, kube-apiserver, or the local end of any outgoing connection. A test that then binds it again, or counts
on it refusing connections, fails when that happens (`Address already in use`, or an answer from a stranger).
These helpers keep the port bound instead, never listening: a connection to it is refused by the kernel, and the
kernel hands it to no one else, until the holder closes it at the end of the session.
"""

from __future__ import annotations

import atexit
import socket

_held: list[socket.socket] = []


def _bound(port: int = 0) -> socket.socket:
    s = socket.socket()
    try:
        # Both the hold and a listener on the same port set SO_REUSEPORT: Linux lets them share it, and a
        # connection goes to the listener while there is one and is refused while there is none.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", port))
    except BaseException:
        s.close()
        raise
    return s


@atexit.register
def _release() -> None:
    while _held:
        _held.pop().close()


def closed_port() -> int:
    """A loopback port that refuses every connection for the rest of the session."""
    s = _bound()
    _held.append(s)
    return s.getsockname()[1]


class ReservedPort:
    """A loopback port kept for one server that stops and starts again on it (an outage, a restart): between its
    runs a connection is refused, and nothing else can bind it meanwhile.

        port = ReservedPort()
        sock = port.listener()        # bound, for create_server(sock=...) / aiohttp's SockSite, which listen
    """

    def __init__(self) -> None:
        hold = _bound()
        _held.append(hold)
        self.port = hold.getsockname()[1]

    def listener(self) -> socket.socket:
        """A new socket bound to the port, not yet listening: the server that takes it owns it."""
        return _bound(self.port)
