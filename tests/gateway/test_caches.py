"""The gateway's bounded caches (cachetools): full, each evicts one entry at a time and never forgets every peer
or token at once; the exchange cache holds nothing past an entry's end."""

from __future__ import annotations

import hashlib
import time

from gateway import tls
from gateway.accounting import Accounting
from gateway.config import GatewayConfig
from gateway.exchange import ExchangeCache
from gateway.metrics import Metrics
from gateway.tokens import VerifiedTokens
from tests.gateway.support import make_token, registry_for


async def test_a_full_exchange_cache_drops_the_expired_then_the_least_recently_used_one():
    now = [0.0]

    async def call(connector: str, token: str):
        return "x-" + token, 100.0 if token != "short" else 10.0

    cache = ExchangeCache(call, margin=0, max_entries=3, clock=lambda: now[0])
    for token in ("a", "b", "short"):
        await cache.get("c", token.encode(), token, not_after=1e9)
    now[0] = 20.0  # "short" has ended
    assert cache.cached("c", b"short") is None and cache.lifetime("c", b"short") == 0.0
    await cache.get("c", b"d", "d", not_after=1e9)
    assert len(cache) == 3  # a, b and d: the ended one went first
    assert cache.cached("c", b"a") == "x-a"  # b is the least recently used
    await cache.get("c", b"e", "e", not_after=1e9)
    assert [cache.cached("c", t) for t in (b"a", b"b", b"d", b"e")] == ["x-a", None, "x-d", "x-e"]
    assert len(cache) == 3 and cache.lifetime("c", b"a") == 80.0
    now[0] = 120.0  # the end of the last ones (exchanged at 20 for 100 s)
    assert len(cache) == 0 and cache.cached("c", b"a") is None
    await cache.close()


def test_a_full_verified_token_cache_evicts_one_token_not_everyone(pki, issuer_key):
    registry = registry_for(pki, issuer_key)
    peer = registry.peers["peer"]
    cache = VerifiedTokens(max_entries=3)
    tokens = [make_token(issuer_key) for _ in range(4)]
    hashes = [hashlib.sha256(t.encode()).digest() for t in tokens]
    for token, token_hash in zip(tokens, hashes):
        cache.verify(token, token_hash, peer, registry, now=time.time(), skew=30, max_bytes=16384)
    assert [cache.get(h) is not None for h in hashes] == [False, True, True, True] and len(cache) == 3
    cache.clear()
    assert len(cache) == 0


def test_the_fingerprint_cache_evicts_one_certificate_at_a_time():
    class Transport:
        def __init__(self, der: bytes) -> None:
            self.der = der

        def get_extra_info(self, name: str):
            der = self.der

            class SSLObject:
                def getpeercert(self, binary_form: bool = False) -> bytes:
                    return der
            return SSLObject() if name == "ssl_object" else None

    tls._FINGERPRINTS.clear()
    ders = [b"certificate-%d" % i for i in range(4097)]
    for der in ders:
        assert tls.peer_fingerprint(Transport(der)) == hashlib.sha256(der).hexdigest()
    assert len(tls._FINGERPRINTS) == 4096 and ders[0] not in tls._FINGERPRINTS and ders[1] in tls._FINGERPRINTS


def test_request_counters_keep_counting_when_their_lookup_table_evicts():
    metrics = Metrics()
    accounting = Accounting(metrics, GatewayConfig(access_log=False))
    for i in range(10_001):
        accounting.finish("entrance", f"peer-{i}", "-", "GET", "/", 200, time.perf_counter())
    accounting.finish("entrance", "peer-0", "-", "GET", "/", 200, time.perf_counter())
    assert metrics.registry.get_sample_value("peering_gateway_requests_total", {
        "listener": "entrance", "peer": "peer-0", "capability": "-", "code": "2xx", "outcome": "answered"}) == 2.0
    assert metrics.registry.get_sample_value("peering_gateway_requests_total", {
        "listener": "entrance", "peer": "peer-10000", "capability": "-", "code": "2xx", "outcome": "answered"}) == 1.0
