"""The egress on the engine (gateway/engine.py), over real TLS sockets: what the connection does for a local
consumer is what it does for a peer at the entrance. A head trickled past its deadline is answered 408 and the
connection closed; pipelined requests are answered in order; chunked and Content-Length bodies reach the peer as
sent, one over the limit is refused 413; a watch ends when the registry takes the consumer's capability away
(withdrawn), and the egress's watch gauge counts it while it is open; a pooled connection the peer's entrance
closed meanwhile costs no request."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import ssl
from dataclasses import replace

import pytest

from gateway.server import Gateway
from tests.gateway.support import ENTRANCE_HOST, access_lines, client_ssl, close_stream, make_token
from tests.gateway.test_egress import _egress_gateway
from tests.gateway.test_head_deadline import _trickle
from tests.gateway.test_upstream import Cutter

EGRESS_HOST = "peering-gateway.d8-peering.svc"
PODS = "/peers/peer/api/v1/namespaces/default/pods"
DEADLINE = 1.0


@pytest.fixture
async def egress_for(gateway, pki, issuer_key, upstream, dex, handlers):
    """Factory of egress gateways in front of `gateway` (the peer's entrance), with these limits."""
    made: list[Gateway] = []

    async def make(**limits) -> Gateway:
        egress = await _egress_gateway(pki, issuer_key, upstream, dex, handlers, gateway, **limits)
        egress.config.access_log = True
        made.append(egress)
        return egress

    yield make
    for egress in made:
        await egress.stop()


async def _connect(pki, egress: Gateway) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A consumer's TLS connection to the egress (no client certificate)."""
    return await asyncio.open_connection("127.0.0.1", egress.egress_port, ssl=client_ssl(pki, None),
                                         server_hostname=EGRESS_HOST)


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes]:
    """One answer framed by Content-Length or chunked: its code, head and body."""
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n\r\n")
        code = int(head.split(b" ", 2)[1])
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        if length is not None:
            return code, head, await reader.readexactly(int(length.group(1)))
        assert re.search(rb"(?im)^transfer-encoding:\s*chunked", head), head
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        await reader.readexactly(2)
        return code, head, body


