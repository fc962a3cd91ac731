"""What an administrator reads when a peer's entrance cannot be reached: the host, the port and the socket's words."""

from __future__ import annotations


import aiohttp

from control.peerclient import _detail
from tests.ports import closed_port


async def test_a_refused_connection_names_host_and_port_without_python_object_reprs() -> None:
    port = closed_port()  # a port no one listens on
    async with aiohttp.ClientSession() as session:
        try:
            await session.get(f"https://127.0.0.1:{port}/")
        except aiohttp.ClientConnectorError as exc:
            text = _detail(exc)
        else:
            raise AssertionError("a connection to a closed port succeeded")
    assert text.startswith(f"cannot connect to 127.0.0.1:{port}: ")
    assert "object at 0x" not in text and "SSLContext" not in text


def test_other_errors_keep_their_own_words_bounded() -> None:
    assert _detail(ValueError("x" * 1000)) == "x" * 300
    assert _detail(TimeoutError()) == "TimeoutError"
