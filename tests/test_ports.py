"""tests/ports.py: a held port refuses connections and no other socket can take it; a reserved one serves again."""

from __future__ import annotations

import socket

import pytest

from tests.ports import ReservedPort, closed_port


def _connect(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass


def test_a_closed_port_refuses_and_cannot_be_taken():
    port = closed_port()
    with pytest.raises(ConnectionRefusedError):
        _connect(port)
    with socket.socket() as other, pytest.raises(OSError) as e:
        other.bind(("127.0.0.1", port))
    assert e.value.errno == 98  # EADDRINUSE


def test_a_reserved_port_serves_refuses_and_serves_again():
    reserved = ReservedPort()
    for _ in range(2):
        with reserved.listener() as listener:
            listener.listen()
            with socket.create_connection(("127.0.0.1", reserved.port), timeout=5):
                listener.accept()[0].close()
        with pytest.raises(ConnectionRefusedError):
            _connect(reserved.port)
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", reserved.port))
