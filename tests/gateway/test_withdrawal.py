"""Open streams end when their authority ends: a watch open through the entrance (both of its paths,
and in a worker) or the egress is closed within a second when a new registry no longer admits it (a capability
closed, the consumer removed from the PeeringCapability) and at its token's expiry; a registry that still admits
it leaves it open."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import aiohttp
import pytest

from gateway.registry import LocalCapability, Registry
from gateway.server import Gateway
from tests.gateway.support import (CLUSTER, ENTRANCE_HOST, gateway_config, load_certs, make_token, registry_for,
                                   started_pool)
from tests.gateway.test_egress import EGRESS, _egress_gateway

URL = f"https://{ENTRANCE_HOST}"
WATCH = "/api/v1/namespaces/default/pods?watch=true"


def withdrawn(reg: Registry, kind: str, generation: int = 2) -> Registry:
    """`reg` with one thing its consumer's watch needs taken away (or, for "unrelated", nothing it needs)."""
    peer = reg.peers["peer"]
    if kind == "capability-closed":  # spec.capabilities on either side: the effective set loses it
        peer = replace(peer, effective=frozenset())
    elif kind == "capability-not-accepted":
        cap = reg.capabilities["read-pods"]
        return replace(reg, generation=generation, capabilities={"read-pods": replace(cap, accepted=False)})
    elif kind == "consumer-removed":
        cap = reg.capabilities["read-pods"]
        others = LocalCapability(cap.name, cap.version, frozenset({("mod", "other")}), True)
        return replace(reg, generation=generation, capabilities={"read-pods": others})
    elif kind == "unrelated":  # another capability opened: the watch still passes
        peer = replace(peer, effective=peer.effective | {"write-pods"})
    else:
        raise AssertionError(kind)
    return replace(reg, generation=generation, peers={"peer": peer},
                   by_fingerprint={fp: peer for fp in peer.fingerprints})


