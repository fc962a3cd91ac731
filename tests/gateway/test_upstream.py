"""Quiet streams and pooled connections, as kube-apiserver treats them.

A watch on a resource nobody changes is silent for minutes (`kubectl get -w`): a client connected and waiting is
not idle, so neither gateway may cut it. kube-apiserver closes a keep-alive connection idle for 90 s: a pooled
connection is not used after a shorter idle time, and one the upstream closed anyway never costs a request, with
or without a body."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.gateway.support import gateway_config, load_certs, make_token, registry_for
from tests.gateway.test_egress import EGRESS, _egress_gateway
from tests.gateway.test_entrance import PODS
from gateway.server import Gateway
from tests.ports import closed_port

PATH = "/api/v1/namespaces/default/pods"


async def _quiet_watch(s, url, token, events):
    names = []
    async with s.get(url, headers={"Authorization": f"Bearer {token}"}) as resp:
        assert resp.status == 200
        async for line in resp.content:
            names.append(json.loads(line)["object"]["metadata"]["name"])
    assert names == [f"pod-{i}" for i in range(events)]


#: The idle timeout of these tests, and how long the upstream is silent between a watch's events (a resource
#: nobody changes): three times as long. The idle timeout also bounds the wait for an answer's first byte, which
#: on a loaded machine a first Dex exchange and TokenReview can take a good part of: a plain request first puts
#: both in their caches, so the watch's first byte comes at once.
IDLE, SILENT = 0.5, 1.5


async def _warm(s, url, token) -> None:
    async with s.get(url, headers={"Authorization": f"Bearer {token}"}) as resp:
        assert resp.status == 200


async def test_a_silent_watch_outlives_the_idle_timeout_on_the_entrance(
        pki, issuer_key, upstream, dex, handlers, session_for):
    gw = Gateway(gateway_config(pki, upstream, dex, idle_timeout=IDLE), handlers)
    await gw.start()
    try:
        load_certs(gw, pki)
        gw.publish(registry_for(pki, issuer_key))
        token = make_token(issuer_key)
        await _warm(session_for(gw), PODS, token)
        upstream.watch_events, upstream.watch_interval = 3, SILENT
        await _quiet_watch(session_for(gw), PODS + "?watch=1", token, 3)
    finally:
        await gw.stop()


async def test_a_silent_watch_outlives_the_idle_timeout_through_both_gateways(
        pki, issuer_key, upstream, dex, handlers, session_for):
    entrance = Gateway(gateway_config(pki, upstream, dex, idle_timeout=IDLE), handlers)
    await entrance.start()
    egress = None
    try:
        load_certs(entrance, pki)
        entrance.publish(registry_for(pki, issuer_key))
        egress = await _egress_gateway(pki, issuer_key, upstream, dex, handlers, entrance, idle_timeout=IDLE)
        token = make_token(issuer_key)
        await _warm(session_for(egress, None), EGRESS + "/peers/peer" + PATH, token)
        upstream.watch_events, upstream.watch_interval = 3, SILENT
        await _quiet_watch(session_for(egress, None), EGRESS + "/peers/peer" + PATH + "?watch=1", token, 3)
    finally:
        if egress is not None:
            await egress.stop()
        await entrance.stop()


async def test_a_pooled_connection_idle_past_the_reuse_limit_is_not_used(gateway, session_for, issuer_key,
                                                                        upstream):
    s = session_for(gateway)
    token = make_token(issuer_key)
    async with s.get(PODS, headers={"Authorization": f"Bearer {token}"}) as resp:
        assert resp.status == 200
    pool = gateway.state.relay_pool
    assert len(pool.idle) == 1
    stale = pool.idle[0]
    stale.idle_since -= pool.reuse_idle + 1  # as if it had been idle past the limit
    async with s.get(PODS, headers={"Authorization": f"Bearer {token}"}) as resp:
        assert resp.status == 200
    assert stale.transport is None or stale.transport.is_closing()
    assert pool.idle and pool.idle[0] is not stale


class Cutter:
    """A TCP relay in front of the API server stand-in that can drop a connection the moment the gateway writes
    into it, before any byte reaches the upstream: exactly what a request sent into the upstream's idle close
    meets (the FIN and the request cross on the wire)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.cut_next = False
        self.cuts = 0
        self.connections = 0
        self.server: asyncio.AbstractServer | None = None
        self.tasks: set[asyncio.Task] = set()
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers.update((writer, up_writer))

        async def pump(src, dst, from_client):
            try:
                while data := await src.read(65536):
                    if from_client and self.cut_next:
                        self.cut_next = False
                        self.cuts += 1
                        writer.transport.abort()
                        up_writer.transport.abort()
                        return
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        both = [asyncio.ensure_future(pump(reader, up_writer, True)),
                asyncio.ensure_future(pump(up_reader, writer, False))]
        self.tasks.update(both)
        await asyncio.gather(*both, return_exceptions=True)
        self.tasks.difference_update(both)

    async def stop(self) -> None:
        for w in self.writers:
            w.transport.abort()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture
