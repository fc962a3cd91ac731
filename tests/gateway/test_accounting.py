"""What a request leaves behind tells what happened to it, on the egress and on both entrance paths: a watch that
its client ends is `client_closed` with the code the upstream answered (never a 500), one the upstream ends is
`answered`, one the gateway withdraws `withdrawn`, one the upstream cuts `interrupted`, and a request abandoned
before any answer `client_closed` with 499; the access log line and peering_gateway_requests_total agree."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
import pytest

from tests.gateway.support import ENTRANCE_HOST, access_lines, make_token, request_counts
from tests.gateway.test_egress import EGRESS, _egress_gateway
from tests.gateway.test_withdrawal import withdrawn

PATHS = ["egress", "raw"]
WATCH = "/api/v1/namespaces/default/pods?watch=true"


@contextlib.asynccontextmanager
async def through(path, gateway, pki, issuer_key, upstream, dex, handlers, session_for):
    """(the gateway that answers the client, the client's session, the URL of WATCH, the headers) for `path`: the
    egress in front of `gateway` (the peer's entrance), or `gateway`'s entrance."""
    gateway.config.access_log = True
    headers = {"Authorization": f"Bearer {make_token(issuer_key)}"}
    if path != "egress":
        yield gateway, session_for(gateway), f"https://{ENTRANCE_HOST}{WATCH}", headers
        return
    egress = await _egress_gateway(pki, issuer_key, upstream, dex, handlers, gateway)
    egress.config.access_log = True
    try:
        yield egress, session_for(egress, None), f"{EGRESS}/peers/peer{WATCH}", headers
    finally:
        await egress.stop()


def listener_of(path: str) -> str:
    return "egress" if path == "egress" else "entrance"


async def _line(caplog, listener: str) -> dict:
    """The access log line of `listener`, once it is written (a stream's is written when it ends)."""
    async with asyncio.timeout(5):
        while not (lines := access_lines(caplog.records, listener)):
            await asyncio.sleep(0.01)
    [line] = lines
    return line


def _only(gw, listener: str, outcome: str, code: str = "2xx") -> None:
    assert request_counts(gw, listener) == {("peer", "read-pods", code, outcome): 1.0}


async def _ended_as(caplog, gw, path: str, code: int, outcome: str) -> None:
    """The one request of `path` on `gw` is one access log line and one count, with `code` and `outcome`."""
    line = await _line(caplog, listener_of(path))
    assert (line["code"], line["outcome"], line["peer"], line["capabilities"]) == (code, outcome, "peer",
                                                                                    "read-pods")
    _only(gw, listener_of(path), outcome, f"{code // 100}xx")


@pytest.fixture
def access(caplog):
    caplog.set_level(logging.INFO, logger="gateway.access")
    return caplog


@pytest.mark.parametrize("path", PATHS)
async def test_a_watch_its_client_ends_is_client_closed_with_the_code_the_upstream_answered(
        path, gateway, pki, issuer_key, upstream, dex, handlers, session_for, access):
    upstream.watch_events, upstream.watch_interval = 10_000, 0.02
    async with through(path, gateway, pki, issuer_key, upstream, dex, handlers, session_for) as (gw, s, url, headers):
        resp = await s.get(url, headers=headers)
        assert resp.status == 200
        await resp.content.readline()
        resp.close()  # the consumer ends its watch
        await _ended_as(access, gw, path, 200, "client_closed")
        async with asyncio.timeout(2):
            await upstream.watch_closed.wait()  # and the upstream's stream was torn down with it
        if path == "egress":
            # The peer's entrance saw its client, the egress, go away: the same, there.
            entrance = await _line(access, "entrance")
            assert (entrance["code"], entrance["outcome"]) == (200, "client_closed")
            _only(gateway, "entrance", "client_closed")


@pytest.mark.parametrize("path", PATHS)
async def test_a_watch_the_upstream_ends_is_answered(path, gateway, pki, issuer_key, upstream, dex, handlers,
                                                     session_for, access):
    upstream.watch_events, upstream.watch_interval = 3, 0.01
    async with through(path, gateway, pki, issuer_key, upstream, dex, handlers, session_for) as (gw, s, url, headers):
        async with s.get(url, headers=headers) as resp:
            assert resp.status == 200 and len((await resp.read()).splitlines()) == 3
        await _ended_as(access, gw, path, 200, "answered")


@pytest.mark.parametrize("path", PATHS)
async def test_a_watch_the_gateway_withdraws_is_withdrawn(path, gateway, pki, issuer_key, upstream, dex, handlers,
                                                          session_for, access):
    upstream.watch_events, upstream.watch_interval = 10_000, 0.02
    async with through(path, gateway, pki, issuer_key, upstream, dex, handlers, session_for) as (gw, s, url, headers):
        async with s.get(url, headers=headers) as resp:
            assert resp.status == 200
            await resp.content.readline()
            gw.publish(withdrawn(gw.state.registry, "capability-closed"))
            with pytest.raises(aiohttp.ClientError):
                async with asyncio.timeout(2):
                    while await resp.content.readline():
                        pass
                    raise aiohttp.ServerDisconnectedError()
        await _ended_as(access, gw, path, 200, "withdrawn")


@pytest.mark.parametrize("path", PATHS)
async def test_a_watch_the_upstream_cuts_is_interrupted(path, gateway, pki, issuer_key, upstream, dex, handlers,
                                                        session_for, access):
    upstream.watch_events, upstream.watch_interval, upstream.watch_cut = 3, 0.01, True
    async with through(path, gateway, pki, issuer_key, upstream, dex, handlers, session_for) as (gw, s, url, headers):
        async with s.get(url, headers=headers) as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()  # never an answer that looks whole
        await _ended_as(access, gw, path, 200, "interrupted")
        assert gw.metrics.upstream_errors.labels(listener_of(path), "stream")._value.get() == 1


@pytest.mark.parametrize("path", PATHS)
async def test_a_request_abandoned_before_any_answer_is_client_closed_with_499(
        path, gateway, pki, issuer_key, upstream, dex, handlers, session_for, access):
    dex.gate = asyncio.Event()  # the peer's entrance waits for Dex: no answer comes until the client gives up
    try:
        async with through(path, gateway, pki, issuer_key, upstream, dex, handlers, session_for) as (
                gw, s, url, headers):
            request = asyncio.ensure_future(s.get(url, headers=headers))
            async with asyncio.timeout(5):
                while dex.calls == 0:
                    await asyncio.sleep(0.01)
            request.cancel()  # the client goes away
            with pytest.raises(asyncio.CancelledError):
                await request
            await _ended_as(access, gw, path, 499, "client_closed")
    finally:
        dex.gate.set()
