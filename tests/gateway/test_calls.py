"""Calls of the peer protocol on the entrance's raw path (gateway/calls.py) over real TLS: admitted, their body a
JSON object read by the request body reader, answered by the control loop's handlers, the connection serving on."""

from __future__ import annotations

import json

from tests.gateway.support import ENTRANCE_HOST, make_token, started_gateway
from tests.gateway.test_relay import close, connect, get, read_answer


def call(method: str, op: str, body: bytes | None = None, *, chunked: bool = False) -> bytes:
    head = f"{method} /peering/v1/{op} HTTP/1.1\r\nHost: {ENTRANCE_HOST}\r\n".encode()
    if body is None:
        return head + b"\r\n"
    if chunked:
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


async def test_peer_calls_are_answered_on_the_raw_path_and_the_connection_serves_on(pki, issuer_key, upstream, dex,
                                                                                    handlers):
    async with started_gateway(pki, issuer_key, upstream, dex, handlers) as gw:
        reader, writer = await connect(gw, pki)
        try:
            writer.write(call("POST", "notify", b'{"generation": 3}') + call("POST", "notify", b"{}", chunked=True)
                         + call("GET", "offer") + get("/api/v1/namespaces/default/pods", make_token(issuer_key)))
            answers = [await read_answer(reader) for _ in range(4)]
        finally:
            await close(writer)
        assert [(code, json.loads(body)) for code, _, body in answers[:3]] == [
            (200, {"op": "notify", "peer": "peer"}), (200, {"op": "notify", "peer": "peer"}),
            (200, {"op": "offer", "peer": "peer"})]
        assert answers[3][0] == 200
        assert [(c.op, c.body) for c in handlers.calls] == [("notify", {"generation": 3}), ("notify", {}),
                                                          ("offer", None)]
        assert len(gw.state.relay_pool.all) == 1  # the proxied request after them, on the entrance's relay


async def test_a_peer_call_s_body_is_bounded_and_must_be_a_json_object(pki, issuer_key, upstream, dex, handlers):
    async with started_gateway(pki, issuer_key, upstream, dex, handlers, max_peer_call_bytes=100) as gw:
        reader, writer = await connect(gw, pki)
        try:
            writer.write(call("POST", "notify", b"[1]") + call("POST", "notify", b"{" + b" " * 200 + b"}"))
            code, _, body = await read_answer(reader)
            assert (code, json.loads(body)["reason"]) == (400, "MalformedBody")  # and the connection serves on
            code, headers, body = await read_answer(reader)
            assert (code, json.loads(body)["reason"], headers["connection"]) == (413, "RequestEntityTooLarge", "close")
        finally:
            await close(writer)
        reader, writer = await connect(gw, pki)
        try:  # chunked: refused at the chunk that passes the bound, before its bytes are read
            writer.write(call("POST", "notify", b"x" * 101, chunked=True))
            code, _, body = await read_answer(reader)
            assert (code, json.loads(body)["reason"]) == (413, "RequestEntityTooLarge")
        finally:
            await close(writer)
        assert handlers.calls == []
