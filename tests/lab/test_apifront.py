"""The front of a real kube-apiserver (lab/apifront.py) passes every answer back as it came, and one side gone
mid-answer ends the other as a real proxy would: a client that left ends the front's reading without an error in
its log, and an upstream cut mid-answer reaches the client as a cut, never as a shorter answer that looks whole.

The upstream is a small TLS server here (the front adds nothing of kube-apiserver's, so any HTTP server shows what
it passes); real TLS on both of the front's sides, certificates from the lab's CA."""

from __future__ import annotations

import asyncio
import logging
import types

import aiohttp
import pytest
from aiohttp import web

from lab import certs
from lab.apifront import ApiFront

WHOLE = b'{"kind":"PodList","items":[]}'


class Upstream:
    """What the front passes on to: `/whole` answers at once; `/cut` declares 100 bytes and sends 10; `/watch`
    streams a first event, then each further one when `more` is set, and ends once `end` is set."""

    def __init__(self) -> None:
        self.more, self.end = asyncio.Event(), asyncio.Event()
        self.watch_gone = asyncio.Event()  # the front let go of the watch's upstream connection

    async def whole(self, request: web.Request) -> web.Response:
        return web.Response(body=WHOLE, content_type="application/json")

    async def cut(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": "100", "Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"kind":"P')
        await asyncio.sleep(0)
        assert request.transport is not None
        request.transport.abort()
        return response

    async def watch(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            await response.write(b'{"type":"ADDED"}\n')
            while not self.end.is_set():
                done, _ = await asyncio.wait([asyncio.ensure_future(self.more.wait()),
                                              asyncio.ensure_future(self.end.wait())],
                                             return_when=asyncio.FIRST_COMPLETED, timeout=30)
                for task in _:
                    task.cancel()
                if self.more.is_set():
                    self.more.clear()
                    await response.write(b'{"type":"MODIFIED"}\n')
            await response.write_eof()
        except ConnectionResetError:
            self.watch_gone.set()
        return response


@pytest.fixture
async def rig(tmp_path):
    ca = certs.CA("apifront-test")
    serving = certs.server_ssl_context(ca.issue_server([], ["127.0.0.1"]))
    upstream = Upstream()
    app = web.Application()
    app.router.add_get("/whole", upstream.whole)
    app.router.add_get("/cut", upstream.cut)
    app.router.add_get("/watch", upstream.watch)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=serving)
    await site.start()
    port = runner.addresses[0][1]
    api = types.SimpleNamespace(sa_issuer=types.SimpleNamespace())
    front = ApiFront(api, f"https://127.0.0.1:{port}", certs.client_ssl_context(ca.cert_pem),
                     certs.server_ssl_context(ca.issue_server([], ["127.0.0.1"])))
    await front.start()
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=certs.client_ssl_context(ca.cert_pem)))
    yield types.SimpleNamespace(front=front, upstream=upstream, session=session)
    upstream.end.set()
    await session.close()
    await front.stop()
    await runner.cleanup()


def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_whole_answer_is_passed_back_as_it_came(rig, caplog):
    async with rig.session.get(rig.front.url + "/whole") as response:
        assert response.status == 200 and await response.read() == WHOLE
        assert response.content_length == len(WHOLE) and response.content_type == "application/json"
    assert rig.front.passed_answers == 1 and errors(caplog) == []


async def test_an_answer_its_upstream_cut_reaches_the_client_as_a_cut(rig, caplog):
    async with rig.session.get(rig.front.url + "/cut") as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
    assert errors(caplog) == []


async def test_a_watch_whose_client_left_ends_without_an_error_and_lets_its_upstream_go(rig, caplog):
    async with rig.session.get(rig.front.url + "/watch") as response:
        assert await response.content.readline() == b'{"type":"ADDED"}\n'
        rig.upstream.more.set()
        assert await response.content.readline() == b'{"type":"MODIFIED"}\n'
        response.close()
    # The client left mid-stream; the next event the upstream sends finds the front's client gone, and the front lets go of it.
    for _ in range(200):
        if rig.upstream.watch_gone.is_set():
            break
        rig.upstream.more.set()
        await asyncio.sleep(0.05)
    assert rig.upstream.watch_gone.is_set()
    assert errors(caplog) == []


async def test_a_watch_that_ends_after_its_client_left_ends_without_an_error(rig, caplog):
    async with rig.session.get(rig.front.url + "/watch") as response:
        assert await response.content.readline() == b'{"type":"ADDED"}\n'
        response.close()
    rig.upstream.end.set()  # the watch ends cleanly upstream while nobody reads it at the front any more
    for _ in range(200):
        if rig.front.passing == 0:
            break
        await asyncio.sleep(0.02)
    assert rig.front.passing == 0
    await rig.front.stop()  # every handler of the front has returned, and whatever it logged is in
    assert errors(caplog) == []
