"""Request bodies on the entrance's raw path (gateway/upload.py, gateway/entrance.py): the Upload without sockets,
then over real TLS against the scripted upstream of test_relay.py, which keeps each body as it came."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.framing import BodyTooLarge, FramingError
from gateway.upload import QUEUE_HIGH, Upload
from tests.gateway.support import ENTRANCE_HOST, make_token, started_gateway
from tests.gateway.test_relay import close, connect, get, ok, read_answer, scripted_gateway  # noqa: F401

CHUNKED = b"4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n"


class Sink:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.ended = 0

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    def end_body(self) -> None:
        self.ended += 1


# ----- without sockets --------------------------------------------------------------------------------------------
def test_a_body_waits_in_order_for_its_relay_and_what_follows_it_is_the_next_requests():
    upload = Upload(limit=100)
    upload.begin(None, True, keep=True)
    assert upload.active and upload.open
    assert upload.feed(CHUNKED[:9]) == b""
    sink = Sink()
    upload.attach(sink)  # what waited goes first, then the rest as it comes
    assert upload.feed(CHUNKED[9:] + b"GET / HTTP/1.1\r\n") == b"GET / HTTP/1.1\r\n"
    assert b"".join(sink.sent) == CHUNKED and sink.ended == 1 and not upload.open


def test_a_retry_gets_the_whole_body_until_the_answer_begins():
    upload = Upload(limit=100)
    upload.begin(7, False, keep=True)
    first = Sink()
    upload.attach(first)
    upload.feed(b"abc")
    upload.detach()  # the pooled connection failed before any answer
    upload.feed(b"de")  # arrives while a new connection is made
    second = Sink()
    upload.attach(second)
    upload.feed(b"fg")
    assert b"".join(first.sent) == b"abc" and b"".join(second.sent) == b"abcdefg" and second.ended == 1
    upload.answered()
    assert upload.kept is None  # nothing held once the answer has begun


def test_a_refused_requests_body_is_read_and_dropped():
    upload = Upload(limit=100)
    upload.begin(5, False, keep=False)
    assert not upload.active and upload.open
    assert upload.feed(b"hello" + b"NEXT") == b"NEXT" and not upload.open and upload.queued == 0


def test_bodies_over_the_limit_or_malformed_are_errors_and_the_queue_is_counted():
    with pytest.raises(BodyTooLarge):
        Upload(limit=10).begin(11, False, keep=True)
    upload = Upload(limit=QUEUE_HIGH * 2)
    upload.begin(QUEUE_HIGH + 1, False, keep=True)
    upload.feed(b"x" * (QUEUE_HIGH + 1))
    assert upload.queued == QUEUE_HIGH + 1  # past QUEUE_HIGH the entrance stops reading the client
    broken = Upload(limit=100)
    broken.begin(None, True, keep=True)
    with pytest.raises(FramingError):
        broken.feed(b"zz\r\n")


# ----- over real TLS ----------------------------------------------------------------------------------------------
def post(path: str, token: str, body: bytes, *, chunked: bool = False) -> bytes:
    framing = b"Transfer-Encoding: chunked\r\n" if chunked else b"Content-Length: %d\r\n" % len(body)
    return (f"POST {path} HTTP/1.1\r\nHost: {ENTRANCE_HOST}\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\n").encode() + framing + b"\r\n" + body


PODS = "/api/v1/namespaces/default/pods"


async def test_bodies_are_relayed_as_the_client_framed_them_and_the_connection_serves_on(scripted_gateway, pki,
                                                                                         issuer_key):
    gw, scripted = await scripted_gateway([ok(b'{"n":1}'), ok(b'{"n":2}'), ok(b'{"n":3}')])
    token = make_token(issuer_key)
    reader, writer = await connect(gw, pki)
    try:
        # A body sent with its head, a chunked one in pieces, and a GET pipelined right behind it.
        writer.write(post(PODS, token, b'{"kind":"Pod"}'))
        assert (await read_answer(reader))[2] == b'{"n":1}'
        writer.write(post(PODS, token, b"", chunked=True) + CHUNKED[:5])
        await writer.drain()
        writer.write(CHUNKED[5:] + get(PODS, token))
        assert (await read_answer(reader))[2] == b'{"n":2}'
        assert (await read_answer(reader))[2] == b'{"n":3}'
    finally:
        await close(writer)
    assert scripted.bodies == [b'{"kind":"Pod"}', CHUNKED, b""]
    assert b"Content-Length: 14\r\n" in scripted.heads[0] and b"Transfer-Encoding: chunked\r\n" in scripted.heads[1]
    assert scripted.connections == 1  # one upstream connection served the three


async def test_a_pooled_connection_the_upstream_closed_is_retried_with_the_whole_body(scripted_gateway, pki,
                                                                                     issuer_key):
    # The first connection answers once and then closes when the next request comes, without answering it.
    gw, scripted = await scripted_gateway([ok(b'{"n":1}'), None, ok(b'{"n":2}')])
    token = make_token(issuer_key)
    reader, writer = await connect(gw, pki)
    try:
        writer.write(get(PODS, token))
        assert (await read_answer(reader))[2] == b'{"n":1}'
        writer.write(post(PODS, token, b'{"kind":"ConfigMap"}'))
        assert (await read_answer(reader))[2] == b'{"n":2}'
    finally:
        await close(writer)
    assert scripted.connections == 2 and scripted.bodies[-1] == b'{"kind":"ConfigMap"}'


async def test_a_refused_request_s_body_is_dropped_and_the_next_request_served(scripted_gateway, pki, issuer_key):
    gw, scripted = await scripted_gateway([ok(b'{"n":1}')])
    reader, writer = await connect(gw, pki)
    try:
        writer.write(post(PODS, "not-a-jwt", b'{"kind":"Pod"}') + get(PODS, make_token(issuer_key)))
        code, headers, body = await read_answer(reader)
        assert (code, json.loads(body)["reason"]) == (401, "TokenMalformed") and "connection" not in headers
        assert (await read_answer(reader))[2] == b'{"n":1}'
    finally:
        await close(writer)
    assert scripted.bodies == [b""]  # the refused body never reached the upstream


@pytest.mark.parametrize("body, code, reason", [
    (b"zz\r\nab\r\n", 400, "MalformedRequest"),
    (b"0\r\nX-Smuggled: 1\r\n\r\n", 400, "MalformedRequest"),
    (b"400\r\n" + b"x" * 1024 + b"\r\n0\r\n\r\n", 413, "RequestEntityTooLarge"),
])
async def test_a_body_that_cannot_be_relayed_is_refused_and_the_connection_closed(scripted_gateway, pki, issuer_key,
                                                                                 body, code, reason):
    gw, scripted = await scripted_gateway([ok(b"{}")], max_body_bytes=1000)
    reader, writer = await connect(gw, pki)
    try:
        writer.write(post(PODS, make_token(issuer_key), b"", chunked=True) + body)
        answer, headers, status = await read_answer(reader)
        assert (answer, json.loads(status)["reason"], headers.get("connection")) == (code, reason, "close")
        assert await asyncio.wait_for(reader.read(), 10) == b""
    finally:
        await close(writer)
    for _ in range(200):
        if _refused(gw):
            break
        await asyncio.sleep(0.01)
    assert _refused(gw) == 1  # one refusal of the entrance, counted once (and logged: accounting.py)


def _refused(gw) -> float:
    return sum(sample.value for metric in gw.metrics.requests.collect() for sample in metric.samples
               if sample.name.endswith("_total") and sample.labels["listener"] == "entrance"
               and sample.labels["outcome"] == "refused" and sample.labels["code"] == "4xx")


async def test_a_body_waiting_for_its_admission_holds_the_client_and_goes_whole_once_admitted(
        pki, issuer_key, upstream, dex, handlers):
    dex.gate = asyncio.Event()  # the token's exchange waits: so does the body
    async with started_gateway(pki, issuer_key, upstream, dex, handlers) as gw:
        reader, writer = await connect(gw, pki)
        body = b'{"data":"' + b"x" * (3 * QUEUE_HIGH) + b'"}'
        try:
            writer.write(post(PODS, make_token(issuer_key), body))
            (fp,) = gw.registry.by_fingerprint
            async with asyncio.timeout(10):
                while not any(stream.get_protocol().body_held for stream in gw.state.connections.of(fp)):
                    await asyncio.sleep(0.01)  # past QUEUE_HIGH queued, the client is not read any more
            (stream,) = gw.state.connections.of(fp)
            assert not stream.is_reading() and upstream.requests == []  # nothing sent before admission
            dex.gate.set()
            code, _, answer = await read_answer(reader)
        finally:
            await close(writer)
        assert code == 200 and json.loads(answer)["seen"]["length"] == len(body)


async def test_expect_100_continue_is_answered_before_the_body(pki, issuer_key, upstream, dex, handlers):
    async with started_gateway(pki, issuer_key, upstream, dex, handlers) as gw:
        reader, writer = await connect(gw, pki)
        try:
            head = post(PODS, make_token(issuer_key), b"{}")
            writer.write(head[:-2].replace(b"Content-Type", b"Expect: 100-continue\r\nContent-Type"))
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"{}")
            code, _, answer = await read_answer(reader)
        finally:
            await close(writer)
        assert code == 200 and json.loads(answer)["seen"]["length"] == 2


async def test_a_head_the_entrance_cannot_read_is_refused_counted_and_the_connection_closed(
        pki, issuer_key, upstream, dex, handlers):
    async with started_gateway(pki, issuer_key, upstream, dex, handlers) as gw:
        reader, writer = await connect(gw, pki)
        try:
            writer.write(b"GET /api HTTP/1.0\r\nHost: x\r\n\r\n")
            code, headers, body = await read_answer(reader)
            assert (code, json.loads(body)["reason"], headers["connection"]) == (400, "MalformedRequest", "close")
            assert "send HTTP/1.1" in json.loads(body)["message"]
            assert await asyncio.wait_for(reader.read(), 10) == b""
        finally:
            await close(writer)
        assert _refused(gw) == 1 and upstream.requests == []
