"""The bound per peer on calls of the peer protocol (gateway/peercalls.py, Limits.peer_calls_per_second): a peer
calling /peering/v1/* as fast as its connections allow gets 429 PeerCallsRateLimited with a Retry-After beyond
the burst, before the control loop is called; another peer is not slowed; with workers the bound is one per peer
for the whole process."""

from __future__ import annotations

import asyncio

import pytest

from contract import reasons
from contract.errors import Refusal
from gateway.peercalls import PeerCallBound
from gateway.protocol import JoinCall, PeerCall
from gateway.server import Gateway
from tests.gateway.support import (ENTRANCE_HOST, Handlers, gateway_config, load_certs, registry_for,
                                   started_pool)

URL = f"https://{ENTRANCE_HOST}"


async def test_a_peer_beyond_its_bound_is_refused_before_the_control_loop_and_others_are_not():
    handlers, now = Handlers(), [0.0]
    bound = PeerCallBound(handlers, 2.0, 3, clock=lambda: now[0])
    peer_a, peer_b = _peer("a"), _peer("b")
    for _ in range(3):
        await bound.peer_call(PeerCall(peer=peer_a, op="offer", body=None))
    with pytest.raises(Refusal) as refused:
        await bound.peer_call(PeerCall(peer=peer_a, op="certificate", body={"csr": "x"}))
    assert (refused.value.code, refused.value.reason, refused.value.retry_after) == \
        (429, reasons.PEER_CALLS_RATE_LIMITED, 1)
    assert "2 calls a second, bursts of 3" in refused.value.message and "retry after 1 s" in refused.value.message
    assert len(handlers.calls) == 3  # the refused call never reached the control loop
    await bound.peer_call(PeerCall(peer=peer_b, op="offer", body=None))  # another peer has its own bucket
    now[0] += 0.5
    await bound.peer_call(PeerCall(peer=peer_a, op="offer", body=None))
    assert await bound.join(JoinCall(body={"token": "good"}, remote="r")) == {"joined": True}
    with pytest.raises(ValueError, match="lets no peer call through"):
        PeerCallBound(handlers, 1.0, 0.5)


def _peer(name: str):
    from gateway.registry import Peer

    return Peer(name=name, uuid="u", fingerprints=frozenset(), issuer_url=None, jwks_json=None,
                effective=frozenset(), connector_id=f"peering-{name}", entrance=None, peer_ca_pem=None,
                client_cert_pem=None, client_key_pem=None)


async def _flood(session, n: int) -> list[tuple[int, str | None, str | None]]:
    async def one():
        async with session.get(URL + "/peering/v1/offer") as r:
            body = await r.json()
            return r.status, r.headers.get("Retry-After"), body.get("reason")
    return list(await asyncio.gather(*(one() for _ in range(n))))


async def test_over_tls_a_flood_of_peer_calls_gets_429_with_retry_after(pki, issuer_key, upstream, dex, handlers,
                                                                         session_for):
    gw = Gateway(gateway_config(pki, upstream, dex, peer_calls_per_second=1.0, peer_call_burst=20), handlers)
    await gw.start()
    try:
        load_certs(gw, pki)
        gw.publish(registry_for(pki, issuer_key, peers=("peer", "peer2")))
        answers = await _flood(session_for(gw, "peer"), 60)
        assert sum(1 for a in answers if a[0] == 200) == 20
        refused = [a for a in answers if a[0] != 200]
        assert len(refused) == 40 and all(a[0] == 429 and a[2] == reasons.PEER_CALLS_RATE_LIMITED and
                                          int(a[1]) >= 1 for a in refused)
        assert len(handlers.calls) == 20
        # The other peer's calls pass.
        assert {a[0] for a in await _flood(session_for(gw, "peer2"), 5)} == {200}
    finally:
        await gw.stop()


async def test_with_workers_the_bound_is_one_per_peer_for_the_whole_process(pki, issuer_key, upstream, dex,
                                                                            handlers, session_for):
    async with started_pool(pki, issuer_key, upstream, dex, handlers, workers=2, peer_calls_per_second=1.0,
                            peer_call_burst=20) as gw:
        # Fresh connections, spread over both workers by SO_REUSEPORT.
        answers = await _flood(session_for(gw, "peer", force_close=True), 60)
        assert sum(1 for a in answers if a[0] == 200) == 20
        assert all(a[0] == 429 and int(a[1]) >= 1 for a in answers if a[0] != 200)
        assert len(handlers.calls) == 20