def _post(token: str, path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def test_a_trickled_head_on_the_egress_gets_408_and_the_connection_ends(egress_for, pki, caplog):
    caplog.set_level(logging.INFO, logger="gateway.access")
    egress = await egress_for(request_head_timeout=DEADLINE)
    reader, writer = await _connect(pki, egress)
    try:
        took, answer = await _trickle(reader, writer, b"GET " + PODS.encode() + b" HTTP/1.1\r\nHost: x\r\nX-Slow: "
                                      + b"a" * 200)
    finally:
        await close_stream(writer)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"Connection: close" in head
    assert json.loads(body)["reason"] == "RequestTimeout"
    assert DEADLINE <= took < DEADLINE + 1.5  # and the read reached the end: the egress closed the connection
    [line] = access_lines(caplog.records, "egress")
    assert (line["code"], line["outcome"], line["reason"]) == (408, "refused", "RequestTimeout")


async def test_pipelined_requests_on_the_egress_are_answered_in_order(egress_for, pki, issuer_key, upstream):
    egress = await egress_for()
    token = make_token(issuer_key)
    reader, writer = await _connect(pki, egress)
    try:
        # Three requests in one write, each with a body of its own length: each answer echoes what the API server
        # got, so the order of the answers is the order of the requests.
        writer.write(b"".join(_post(token, PODS, b"x" * n) for n in (5, 1, 300)))
        await writer.drain()
        seen = [json.loads((await _answer(reader))[2])["seen"]["length"] for _ in range(3)]
    finally:
        await close_stream(writer)
    assert seen == [5, 1, 300]
    assert [r["body"] for r in upstream.requests] == [b"x" * 5, b"x", b"x" * 300]


async def test_a_chunked_and_a_content_length_body_reach_the_peer_as_sent(egress_for, pki, issuer_key, upstream):
    egress = await egress_for()
    token = make_token(issuer_key)
    reader, writer = await _connect(pki, egress)
    try:
        writer.write(f"POST {PODS} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nTransfer-Encoding: "
                     "chunked\r\nContent-Type: application/json\r\n\r\n".encode())
        for chunk in (b'{"kind":', b'"Pod"}'):  # sent apart: the egress relays the body as it comes
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        code, _, body = await _answer(reader)
        assert code == 200 and json.loads(body)["seen"]["length"] == len(b'{"kind":"Pod"}')
        writer.write(_post(token, PODS, b'{"kind":"ConfigMap"}'))
        code, _, body = await _answer(reader)
        assert code == 200 and json.loads(body)["seen"]["length"] == len(b'{"kind":"ConfigMap"}')
    finally:
        await close_stream(writer)
    assert [(r["method"], r["body"]) for r in upstream.requests] == [("POST", b'{"kind":"Pod"}'),
                                                                       ("POST", b'{"kind":"ConfigMap"}')]


async def test_a_chunked_body_over_the_limit_is_refused_413_and_never_reaches_the_peer(egress_for, pki, issuer_key,
                                                                                      upstream):
    egress = await egress_for(max_body_bytes=1024)
    reader, writer = await _connect(pki, egress)
    try:
        writer.write(f"POST {PODS} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {make_token(issuer_key)}\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n".encode())
        for _ in range(3):
            writer.write(b"200\r\n" + b"x" * 512 + b"\r\n")
        await writer.drain()
        code, head, body = await _answer(reader)
        assert code == 413 and json.loads(body)["reason"] == "RequestEntityTooLarge"
        assert b"1024 bytes" in body and b"Connection: close" in head
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # the rest of that body cannot be read: the connection ends
    finally:
        await close_stream(writer)
    assert upstream.requests == []


async def test_an_egress_watch_is_withdrawn_with_the_consumers_capability_and_counted_while_open(
        egress_for, pki, issuer_key, upstream, caplog):
    caplog.set_level(logging.INFO, logger="gateway.access")
    egress = await egress_for()
    upstream.watch_events, upstream.watch_interval = 10_000, 0.02
    watches = egress.metrics.watches.labels("egress", "peer")
    reader, writer = await _connect(pki, egress)
    try:
        writer.write(f"GET {PODS}?watch=true HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     f"{make_token(issuer_key)}\r\n\r\n".encode())
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
            await reader.readuntil(b"\n")  # the first event's chunk
        assert watches._value.get() == 1
        reg = egress.state.registry
        cap = reg.capabilities["read-pods"]
        # The PeeringCapability no longer lists the consumer.
        egress.publish(replace(reg, generation=reg.generation + 1, capabilities={
            "read-pods": replace(cap, consumers=frozenset({("mod", "other")}))}))
        try:
            async with asyncio.timeout(1):
                while await reader.read(65536):
                    pass  # to the end: the egress cut the connection
        except (ConnectionError, ssl.SSLError):
            pass  # cut: aborted, not closed
    finally:
        await close_stream(writer)
    assert watches._value.get() == 0
    assert len(egress.state.streams) == 0
    [line] = access_lines(caplog.records, "egress")
    assert (line["code"], line["outcome"]) == (200, "withdrawn")


async def test_a_pooled_connection_the_peers_entrance_closed_is_tried_once_more(
        gateway, pki, issuer_key, upstream, dex, handlers, egress_for):
    cutter = Cutter(gateway.entrance_port)  # TCP in front of the peer's entrance: TLS passes through it
    port = await cutter.start()
    try:
        egress = await egress_for()
        await egress.state.resolver.close()
        egress.state.resolver._overrides[ENTRANCE_HOST] = ("127.0.0.1", port)
        token = make_token(issuer_key)
        reader, writer = await _connect(pki, egress)
        try:
            for body in (b'{"first":1}', b'{"second":22}'):
                writer.write(_post(token, PODS, body))
                await writer.drain()
                code, _, answer = await _answer(reader)
                assert code == 200 and json.loads(answer)["seen"]["length"] == len(body)
                cutter.cut_next = True  # the next request into the pooled connection meets the peer's close
        finally:
            await close_stream(writer)
        assert cutter.cuts == 1 and cutter.connections == 2
        assert [r["body"] for r in upstream.requests] == [b'{"first":1}', b'{"second":22}']
    finally:
        await cutter.stop()


@pytest.mark.parametrize("head", [
    b"GET /api HTTP/1.1\r\nHost: x\r\nNo colon\r\n\r\n",
    b"POST /api/v1/namespaces HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"GET /api HTTP/1.0\r\nHost: x\r\n\r\n",
    b"GET /api HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n",
    b"GET /api HTTP/1.1\r\nHost: x\r\nExpect: nothing-else\r\n\r\n",
], ids=["no-colon", "ambiguous-length", "http-1.0", "oversized", "expect"])
async def test_a_head_the_reader_refuses_is_answered_on_the_egress_as_on_the_entrance(gateway, egress_for, pki,
                                                                                      head):
    """One reader for both listeners: the same code, reason and message, and the connection ends."""
    egress = await egress_for()
    answers = []
    for port, ssl_context, name in ((gateway.entrance_port, client_ssl(pki), ENTRANCE_HOST),
                                    (egress.egress_port, client_ssl(pki, None), EGRESS_HOST)):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ssl_context, server_hostname=name)
        try:
            writer.write(head)
            await writer.drain()
            code, answer_head, body = await _answer(reader)
            async with asyncio.timeout(5):
                assert await reader.read() == b""
        finally:
            await close_stream(writer)
        status = json.loads(body)
        assert b"Connection: close" in answer_head and code >= 400
        answers.append((code, status["reason"], status["message"]))
    assert answers[0] == answers[1]
