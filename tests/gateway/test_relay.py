"""The entrance's raw path with its relay (gateway/entrance.py, gateway/relay.py) over real TLS, against a scripted
upstream that answers with exactly the bytes a test chooses: the edges of what test_framing.py proves without
sockets."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl

import pytest

from gateway.server import Gateway
from tests.gateway.support import (ENTRANCE_HOST, Upstream, client_ssl, close_stream, gateway_config, load_certs, make_token,
                        registry_for)

# ----- over real TLS, against a scripted upstream -------------------------------------------------------------------


class Scripted:
    """An API server stand-in over TLS that reads each request (its head, and its body as the head frames it, kept
    as it came in `bodies`) and answers with the next scripted bytes. An answer of None closes the connection
    without answering; an answer ending in None closes it once sent."""

    def __init__(self, answers: list[list[bytes | None] | None]) -> None:
        self.answers = answers
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.connections = 0
        self.port = 0
        self.server: asyncio.AbstractServer | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self, pki) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        pki["api"].configure_cert(ctx)
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=ctx)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                self.bodies.append(await _body(reader, head))
                answer = self.answers.pop(0)
                if answer is None:
                    break
                for part in answer:
                    if part is None:
                        return
                    writer.write(part)
                    await writer.drain()
                    await asyncio.sleep(0)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.transport.abort()
        await self.server.wait_closed()


async def _body(reader: asyncio.StreamReader, head: bytes) -> bytes:
    """The body after `head` as it came: Content-Length bytes, or a chunked body to its last chunk."""
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])}
    if b"content-length" in fields:
        return await reader.readexactly(int(fields[b"content-length"]))
    if fields.get(b"transfer-encoding") != b"chunked":
        return b""
    body = b""
    while True:
        line = await reader.readuntil(b"\r\n")
        size = int(line.split(b";")[0], 16)
        body += line + await reader.readexactly(size + 2)
        if not size:
            return body


@pytest.fixture
async def scripted_gateway(pki, issuer_key, dex, handlers):
    made: list[tuple[Gateway, Scripted]] = []

    async def make(answers: list[list[bytes | None] | None], **limits) -> tuple[Gateway, Scripted]:
        scripted = Scripted(answers)
        await scripted.start(pki)
        gw = Gateway(gateway_config(pki, Upstream(port=scripted.port), dex, **limits), handlers)
        made.append((gw, scripted))
        await gw.start()
        load_certs(gw, pki)
        gw.publish(registry_for(pki, issuer_key))
        return gw, scripted

    yield make
    for gw, scripted in made:
        await gw.stop()
        await scripted.stop()


async def connect(gw: Gateway, pki) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", gw.entrance_port, ssl=client_ssl(pki),
                                         server_hostname=ENTRANCE_HOST)


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer, framed by Content-Length, chunked encoding or the connection's end."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head[:-4].split(b"\r\n")
    code = int(lines[0].split(b" ", 2)[1])
    headers = {k.decode().lower(): v.decode().strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if not size:
                await reader.readuntil(b"\r\n")
                break
            body += (await reader.readexactly(size + 2))[:-2]
    else:
        body = await asyncio.wait_for(reader.read(), 10)
    return code, headers, body


def get(path: str, token: str, extra: bytes = b"") -> bytes:
    return (f"GET {path} HTTP/1.1\r\nHost: {ENTRANCE_HOST}\r\nAuthorization: Bearer {token}\r\n".encode()
            + extra + b"\r\n")


close = close_stream


def ok(body: bytes, *extra: bytes) -> list[bytes]:
    return [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"".join(extra)
            + b"Content-Length: %d\r\n\r\n" % len(body), body]


async def test_pipelined_requests_are_answered_in_order_on_one_upstream_connection(scripted_gateway, pki,
                                                                                   issuer_key, dex):
    gw, scripted = await scripted_gateway([ok(b'{"n":1}'), ok(b'{"n":2}', b"Keep-Alive: timeout=5\r\n"),
                                          ok(b'{"n":3}')])
    token = make_token(issuer_key)
    reader, writer = await connect(gw, pki)
    try:
        writer.write(get("/api/v1/pods", token, b"X-Forwarded-For: 6.6.6.6\r\n") + get("/api/v1/pods?a=1", token))
        answers = [await read_answer(reader), await read_answer(reader)]
        writer.write(get("/api/v1/pods", token))
        answers.append(await read_answer(reader))
    finally:
        await close(writer)
    assert [(c, b) for c, _, b in answers] == [(200, b'{"n":1}'), (200, b'{"n":2}'), (200, b'{"n":3}')]
    assert "keep-alive" not in answers[1][1]
    assert scripted.connections == 1 and dex.calls == 1
    assert scripted.heads[1].startswith(b"GET /api/v1/pods?a=1 HTTP/1.1\r\nHost: api.x.lab\r\n")
    for head in scripted.heads:
        assert b"Authorization: Bearer exchanged-1\r\n" in head
        assert token.encode() not in head and b"6.6.6.6" not in head


async def test_chunked_watch_is_relayed_event_by_event_and_the_connection_kept(scripted_gateway, pki, issuer_key):
    events = [b'{"type":"ADDED","object":{"n":%d}}\n' % i for i in range(3)]
    watch = [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
             *(b"%x\r\n%s\r\n" % (len(e), e) for e in events), b"0\r\n\r\n"]
    gw, scripted = await scripted_gateway([watch, ok(b"{}")])
    token = make_token(issuer_key)
    reader, writer = await connect(gw, pki)
    try:
        writer.write(get("/api/v1/pods?watch=true", token))
        code, headers, body = await read_answer(reader)
        assert (code, headers["transfer-encoding"], body) == (200, "chunked", b"".join(events))
        writer.write(get("/api/v1/pods", token))
        assert (await read_answer(reader))[0] == 200
    finally:
        await close(writer)
    assert scripted.connections == 1
    assert gw.metrics.watches.labels("entrance", "peer")._value.get() == 0


async def test_an_answer_ended_by_close_closes_the_client_connection(scripted_gateway, pki, issuer_key):
    gw, scripted = await scripted_gateway([[b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n", b"part1 ",
                                           b"part2", None]])
    reader, writer = await connect(gw, pki)
    try:
        writer.write(get("/api/v1/pods", make_token(issuer_key)))
        code, headers, body = await read_answer(reader)
    finally:
        await close(writer)
    assert (code, headers["connection"], body) == (200, "close", b"part1 part2")


async def test_upstream_dying_mid_body_cuts_the_client_connection(scripted_gateway, pki, issuer_key):
    gw, _ = await scripted_gateway([[b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b"only-part", None]])
    reader, writer = await connect(gw, pki)
    try:
        writer.write(get("/api/v1/pods", make_token(issuer_key)))
        with pytest.raises(asyncio.IncompleteReadError):
            await read_answer(reader)
    finally:
        await close(writer)
    assert gw.metrics.upstream_errors.labels("entrance", "stream")._value.get() == 1


async def test_a_pooled_connection_the_upstream_closed_is_retried_once(scripted_gateway, pki, issuer_key):
    # The first connection answers once and then closes without saying so; the next request must not fail.
    gw, scripted = await scripted_gateway([ok(b'{"n":1}'), None, ok(b'{"n":2}')])
    token = make_token(issuer_key)
    reader, writer = await connect(gw, pki)
    try:
        writer.write(get("/api/v1/pods", token))
        assert (await read_answer(reader))[2] == b'{"n":1}'
        # Wait (bounded) until the gateway has seen the upstream close its pooled connection.
        for _ in range(200):
            if not gw.state.relay_pool.all:
                break
            await asyncio.sleep(0.01)
        writer.write(get("/api/v1/pods", token))
        assert (await read_answer(reader))[2] == b'{"n":2}'
    finally:
        await close(writer)
    assert scripted.connections == 2


async def test_malformed_upstream_answer_gives_502_status(scripted_gateway, pki, issuer_key):
    gw, _ = await scripted_gateway([[b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"]])
    reader, writer = await connect(gw, pki)
    try:
        writer.write(get("/api/v1/pods", make_token(issuer_key)))
        code, _, body = await read_answer(reader)
    finally:
        await close(writer)
    assert (code, json.loads(body)["reason"]) == (502, "UpstreamFailed")


async def test_request_with_a_body_after_plain_ones_is_relayed_on_the_same_path(gateway, pki, issuer_key, upstream):
    token = make_token(issuer_key)
    reader, writer = await connect(gateway, pki)
    try:
        writer.write(get("/api/v1/namespaces/default/pods", token))
        code, _, body = await read_answer(reader)
        assert code == 200 and json.loads(body)["seen"] == {"auth": "Bearer exchanged-1", "length": 0}
        payload = b'{"kind":"Pod"}'
        writer.write(f"POST /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: {ENTRANCE_HOST}\r\n"
                     f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        code, _, body = await read_answer(reader)
        assert code == 200 and json.loads(body)["seen"] == {"auth": "Bearer exchanged-1", "length": len(payload)}
        writer.write(get("/api/v1/namespaces/default/pods", token))
        assert (await read_answer(reader))[0] == 200
    finally:
        await close(writer)
    assert [r["method"] for r in upstream.requests] == ["GET", "POST", "GET"]
    assert len(gateway.state.relay_pool.all) == 1  # all three on the entrance's one upstream connection


async def test_idle_keep_alive_connection_is_closed_after_the_idle_timeout(scripted_gateway, pki, issuer_key):
    gw, _ = await scripted_gateway([ok(b"{}")], idle_timeout=0.3)
    reader, writer = await connect(gw, pki)
    try:
        writer.write(get("/api/v1/pods", make_token(issuer_key)))
        assert (await read_answer(reader))[0] == 200
        assert await asyncio.wait_for(reader.read(), 5) == b""
    finally:
        await close(writer)


async def test_held_connections_keep_no_decoded_peer_certificate(scripted_gateway, pki, issuer_key):
    # A second answer in the script keeps the upstream connection open (the script closes it when done).
    gw, _ = await scripted_gateway([ok(b"{}"), ok(b"{}")])
    reader, writer = await connect(gw, pki)
    try:
        writer.write(get("/api/v1/pods", make_token(issuer_key)))
        assert (await read_answer(reader))[0] == 200
        (fp,) = gw.registry.by_fingerprint
        (conn,) = gw.state.connections.of(fp)  # the connection's TLS stream
        # The peer is still known by its certificate's fingerprint; only the decoded copy is gone.
        assert gw.registry.by_fingerprint[fp].name == "peer"
        assert conn.get_extra_info("peercert") == {}
        (relay,) = gw.state.relay_pool.all
        assert relay.transport.get_extra_info("peercert") == {}
        # Small records (a response head, then its body) do not wait for delayed ACKs on either connection: the
        # event loop sets TCP_NODELAY on every TCP transport, the gateway relies on it.
        for transport in (conn, relay.transport):
            assert transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        await close(writer)
