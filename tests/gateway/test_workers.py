"""Worker processes: the entrance served by two uvloop workers sharing the port, fed by the parent."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.gateway.support import ENTRANCE_HOST, make_token, registry_for, started_pool

URL = f"https://{ENTRANCE_HOST}"


@pytest.fixture
async def pooled(pki, issuer_key, upstream, dex, handlers):
    async with started_pool(pki, issuer_key, upstream, dex, handlers) as gw:
        yield gw


async def test_two_workers_serve_the_entrance_and_are_fed_by_the_parent(pooled, session_for, issuer_key, pki,
                                                                         upstream, handlers, dex):
    token = make_token(issuer_key)
    # New connections each time, so that the kernel spreads them over both workers' sockets.
    for _ in range(24):
        s = session_for(pooled, force_close=True)
        async with s.get(URL + "/api/v1/pods", headers={"Authorization": f"Bearer {token}"}) as r:
            assert r.status == 200
    # Each worker exchanged the token once (caches are per process): never more than one call per worker.
    assert 1 <= dex.calls <= 2
    async with session_for(pooled).post(URL + "/peering/v1/notify", json={"n": 1}) as r:
        assert r.status == 200 and await r.json() == {"op": "notify", "peer": "peer"}
    assert handlers.calls[-1].op == "notify" and handlers.calls[-1].peer.name == "peer"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{pooled.ops_port}/metrics") as r:
            text = await r.text()
        async with http.get(f"http://127.0.0.1:{pooled.ops_port}/readyz") as r:
            assert r.status == 200
    served = {w: 0.0 for w in ("0", "1")}
    for line in text.splitlines():
        if line.startswith("peering_gateway_requests_total{") and 'listener="entrance"' in line:
            for w in served:
                if f'worker="{w}"' in line:
                    served[w] += float(line.rsplit(" ", 1)[1])
    assert served["0"] > 0 and served["1"] > 0 and sum(served.values()) == 25


async def test_revocation_published_in_the_parent_closes_a_worker_watch_within_a_second(
        pooled, session_for, issuer_key, pki, upstream):
    upstream.watch_events, upstream.watch_interval = 10_000, 0.02
    s = session_for(pooled)
    async with s.get(URL + "/api/v1/pods?watch=true", headers={"Authorization": f"Bearer {make_token(issuer_key)}"}) \
            as resp:
        await resp.content.readline()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        pooled.publish(registry_for(pki, issuer_key, generation=2, peers=("peer2",)))
        with pytest.raises(aiohttp.ClientError):
            async with asyncio.timeout(1.0):
                while await resp.content.readline():
                    pass
                raise aiohttp.ServerDisconnectedError()
        assert loop.time() - t0 < 1.0


async def test_a_worker_that_dies_is_started_again_with_the_current_state(pooled, session_for, issuer_key):
    import os
    import signal
    old = pooled._pool._workers[0].process
    os.kill(old.pid, signal.SIGKILL)
    async with asyncio.timeout(10):
        while pooled._pool._workers[0].process is old:
            await asyncio.sleep(0.02)
        assert pooled.readiness()[0] is False or pooled._pool._workers[0].process.is_alive()
        while pooled.readiness() != (True, "ok"):
            await asyncio.sleep(0.02)
    token = make_token(issuer_key)
    for _ in range(8):
        async with session_for(pooled, force_close=True).get(URL + "/api/v1/pods",
                                                              headers={"Authorization": f"Bearer {token}"}) as r:
            assert r.status == 200
