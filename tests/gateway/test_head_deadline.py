"""A request head has a deadline: a slow client trickling one on the join listener or either path of
the entrance is answered 408 RequestTimeout and closed once `request_head_timeout` has passed, never held for
minutes; a head that arrives in time is served as before."""

from __future__ import annotations

import asyncio
import json
import ssl

import pytest

from gateway.server import Gateway
from tests.gateway.support import ENTRANCE_HOST, client_ssl, gateway_config, load_certs, make_token, registry_for

DEADLINE = 1.0


@pytest.fixture
async def slow_gateway(pki, issuer_key, upstream, dex, handlers):
    gw = Gateway(gateway_config(pki, upstream, dex, request_head_timeout=DEADLINE), handlers)
    await gw.start()
    load_certs(gw, pki)
    gw.publish(registry_for(pki, issuer_key))
    yield gw
    await gw.stop()


async def _trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> tuple[float, bytes]:
    """Send `head` a byte every 0.1 s, never finishing it; how long until the gateway answered and closed, and
    what it answered."""
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def send() -> None:
        for byte in head:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.1)

    sender = asyncio.create_task(send())
    try:
        async with asyncio.timeout(DEADLINE + 5):
            answer = await reader.read()  # to the end: the gateway closes the connection
    finally:
        sender.cancel()
        try:
            await sender
        except (asyncio.CancelledError, ConnectionError, ssl.SSLError):
            pass
    return loop.time() - start, answer


def _status(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, ssl.SSLError):
        pass


SLOW_HEAD = b"POST /v1/join HTTP/1.1\r\nHost: peering.x.lab\r\n" + b"X-Slow: " + b"a" * 200


async def test_a_trickled_head_on_the_join_listener_gets_408(slow_gateway):
    reader, writer = await asyncio.open_connection("127.0.0.1", slow_gateway.join_port)
    try:
        took, answer = await _trickle(reader, writer, SLOW_HEAD)
    finally:
        await _close(writer)
    code, body = _status(answer)
    assert code == 408 and body["reason"] == "RequestTimeout" and body["code"] == 408
    assert DEADLINE <= took < DEADLINE + 1.5


async def test_a_trickled_head_on_the_entrance_raw_path_gets_408(slow_gateway, pki):
    reader, writer = await asyncio.open_connection("127.0.0.1", slow_gateway.entrance_port, ssl=client_ssl(pki),
                                                   server_hostname=ENTRANCE_HOST)
    try:
        took, answer = await _trickle(reader, writer, b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200)
    finally:
        await _close(writer)
    code, body = _status(answer)
    assert code == 408 and body["reason"] == "RequestTimeout"
    assert DEADLINE <= took < DEADLINE + 1.5


async def test_a_trickled_head_after_a_request_with_a_body_gets_408(slow_gateway, pki, issuer_key, upstream):
    reader, writer = await asyncio.open_connection("127.0.0.1", slow_gateway.entrance_port, ssl=client_ssl(pki),
                                                   server_hostname=ENTRANCE_HOST)
    try:
        # A request with a body, answered...
        token = make_token(issuer_key).encode()
        writer.write(b"POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     + token + b"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        length = int([line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")][0])
        await reader.readexactly(length)
        assert upstream.requests[-1]["method"] == "POST"
        # ...and then a trickled head on the same connection.
        took, answer = await _trickle(reader, writer, b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200)
    finally:
        await _close(writer)
    code, body = _status(answer)
    assert code == 408 and body["reason"] == "RequestTimeout"
    assert DEADLINE <= took < DEADLINE + 1.5
    assert len(upstream.requests) == 1


async def test_a_head_in_time_is_served_and_the_deadline_starts_anew_for_the_next(slow_gateway, pki, issuer_key,
                                                                                upstream):
    reader, writer = await asyncio.open_connection("127.0.0.1", slow_gateway.entrance_port, ssl=client_ssl(pki),
                                                   server_hostname=ENTRANCE_HOST)
    try:
        head = b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + make_token(issuer_key).encode() \
            + b"\r\n\r\n"
        for _ in range(3):
            # Each head takes most of the deadline, the connection's whole life far more than one deadline.
            for part in (head[:20], head[20:]):
                writer.write(part)
                await writer.drain()
                await asyncio.sleep(DEADLINE * 0.6)
            answer = await reader.readuntil(b"\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 200 ")
            length = int([line.split(b":", 1)[1] for line in answer.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")][0])
            await reader.readexactly(length)
    finally:
        await _close(writer)
    assert len(upstream.requests) == 3
