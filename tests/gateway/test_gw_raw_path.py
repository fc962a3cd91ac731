"""The entrance's raw-bytes path (gateway/entrance.py): head parsing, response framing, and relaying over real TLS
against a scripted upstream that answers with exactly the bytes a test chooses."""

from __future__ import annotations

import asyncio
import socket
import json
import ssl
from types import SimpleNamespace

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.entrance import Relay, parse_request_head, response_head
from gateway.headers import check_request, forwarded_headers, screen_request
from contract.errors import Refusal
from gateway.server import Gateway
from gw_support import (ENTRANCE_HOST, Upstream, client_ssl, close_stream, gateway_config, load_certs, make_token,
                        registry_for)

# ----- pure rules -------------------------------------------------------------------------------------------------


def test_plain_request_head_is_parsed_into_raw_fields():
    head = b"GET /api/v1/pods?watch=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer abc \r\nAccept: a, b"
    assert parse_request_head(head, 100) == (b"GET", b"/api/v1/pods?watch=1",
                                             [(b"Host", b"x"), (b"Authorization", b"Bearer abc"),
                                              (b"Accept", b"a, b")])
    assert parse_request_head(b"HEAD / HTTP/1.1", 100) == (b"HEAD", b"/", [])


@pytest.mark.parametrize("head", [
    b"POST /api HTTP/1.1\r\nHost: x",                              # a method with a body
    b"GET /api HTTP/1.0\r\nHost: x",                               # not HTTP/1.1
    b"GET /api HTTP/1.1\r\nContent-Length: 0",                      # any body framing
    b"GET /api HTTP/1.1\r\nTransfer-Encoding: chunked",
    b"GET /api HTTP/1.1\r\nExpect: 100-continue",                   # an interim answer to give
    b"GET /api HTTP/1.1\r\nHost: x\r\n folded",                     # obs-fold
    b"GET /api HTTP/1.1\r\nBad Name: x",                            # not a token
    b"GET /api HTTP/1.1\r\nX: a\nInjected: b",                      # bare LF
    b"GET /api HTTP/1.1\r\nX: a\x00b",                              # control character
    b"GET api HTTP/1.1",                                            # not an origin-form target
    b"GET /a b HTTP/1.1",
    b"GET /api HTTP/1.1\r\n" + b"\r\n".join(b"X-%d: v" % i for i in range(101)),  # over max_headers
])
def test_anything_but_a_plain_request_goes_to_the_aiohttp_path(head):
    assert parse_request_head(head, 100) is None


_NAMES = st.sampled_from([b"Accept", b"Authorization", b"authorization", b"Connection", b"X-Hop", b"x-hop",
                          b"Impersonate-User", b"Upgrade", b"X-Forwarded-For", b"X-Remote-Group", b"Forwarded",
                          b"Cookie", b"Host", b"Keep-Alive", b"TE", b"Content-Type", b"User-Agent", b"Expect"])
_VALUES = st.sampled_from([b"a", b"close", b"keep-alive, X-Hop", b"Upgrade", b"x-hop, close", b"Bearer t1",
                           b"Bearer t2", b"upgrade, keep-alive", b""])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=8))
def test_the_raw_paths_one_pass_applies_exactly_the_header_rules(fields):
    try:
        check_request(fields)
    except Refusal as expected:
        with pytest.raises(Refusal) as got:
            screen_request(fields)
        assert (got.value.code, got.value.reason, got.value.message) == (expected.code, expected.reason,
                                                                         expected.message)
        return
    forward, authorization, close = screen_request(fields)
    assert forward == forwarded_headers(fields)
    assert authorization == next((v for n, v in fields if n.lower() == b"authorization"), None)
    assert close == any(n.lower() == b"connection" and b"close" in [t.strip().lower() for t in v.split(b",")]
                        for n, v in fields)


def test_response_head_drops_hop_by_hop_fields_and_restates_framing():
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive, X-Hop\r\n"
            b"X-Hop: 1\r\nKeep-Alive: timeout=5\r\nContent-Length: 12\r\nAudit-Id: 7")
    out, code, state, reuse, length = response_head(head, False)
    assert out == (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nAudit-Id: 7\r\nContent-Length: 12\r\n"
                   b"\r\n")
    assert (code, reuse, length) == (200, True, 12)


