"""The bound per peer on Dex exchanges (gateway/exchange.py PeerRate, Limits.exchanges_per_peer_per_second):
beyond it a new token gets 429 TokenExchangeRateLimited with a Retry-After; cached tokens pass."""

from __future__ import annotations

import asyncio
import json

import pytest

from contract import reasons
from contract.errors import Refusal
from tests.gateway.support import ENTRANCE_HOST, gateway_config, load_certs, make_token, registry_for
from gateway.exchange import ExchangeCache, PeerRate
from gateway.server import Gateway

URL = f"https://{ENTRANCE_HOST}"


def test_a_bucket_per_peer_refills_at_its_rate_and_says_how_long_to_wait():
    now = [100.0]
    rate = PeerRate(2.0, 3, clock=lambda: now[0])
    assert [rate.take("peering-a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate.take("peering-a") == pytest.approx(0.5)
    assert rate.take("peering-b") == 0.0  # another peer has a bucket of its own
    now[0] += 0.5
    assert rate.take("peering-a") == 0.0 and rate.take("peering-a") == pytest.approx(0.5)
    now[0] += 60  # refilled up to the burst, no further
    assert [rate.take("peering-a") for _ in range(4)][-1] > 0
    off = PeerRate(0, 0)
    assert all(off.take("peering-a") == 0.0 for _ in range(1000))
    with pytest.raises(ValueError, match="burst of 0.5 exchanges lets no exchange through"):
        PeerRate(1.0, 0.5)
    refusal = rate.refusal("peering-a", 0.2)
    assert (refusal.code, refusal.reason, refusal.retry_after) == (429, reasons.TOKEN_EXCHANGE_RATE_LIMITED, 1)
    assert "retry after 1 s" in refusal.message and "2 a second" in refusal.message


async def test_the_cache_takes_a_token_only_for_a_call_that_reaches_dex():
    calls: list[str] = []
    gate = asyncio.Event()

    async def call(connector: str, token: str):
        calls.append(token)
        await gate.wait()
        return "x-" + token, 300.0

    now = [0.0]
    cache = ExchangeCache(call, margin=0, rate=PeerRate(1.0, 1, clock=lambda: now[0]))
    waiters = [asyncio.ensure_future(cache.get("c", b"h1", "t1", not_after=1e9)) for _ in range(10)]
    await asyncio.sleep(0)
    gate.set()
    assert set(await asyncio.gather(*waiters)) == {"x-t1"}  # ten waiters of one call cost one token
    assert await cache.get("c", b"h1", "t1", not_after=1e9) == "x-t1"  # a hit costs none
    with pytest.raises(Refusal) as refused:
        await cache.get("c", b"h2", "t2", not_after=1e9)
    assert refused.value.code == 429 and calls == ["t1"]
    now[0] += 1.0
    assert await cache.get("c", b"h2", "t2", not_after=1e9) == "x-t2"
    await cache.close()


@pytest.fixture
async def bounded(pki, issuer_key, upstream, dex, handlers):
    gw = Gateway(gateway_config(pki, upstream, dex, exchanges_per_peer_per_second=0.01, exchange_burst_per_peer=3),
                 handlers)
    await gw.start()
    load_certs(gw, pki)
    gw.publish(registry_for(pki, issuer_key))
    yield gw
    await gw.stop()


async def test_new_tokens_beyond_the_bound_get_429_with_retry_after_on_both_paths(bounded, session_for, issuer_key,
                                                                                   dex):
    session = session_for(bounded)
    tokens = [make_token(issuer_key) for _ in range(5)]
    for token in tokens[:3]:
        async with session.get(URL + "/api/v1/pods", headers={"Authorization": f"Bearer {token}"}) as r:
            assert r.status == 200
    # A plain GET and a request with a body refuse alike.
    for method, body in (("GET", None), ("POST", b"{}")):
        async with session.request(method, URL + "/api/v1/namespaces/x/configmaps", data=body,
                                   headers={"Authorization": f"Bearer {tokens[3]}"}) as r:
            status = json.loads(await r.read())
            assert r.status == 429, status
            assert status["reason"] == "TokenExchangeRateLimited" and "retry after 100 s" in status["message"]
            assert r.headers["Retry-After"] == "100" and status["details"]["retryAfterSeconds"] == 100
            assert tokens[3] not in json.dumps(status)
    assert dex.calls == 3
    # Tokens already exchanged still pass: the bound is on new tokens only.
    async with session.get(URL + "/api/v1/pods", headers={"Authorization": f"Bearer {tokens[0]}"}) as r:
        assert r.status == 200 and dex.calls == 3
