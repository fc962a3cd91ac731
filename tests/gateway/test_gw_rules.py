"""The gateway's rules without a server: header rules, the exchange cache, Status bodies."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.exchange import ExchangeCache, basic_auth, exchange_form
from gateway.headers import bearer, check_request, forwarded_headers, request_head, response_headers
from contract.errors import Refusal
from gateway.status import status_body


def test_forwarded_headers_drop_identity_proxy_chain_and_hop_by_hop():
    raw = [(b"Accept", b"application/json"), (b"Authorization", b"Bearer peer"), (b"X-Forwarded-For", b"1.2.3.4"),
           (b"X-Forwarded-Proto", b"http"), (b"X-Remote-User", b"admin"), (b"X-Remote-Group", b"system:masters"),
           (b"Forwarded", b"for=1.2.3.4"), (b"Connection", b"keep-alive, X-Secret"), (b"X-Secret", b"s"),
           (b"Keep-Alive", b"5"), (b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"3"), (b"Host", b"evil"),
           (b"Impersonate-User", b"admin"), (b"Content-Type", b"application/json"), (b"X-Real-IP", b"1.1.1.1"),
           (b"Expect", b"100-continue")]
    assert forwarded_headers(raw) == [(b"Accept", b"application/json"), (b"Content-Type", b"application/json")]


def test_request_head_is_exact_http11():
    head = request_head("POST", "/api/v1/namespaces?x=1", "api.x.lab", [(b"Accept", b"*/*")], b"Bearer t", 3, False)
    assert head == (b"POST /api/v1/namespaces?x=1 HTTP/1.1\r\nHost: api.x.lab\r\nAccept: */*\r\n"
                    b"Authorization: Bearer t\r\nContent-Length: 3\r\n\r\n")
    assert b"Transfer-Encoding: chunked\r\n" in request_head("POST", "/", "h", [], b"B", None, True)


@pytest.mark.parametrize("name,value,reason", [
    (b"Impersonate-User", b"x", "ImpersonationRefused"), (b"impersonate-extra-foo", b"x", "ImpersonationRefused"),
    (b"Upgrade", b"websocket", "UpgradeRefused"), (b"Connection", b"keep-alive, Upgrade", "UpgradeRefused")])
def test_check_request_refuses(name, value, reason):
    with pytest.raises(Refusal) as err:
        check_request([(b"Accept", b"*/*"), (name, value)])
    assert err.value.reason == reason


def test_response_headers_drop_hop_by_hop_and_connection_named():
    assert response_headers([("Content-Type", "application/json"), ("Connection", "close, X-Hop"), ("X-Hop", "1"),
                             ("Transfer-Encoding", "chunked"), ("Audit-Id", "a")]) == [
        ("Content-Type", "application/json"), ("Audit-Id", "a")]


def test_bearer_parsing():
    assert bearer("Bearer abc", 10) == "abc"
    for value, reason in [(None, "TokenMissing"), ("Basic abc", "TokenMissing"), ("Bearer ", "TokenMissing"),
                          ("Bearer " + "x" * 11, "TokenTooLarge")]:
        with pytest.raises(Refusal) as err:
            bearer(value, 10)
        assert err.value.reason == reason


def test_status_body_is_a_kubernetes_status():
    body = json.loads(status_body(403, "PeerUnknown", "gone"))
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "gone",
                    "reason": "PeerUnknown", "details": {"causes": [{"reason": "PeerUnknown", "message": "gone"}]},
                    "code": 403}


def test_dex_form_and_client_authentication_encoding():
    assert exchange_form("peering-b", "tok", "kubernetes")["connector_id"] == "peering-b"
    import base64
    assert base64.b64decode(basic_auth("id:x", "s e/cret").split()[1]) == b"id%3Ax:s%20e%2Fcret"


async def test_exchange_cache_single_flight_expiry_and_no_failure_caching():
    now = [1000.0]
    calls = []
    gate = asyncio.Event()

    async def call(connector: str, token: str):
        calls.append(token)
        await gate.wait()
        if token == "bad":
            raise Refusal(503, "TokenExchangeUnavailable", "down")
        return f"x-{len(calls)}", 100.0

    cache = ExchangeCache(call, margin=10, clock=lambda: now[0])
    waiters = [asyncio.ensure_future(cache.get("c", b"h", "tok", not_after=now[0] + 1000)) for _ in range(50)]
    await asyncio.sleep(0)
    gate.set()
    assert set(await asyncio.gather(*waiters)) == {"x-1"} and len(calls) == 1
    assert cache.cached("c", b"h") == "x-1"
    now[0] += 91  # past expires_in minus the margin
    assert cache.cached("c", b"h") is None
    # The subject token's own expiry bounds the cache too.
    await cache.get("c", b"h2", "tok2", not_after=now[0] + 5)
    now[0] += 6
    assert cache.cached("c", b"h2") is None
    for _ in range(2):
        with pytest.raises(Refusal):
            await cache.get("c", b"hb", "bad", not_after=now[0] + 1000)
    assert calls.count("bad") == 2
    await cache.close()