async def _ends_within(resp: aiohttp.ClientResponse, seconds: float) -> float:
    """Read the watch until the gateway cuts it; how long that took. Fails if it is still open after `seconds`."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        async with asyncio.timeout(seconds):
            while await resp.content.readline():
                pass
    except aiohttp.ClientError:
        pass
    return loop.time() - start


async def _stays_open(resp: aiohttp.ClientResponse, lines: int = 10) -> None:
    async with asyncio.timeout(5):
        for _ in range(lines):
            assert await resp.content.readline()


KINDS = ["capability-closed", "capability-not-accepted", "consumer-removed"]


@pytest.mark.parametrize("path", ["raw"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_withdrawal_closes_an_open_entrance_watch_within_a_second(gateway, session_for, pki, issuer_key,
                                                                         upstream, kind, path):
    upstream.watch_events, upstream.watch_interval = 10_000, 0.02
    s = session_for(gateway)
    headers = {"Authorization": f"Bearer {make_token(issuer_key)}"}
    async with s.get(URL + WATCH, headers=headers) as resp:
        assert resp.status == 200
        await _stays_open(resp, 3)
        gateway.publish(withdrawn(gateway.state.registry, "unrelated"))
        await _stays_open(resp)
        gateway.publish(withdrawn(gateway.state.registry, kind, generation=3))
        assert await _ends_within(resp, 1.0) < 1.0
    async with asyncio.timeout(2):
        await upstream.watch_closed.wait()
    assert len(gateway.state.streams) == 0
    # and a new request is refused by admission, not only cut
    async with s.get(URL + "/api/v1/pods", headers={"Authorization": f"Bearer {make_token(issuer_key)}"}) as r:
        assert (r.status, (await r.json())["reason"]) in ((401, "TokenAudienceMismatch"), (403, "NotAConsumer"))


@pytest.mark.parametrize("path", ["raw"])
async def test_an_entrance_watch_ends_at_its_token_expiry(pki, issuer_key, upstream, dex, handlers, session_for, path):
    gw = Gateway(gateway_config(pki, upstream, dex, token_skew=0.0), handlers)
    await gw.start()
    try:
        load_certs(gw, pki)
        gw.publish(registry_for(pki, issuer_key))
        upstream.watch_events, upstream.watch_interval = 10_000, 0.02
        token = make_token(issuer_key, exp_in=2.5)
        exp = int(time.time() + 2.5)  # as make_token truncates it
        headers = {"Authorization": f"Bearer {token}"}
        async with session_for(gw).get(URL + WATCH, headers=headers) as resp:
            assert resp.status == 200
            await _ends_within(resp, max(0.0, exp - time.time()) + 1.0)
            ended = time.time()
        assert exp - 0.1 <= ended < exp + 1.0
    finally:
        await gw.stop()


def _egress_registry(egress: Gateway, kind: str, generation: int) -> Registry:
    return withdrawn(egress.state.registry, kind, generation)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_withdrawal_closes_an_open_egress_watch_within_a_second(gateway, pki, issuer_key, upstream, dex,
                                                                      handlers, session_for, kind):
    egress = await _egress_gateway(pki, issuer_key, upstream, dex, handlers, gateway)
    try:
        upstream.watch_events, upstream.watch_interval = 10_000, 0.02
        s = session_for(egress, None)
        headers = {"Authorization": f"Bearer {make_token(issuer_key)}"}
        async with s.get(EGRESS + "/peers/peer" + WATCH, headers=headers) as resp:
            assert resp.status == 200
            await _stays_open(resp, 3)
            egress.publish(_egress_registry(egress, "unrelated", 2))
            await _stays_open(resp)
            egress.publish(_egress_registry(egress, kind, 3))
            assert await _ends_within(resp, 1.0) < 1.0
        assert len(egress.state.streams) == 0
    finally:
        await egress.stop()


async def test_an_egress_watch_ends_at_its_token_expiry(gateway, pki, issuer_key, upstream, dex, handlers,
                                                        session_for):
    egress = await _egress_gateway(pki, issuer_key, upstream, dex, handlers, gateway)
    try:
        upstream.watch_events, upstream.watch_interval = 10_000, 0.02
        token = make_token(issuer_key, exp_in=2.5)
        exp = int(time.time() + 2.5)
        async with session_for(egress, None).get(EGRESS + "/peers/peer" + WATCH,
                                                 headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 200
            await _ends_within(resp, max(0.0, exp - time.time()) + 1.0)
            ended = time.time()
        assert exp - 0.1 <= ended < exp + 1.0
    finally:
        await egress.stop()


@pytest.fixture
async def pooled(pki, issuer_key, upstream, dex, handlers):
    async with started_pool(pki, issuer_key, upstream, dex, handlers, token_skew=0.0) as gw:
        yield gw


@pytest.mark.parametrize("kind", ["capability-closed", "consumer-removed"])
async def test_a_withdrawal_published_in_the_parent_closes_watches_in_every_worker(pooled, session_for, pki,
                                                                                   issuer_key, upstream, kind):
    upstream.watch_events, upstream.watch_interval = 10_000, 0.02
    token = make_token(issuer_key)
    # New connections, so that the kernel spreads them over both workers; held open together.
    sessions = [session_for(pooled, force_close=True) for _ in range(6)]
    async with asyncio.TaskGroup() as tg:
        opened = [tg.create_task(s.get(URL + WATCH, headers={"Authorization": f"Bearer {token}"})) for s in sessions]
    responses = [t.result() for t in opened]
    try:
        for resp in responses:
            assert resp.status == 200
            await _stays_open(resp, 2)
        base = registry_for(pki, issuer_key)
        pooled.publish(withdrawn(base, kind, generation=2))
        ends = await asyncio.gather(*(_ends_within(r, 1.0) for r in responses))
        assert max(ends) < 1.0
    finally:
        for resp in responses:
            resp.release()


async def test_a_worker_watch_ends_at_its_token_expiry(pooled, session_for, issuer_key, upstream):
    upstream.watch_events, upstream.watch_interval = 10_000, 0.02
    token = make_token(issuer_key, exp_in=2.5)
    exp = int(time.time() + 2.5)
    async with session_for(pooled).get(URL + WATCH, headers={"Authorization": f"Bearer {token}"}) as resp:
        assert resp.status == 200
        await _ends_within(resp, max(0.0, exp - time.time()) + 1.0)
        ended = time.time()
    assert exp - 0.1 <= ended < exp + 1.0


def with_grants(reg: Registry, namespaces: tuple[str, ...], generation: int) -> Registry:
    """`reg` whose ClusterPeer status.grants give read-pods access in `namespaces` (the paired projects')."""
    peer = replace(reg.peers["peer"], grants=frozenset(("read-pods", ns) for ns in namespaces))
    return replace(reg, generation=generation, peers={"peer": peer},
                   by_fingerprint={fp: peer for fp in peer.fingerprints})


@pytest.mark.parametrize("path", ["raw"])
async def test_a_project_unpairing_closes_an_open_entrance_watch_in_its_namespace(gateway, session_for, pki,
                                                                                  issuer_key, upstream, path):
    upstream.watch_events, upstream.watch_interval = 10_000, 0.02
    base = registry_for(pki, issuer_key)
    gateway.publish(with_grants(base, ("default", "shop"), 2))
    s = session_for(gateway)
    headers = {"Authorization": f"Bearer {make_token(issuer_key)}"}
    async with s.get(URL + WATCH, headers=headers) as resp:  # in namespace default
        assert resp.status == 200
        await _stays_open(resp, 3)
        gateway.publish(with_grants(base, ("default",), 3))  # another project unpaired
        await _stays_open(resp)
        gateway.publish(with_grants(base, ("shop",), 4))  # default's project unpaired
        assert await _ends_within(resp, 1.0) < 1.0
    assert len(gateway.state.streams) == 0
