"""One Dex exchange per token across worker processes (gateway/workers.py, worker.py): the parent holds the one
exchange cache and the single flight per token, the workers ask it over their private Unix socket."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.gateway.support import ENTRANCE_HOST, make_token, started_pool
from gateway.server import Gateway

URL = f"https://{ENTRANCE_HOST}"


@pytest.fixture
async def pooled(pki, issuer_key, upstream, dex, handlers):
    # A burst above the 200 fresh tokens of one peer: this file is about sharing, the bound has its own tests.
    async with started_pool(pki, issuer_key, upstream, dex, handlers, exchange_burst_per_peer=1000) as gw:
        yield gw


async def _samples(gw: Gateway, name: str, **labels: str) -> dict[str, float]:
    """The value of metric `name` per worker, summed over the samples that carry `labels`."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{gw.ops_port}/metrics") as r:
            text = await r.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(name + "{") or not all(f'{k}="{v}"' in line for k, v in labels.items()):
            continue
        worker = line.split('worker="', 1)[1].split('"', 1)[0]
        out[worker] = out.get(worker, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


async def _get(session_for, gw: Gateway, token: str) -> tuple[int, dict | None]:
    # A new connection each time, so that the kernel spreads them over both workers' sockets.
    async with session_for(gw, force_close=True).get(URL + "/api/v1/pods",
                                                     headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status, await r.json(content_type=None)


async def test_two_hundred_fresh_tokens_over_two_workers_make_two_hundred_dex_calls_and_again_none(
        pooled, session_for, issuer_key, dex):
    tokens = [make_token(issuer_key) for _ in range(200)]
    before = await _samples(pooled, "peering_gateway_requests_total", listener="entrance")
    for round_ in range(2):
        for i in range(0, len(tokens), 20):
            answers = await asyncio.gather(*(_get(session_for, pooled, t) for t in tokens[i:i + 20]))
            assert [code for code, _ in answers] == [200] * len(answers), answers
        # The first round exchanged each token once, the second found every one in a cache.
        assert dex.calls == 200, f"round {round_ + 1}: {dex.calls} Dex calls"
    after = await _samples(pooled, "peering_gateway_requests_total", listener="entrance")
    served = {w: after.get(w, 0) - before.get(w, 0) for w in ("0", "1")}
    assert served["0"] > 0 and served["1"] > 0 and sum(served.values()) == 400, served
    # Exchanged tokens are the parent's Dex client's: only it calls Dex, and counts the calls.
    calls = await _samples(pooled, "peering_gateway_token_exchange_calls_total", outcome="ok")
    assert calls == {"main": 200.0}, calls


async def test_the_same_token_at_once_on_both_workers_makes_one_dex_call(pooled, session_for, issuer_key, dex):
    token = make_token(issuer_key)
    dex.gate = asyncio.Event()
    requests = [asyncio.ensure_future(_get(session_for, pooled, token)) for _ in range(24)]
    try:
        # Both workers hold requests of this token, all waiting for the one exchange held at Dex.
        async with asyncio.timeout(20):
            while True:
                waiting = await _samples(pooled, "peering_gateway_requests_in_flight", listener="entrance")
                if waiting.get("0", 0) > 0 and waiting.get("1", 0) > 0 and dex.calls >= 1:
                    break
                await asyncio.sleep(0.02)
        assert dex.calls == 1
    finally:
        dex.gate.set()
    answers = await asyncio.gather(*requests)
    assert [code for code, _ in answers] == [200] * 24, answers
    assert dex.calls == 1


async def test_a_dex_failure_is_not_cached_as_success(pooled, session_for, issuer_key, dex):
    token = make_token(issuer_key)
    dex.answer = (401, {"error": "access_denied", "error_description": "the subject token does not verify"})
    for attempt in range(1, 3):
        code, body = await _get(session_for, pooled, token)
        assert (code, body["reason"]) == (401, "TokenExchangeRefused"), body
        assert dex.calls == attempt  # each refusal was Dex's, none came from a cache
    dex.answer = None
    code, body = await _get(session_for, pooled, token)
    assert code == 200 and dex.calls == 3
    for _ in range(6):
        assert (await _get(session_for, pooled, token))[0] == 200
    assert dex.calls == 3
    assert pooled.exchange_failures == {}  # the success cleared the failure the parent recorded
