"""The Dex exchange's rules without a server (gateway/exchange.py): the form, the client authentication, the cache,
and the last failure per connector."""

from __future__ import annotations

import asyncio

import pytest

from contract.errors import Refusal
from gateway.exchange import ExchangeCache, ExchangeFailures, basic_auth, exchange_form


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


def test_exchange_failures_keep_the_last_per_connector_and_say_when_it_changed():
    failures = ExchangeFailures()
    assert failures.record("peering-a", ("TokenExchangeRefused", "no")) is True
    assert failures.record("peering-a", ("TokenExchangeRefused", "no")) is False
    assert failures.by_connector == {"peering-a": ("TokenExchangeRefused", "no")}
    assert failures.record("peering-a", None) is True and failures.by_connector == {}
    assert failures.record("peering-a", None) is False


def test_exchange_failures_tell_their_subscribers_each_change_and_nothing_else():
    failures, told = ExchangeFailures(), []
    unsubscribe = failures.subscribe(told.append)
    failures.record("peering-a", ("TokenExchangeRefused", "no"))
    failures.record("peering-a", ("TokenExchangeRefused", "no"))
    failures.record("peering-b", None)
    failures.record("peering-a", None)
    assert told == ["peering-a", "peering-a"]
    unsubscribe()
    failures.record("peering-a", ("DexUnreachable", "down"))
    assert told == ["peering-a", "peering-a"]