async def cut_gateway(pki, issuer_key, upstream, dex, handlers):
    cutter = Cutter(upstream.port)
    port = await cutter.start()
    cfg = gateway_config(pki, upstream, dex)
    cfg.resolve["api.x.lab"] = f"127.0.0.1:{port}"
    gw = Gateway(cfg, handlers)
    await gw.start()
    load_certs(gw, pki)
    gw.publish(registry_for(pki, issuer_key))
    try:
        yield gw, cutter
    finally:
        await gw.stop()
        await cutter.stop()


@pytest.mark.parametrize("method", ["POST", "PUT", "GET"])
async def test_a_request_sent_into_a_pooled_connection_the_upstream_closes_is_sent_again(
        cut_gateway, session_for, issuer_key, upstream, method):
    """With a body (a large one) and without: the request reaches the upstream once, whole."""
    gw, cutter = cut_gateway
    s = session_for(gw)
    headers = {"Authorization": f"Bearer {make_token(issuer_key)}", "Content-Type": "application/json"}
    body = json.dumps({"kind": "ConfigMap", "data": {"k": "v" * 70_000}}).encode() if method != "GET" else None
    async with s.request(method, PODS, data=body, headers=headers) as resp:
        assert resp.status == 200
    cutter.cut_next = True
    before = len(upstream.requests)
    async with s.request(method, PODS, data=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        echoed = await resp.json()
    assert cutter.cuts == 1 and cutter.connections == 2
    assert len(upstream.requests) == before + 1
    assert echoed["seen"]["length"] == len(body or b"")


async def test_a_body_request_on_a_fresh_connection_that_fails_is_not_sent_twice(
        gateway, session_for, issuer_key, upstream):
    """Only a pooled connection's failure is retried: on a fresh one the upstream really failed."""
    s = session_for(gateway)
    upstream.fail_next = 1
    async with s.post(PODS, data=b"{}", headers={"Authorization": f"Bearer {make_token(issuer_key)}",
                                                 "Content-Type": "application/json"}) as resp:
        assert resp.status == 502
    assert upstream.fail_next == 0



async def test_a_connection_refused_at_once_is_tried_once_more(gateway, session_for, issuer_key, monkeypatch):
    """Behind a Service, a replica just gone is still listed for a moment and refuses the connection: the next
    connection may reach a live one, so a refused or reset connect is tried once more."""

    dead = closed_port()
    resolver = gateway.state.resolver
    real, tried = resolver.resolve, []

    async def first_one_gone(host, *args, **kwargs):
        answer = await real(host, *args, **kwargs)
        if host == "api.x.lab":
            tried.append(host)
            if len(tried) == 1:
                return [{**answer[0], "port": dead}]
        return answer

    monkeypatch.setattr(resolver, "resolve", first_one_gone)
    async with session_for(gateway).get(PODS, headers={"Authorization": f"Bearer {make_token(issuer_key)}"}) as resp:
        assert resp.status == 200 and len(tried) == 2