def test_response_head_framing_cases():
    chunked, _, _, reuse, _ = response_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", False)
    assert chunked.endswith(b"Transfer-Encoding: chunked\r\n\r\n") and reuse
    until_close, _, _, reuse, _ = response_head(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain", False)
    assert until_close.endswith(b"Connection: close\r\n\r\n") and not reuse
    _, _, _, reuse, _ = response_head(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1", False)
    assert not reuse
    _, _, _, reuse, _ = response_head(b"HTTP/1.0 200 OK\r\nContent-Length: 1", False)
    assert not reuse
    head_only, _, _, reuse, length = response_head(b"HTTP/1.1 200 OK\r\nContent-Length: 99", True)
    assert head_only.endswith(b"Content-Length: 99\r\n\r\n") and reuse and length == 0
    no_content, code, _, _, _ = response_head(b"HTTP/1.1 204 No Content", False)
    assert (no_content, code) == (b"HTTP/1.1 204 No Content\r\n\r\n", 204)


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked",  # smuggling shape
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1",
    b"HTTP/1.1 100 Continue",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked",                # a coding the client would not see
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
    b"HTTP/2 200 OK",
    b"HTTP/1.1 200 OK\r\nX: a\nY: b",
])
def test_response_heads_that_cannot_be_relayed_safely_are_refused(head):
    with pytest.raises(ValueError):
        response_head(head, False)


CHUNKED = b"5;ext=1\r\nhello\r\n1A\r\n" + b"z" * 26 + b"\r\n0\r\nTrailer-A: 1\r\n\r\n"


def _scanner() -> Relay:
    relay = Relay(SimpleNamespace())  # type: ignore[arg-type]
    relay.state = 2  # _CHUNK_LINE
    return relay


def test_chunked_end_is_found_at_every_split_of_the_body():
    for cut in range(len(CHUNKED) + 1):
        relay = _scanner()
        parts = [CHUNKED[:cut], CHUNKED[cut:] + b"NEXT"]
        seen, ends = 0, []
        for part in parts:
            end = relay._scan_chunked(part)
            if end >= 0:
                ends.append(seen + end)
                break
            seen += len(part)
        assert ends == [len(CHUNKED)], cut


def test_chunked_end_is_found_byte_by_byte():
    relay = _scanner()
    results = [relay._scan_chunked(CHUNKED[i:i + 1]) for i in range(len(CHUNKED))]
    assert results[-1] == 1 and all(r == -1 for r in results[:-1])


@pytest.mark.parametrize("body", [b"zz\r\nab\r\n", b"2\r\nabX\r\n", b"1" * 20 + b"\r\n", b"2;" + b"e" * 5000])
def test_malformed_chunked_bodies_are_refused(body):
    with pytest.raises(ValueError):
        _scanner()._scan_chunked(body)


# ----- over real TLS, against a scripted upstream -------------------------------------------------------------------


class Scripted:
    """An API server stand-in over TLS that reads each request head and answers with the next scripted bytes.
    An answer of None closes the connection without answering; an answer ending in None closes it once sent."""

    def __init__(self, answers: list[list[bytes | None] | None]) -> None:
        self.answers = answers
        self.heads: list[bytes] = []
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
            if not gw._relay_pool.all:
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


async def test_request_with_a_body_after_plain_ones_is_served_by_the_aiohttp_path(gateway, pki, issuer_key,
                                                                                  upstream):
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
        (fp, conns), = gw._by_fp.items()
        (conn,) = conns
        # The peer is still known by its certificate's fingerprint; only the decoded copy is gone.
        assert gw.registry.by_fingerprint[fp].name == "peer"
        assert conn.transport.get_extra_info("peercert") == {}
        (relay,) = gw._relay_pool.all
        assert relay.transport.get_extra_info("peercert") == {}
        # Small records (a response head, then its body) do not wait for delayed ACKs on either connection: the
        # event loop sets TCP_NODELAY on every TCP transport, the gateway relies on it.
        for transport in (conn.transport, relay.transport):
            assert transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        await close(writer)
