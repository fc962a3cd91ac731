"""Several replicas behind one Service: the ingress and the TCP passthrough spread connections round robin across
their backends and skip one that refuses; `--replicas` and `replicas=` are checked; `python -m lab up --replicas 2`
runs two real peering processes per cluster, each with its own identity, ports and log."""

from __future__ import annotations

import asyncio
import json
import pathlib
import socket
import struct
import time

import aiohttp
import pytest
from aiohttp import web

from lab import certs
from lab.__main__ import main as lab_main
from lab.cluster import LabCluster
from lab.ingress import Backends, Ingress, TcpPassthrough
from lab.testing import lab_processes
from tests.ports import closed_port


@pytest.fixture(scope="module")
def pki() -> certs.ClusterPKI:
    return certs.cluster_pki("r")


async def _named_backends(names, ssl_context=None):
    """HTTP(S) servers on loopback that answer their own name."""
    runners = []
    for name in names:
        async def hello(request: web.Request, name=name) -> web.Response:
            return web.Response(text=name)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", hello)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
        runners.append(runner)
    return runners


def test_backends_take_turns_and_give_every_port_once():
    b = Backends([1, 2, 3])
    assert [b.order() for _ in range(4)] == [[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 2, 3]]
    b.set([])
    assert b.order() == []


async def test_ingress_spreads_requests_and_skips_a_backend_that_refuses(pki):
    runners = await _named_backends(["r0", "r1"])
    ingress = Ingress("peering.r.lab", certs.server_ssl_context(pki.ingress))
    await ingress.start()
    ctx = certs.client_ssl_context(pki.public_ca.cert_pem)
    url = f"https://127.0.0.1:{ingress.port}/v1/join"
    ports = [r.addresses[0][1] for r in runners]
    try:
        async with aiohttp.ClientSession() as http:
            async def ask() -> tuple[int, str]:
                async with http.post(url, data=b"{}", ssl=ctx, server_hostname="peering.r.lab") as r:
                    return r.status, await r.text()

            assert (await ask())[0] == 503
            ingress.set_backends(ports)
            assert [await ask() for _ in range(4)] == [(200, "r0"), (200, "r1"), (200, "r0"), (200, "r1")]
            # r0 goes away without leaving the endpoints (a crash): every request is still answered, by r1.
            await runners[0].cleanup()
            assert [await ask() for _ in range(4)] == [(200, "r1")] * 4
            assert ingress.backends.served == {ports[0]: 2, ports[1]: 6}
            # No backend accepts: 502, named as such.
            ingress.set_backends([closed_port()])
            status, text = await ask()
            assert status == 502 and "no backend accepted" in text
    finally:
        await ingress.stop()
        for r in runners:
            await r.cleanup()


async def test_passthrough_spreads_connections_and_skips_a_target_that_refuses(pki):
    server_cert = pki.public_ca.issue_server(["peering-gateway.r.lab"])
    runners = await _named_backends(["e0", "e1"], certs.server_ssl_context(server_cert))
    lb = TcpPassthrough("entrance")
    await lb.start()
    ctx = certs.client_ssl_context(pki.public_ca.cert_pem)
    ports = [r.addresses[0][1] for r in runners]
    try:
        # A new connection per request, as a client with no pooling makes them: each one is spread.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
            async def ask() -> str:
                async with http.get(f"https://127.0.0.1:{lb.port}/", ssl=ctx,
                                    server_hostname="peering-gateway.r.lab") as r:
                    return await r.text()

            lb.set_targets([closed_port(), *ports])
            # The refusing target is skipped: its turns go to the next one in the ring (e0).
            assert [await ask() for _ in range(6)] == ["e0", "e0", "e1"] * 2
            await runners[1].cleanup()
            assert [await ask() for _ in range(3)] == ["e0"] * 3
            # No endpoints: the connection is closed at once, before any byte.
            lb.set_targets([])
            reader, writer = await asyncio.open_connection("127.0.0.1", lb.port)
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
            await writer.wait_closed()
    finally:
        await lb.stop()
        for r in runners:
            await r.cleanup()


async def test_passthrough_passes_a_reset_of_a_dying_backend_on_at_once():
    """A backend that dies with a request unanswered resets its connection: the client behind the passthrough learns
    it at once instead of waiting for an answer that cannot come (the half-close bound is 30 s)."""
    got = asyncio.Event()

    async def dying(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(10)
        got.set()
        sock = writer.get_extra_info("socket")
        # Unread bytes and no linger: the kernel answers the close with a RST, as for a killed process.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    server = await asyncio.start_server(dying, "127.0.0.1", 0)
    lb = TcpPassthrough("entrance")
    await lb.start()
    lb.set_targets([server.sockets[0].getsockname()[1]])
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", lb.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        await asyncio.wait_for(got.wait(), 10)
        t0 = time.monotonic()
        try:
            data = await asyncio.wait_for(reader.read(), 10)
        except ConnectionResetError:
            data = b""
        assert data == b"" and time.monotonic() - t0 < 5
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionResetError:
            pass
    finally:
        await lb.stop()
        server.close()
        await server.wait_closed()


def test_replicas_out_of_range_are_refused_with_what_to_give(tmp_path, capsys):
    for bad in (0, 9, "2", True):
        with pytest.raises(ValueError, match="give a whole number of peering processes from 1 to 8"):
            LabCluster("a", tmp_path, replicas=bad)
    for bad in ("0", "two"):
        with pytest.raises(SystemExit) as exit:
            lab_main(["up", "--dir", str(tmp_path), "--replicas", bad])
        assert exit.value.code == 2
        assert f"--replicas {bad!r}: give a whole number of peering processes per cluster from 1 to 8" \
            in capsys.readouterr().err
    one, two = LabCluster("a", tmp_path), LabCluster("b", tmp_path, replicas=2)
    assert [(r.identity, r.log.name, r.ports_file.name) for r in one.replicas] == \
        [("lab-a", "peering.log", "ports.json")]
    assert [(r.identity, r.log.name, r.ports_file.name) for r in two.replicas] == \
        [("lab-b-0", "peering.log", "ports.json"), ("lab-b-1", "peering-1.log", "ports-1.json")]


@pytest.mark.slow
def test_lab_up_with_two_replicas_runs_two_peering_processes_with_their_own_identities(tmp_path):
    with lab_processes(tmp_path, ["a"], replicas=2) as lab:
        assert lab.info["replicas"] == 2
        peering = lab.cluster("a")["peering"]
        replicas = peering["replicas"]
        assert [r["identity"] for r in replicas] == ["lab-a-0", "lab-a-1"]
        assert all(r["state"] == "running" for r in replicas)
        assert len({r["pid"] for r in replicas}) == 2
        assert len({r["ports"]["entrance"] for r in replicas} | {r["ports"]["join"] for r in replicas}) == 4
        assert peering["pid"] == replicas[0]["pid"]
        # Both replicas compete for the one Lease (ready does not wait for it); exactly one of them holds it.
        deadline = time.monotonic() + 30
        while True:
            done = lab.kubectl("a", "get", "lease", "-n", "d8-peering", "peering", "-o", "json", check=False)
            holder = (json.loads(done.stdout or "{}").get("spec") or {}).get("holderIdentity")
            logs = [pathlib.Path(r["log"]).read_text() for r in replicas]
            if holder and any("became leader" in text for text in logs):
                break
            assert time.monotonic() < deadline, f"no Lease holder within 30s: {done.stderr}"
            time.sleep(0.2)  # bounded poll of another process's state
        assert holder in ("lab-a-0", "lab-a-1")
        assert all("control loop started" in text for text in logs)
        assert ["became leader" in text for text in logs] == [r["identity"] == holder for r in replicas], logs
        # Each log is its own process's: the identity it runs as is in its own log only.
        for r, text in zip(replicas, logs):
            assert r["identity"] in text
