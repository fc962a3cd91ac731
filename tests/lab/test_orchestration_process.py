"""How a lab cluster runs its peering process: ports file, readiness, wiring of the ingress and passthroughs, stop.

The process here is a small stand-in that keeps the contract of `peering run` the lab relies on (`--ports-file`,
`/readyz` on the ops port, a plain-HTTP join listener, SIGTERM to stop), so these tests pin the orchestration
whatever state the real process is in.
"""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
import pytest

from lab import certs
from lab.cluster import LabCluster, default_peering_command
from lab.testing import lab_clusters

FAKE_PEERING = r"""
import asyncio, json, signal, sys
from aiohttp import web

ports_file = sys.argv[sys.argv.index("--ports-file") + 1]

async def join(request):
    return web.json_response({"path": request.path, "xff": request.headers.get("X-Forwarded-For"),
                              "body": (await request.read()).decode()})

async def readyz(request):
    return web.Response(text="ok")

async def echo(reader, writer):
    writer.write(await reader.read(100))
    await writer.drain()
    writer.close()

async def main():
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    runners, ports = [], {}
    for name, route, handler in (("join", "/v1/join", join), ("ops", "/readyz", readyz)):
        app = web.Application()
        app.router.add_route("*", route, handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        ports[name] = runner.addresses[0][1]
    servers = []
    for name in ("entrance", "egress"):
        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        servers.append(server)
        ports[name] = server.sockets[0].getsockname()[1]
    with open(ports_file, "w") as f:
        json.dump(ports, f)
    print("fake peering listening", ports, flush=True)
    await stop.wait()
    print("fake peering stopping", flush=True)
    for r in runners:
        await r.cleanup()

asyncio.run(main())
"""


def fake_command(cluster: LabCluster) -> list[str]:
    real = default_peering_command(cluster) or []
    # Same flags as the real process gets; only the program differs.
    flags = real[real.index("run") + 1:] if "run" in real else ["--ports-file", str(cluster.path("ports.json"))]
    return [sys.executable, "-c", FAKE_PEERING, *flags]


def failing_command(cluster: LabCluster) -> list[str]:
    return [sys.executable, "-c", "import sys; print('cannot start: bad flag', file=sys.stderr); sys.exit(3)"]


async def test_peering_process_is_wired_behind_ingress_and_passthroughs(tmp_path):
    async with lab_clusters(tmp_path, ["a", "b"], peering_command=fake_command) as lab:
        a = lab["a"]
        assert a.peering_state == "running"
        assert set(a.ports) == {"entrance", "join", "egress", "ops"}
        info = json.loads((tmp_path / "lab.json").read_text())
        assert info["clusters"]["a"]["peering"]["ports"] == a.ports
        assert info["clusters"]["a"]["peering"]["pid"] == a.process.pid

        # The process got the lab's flags, including every cluster's public names and only its own egress.
        cmd = default_peering_command(a)
        resolved = {cmd[i + 1].split("=")[0] for i, x in enumerate(cmd) if x == "--resolve"}
        assert {"api.a.lab", "dex.a.lab", "peering.a.lab", "peering-gateway.a.lab", "peering-gateway.d8-peering.svc",
                "api.b.lab", "dex.b.lab", "peering.b.lab", "peering-gateway.b.lab"} == resolved
        egress = [cmd[i + 1] for i, x in enumerate(cmd) if x == "--resolve" and
                  cmd[i + 1].startswith("peering-gateway.d8-peering.svc=")]
        assert egress == [f"peering-gateway.d8-peering.svc=127.0.0.1:{a.egress_svc.port}"]
        assert cmd[cmd.index("--public-domain-template") + 1] == "%s.a.lab"
        assert cmd[cmd.index("--dex-url") + 1] == "https://dex.a.lab/"

        # peering.a.lab: TLS at the ingress, then the join listener, with the client's address forwarded.
        ctx = certs.client_ssl_context(a.pki.public_ca.cert_pem)
        async with aiohttp.ClientSession() as http:
            async with http.post(f"https://127.0.0.1:{a.ingress.port}/v1/join", data=b"hi", ssl=ctx,
                                 server_hostname="peering.a.lab") as r:
                assert r.status == 200
                assert await r.json() == {"path": "/v1/join", "xff": "127.0.0.1", "body": "hi"}

        # peering-gateway.a.lab and the egress Service reach the process's listeners byte for byte.
        for lb in (a.entrance_lb, a.egress_svc):
            reader, writer = await asyncio.open_connection("127.0.0.1", lb.port)
            writer.write(b"ping")
            await writer.drain()
            assert await asyncio.wait_for(reader.read(100), 5) == b"ping"
            writer.close()
            await writer.wait_closed()
        proc = a.process
    # Stopping the lab stopped the process with SIGTERM, and it shut down cleanly.
    assert proc.returncode == 0
    assert "fake peering stopping" in (tmp_path / "a" / "peering.log").read_text()


async def test_a_peering_process_that_dies_fails_the_start_with_its_log(tmp_path):
    with pytest.raises(RuntimeError) as e:
        async with lab_clusters(tmp_path, ["a"], peering_command=failing_command):
            pass
    assert "exited with 3" in str(e.value)
    assert "cannot start: bad flag" in str(e.value)


async def test_without_a_peering_command_the_cluster_says_so(tmp_path):
    async with lab_clusters(tmp_path, ["a"], peering_command=lambda c: None) as lab:
        assert lab["a"].peering_state.startswith("absent")
        info = json.loads((tmp_path / "lab.json").read_text())
        assert info["clusters"]["a"]["peering"]["state"].startswith("absent")
        # The ingress answers as ingress-nginx does for a Service without endpoints.
        ctx = certs.client_ssl_context(lab["a"].pki.public_ca.cert_pem)
        async with aiohttp.ClientSession() as http:
            async with http.post(f"https://127.0.0.1:{lab['a'].ingress.port}/v1/join", ssl=ctx,
                                 server_hostname="peering.a.lab") as r:
                assert r.status == 503


async def test_one_cluster_failing_stops_the_others_cleanly(tmp_path):
    """The clusters start together; one failing must not leave another starting or running."""
    seen: dict[str, LabCluster] = {}

    def command(cluster: LabCluster) -> list[str]:
        seen[cluster.name] = cluster
        return failing_command(cluster) if cluster.name == "b" else fake_command(cluster)

    with pytest.raises(RuntimeError, match="cluster b"):
        async with lab_clusters(tmp_path, ["a", "b"], peering_command=command):
            pass
    a = seen["a"]
    assert a.process is None and a.peering_state != "running"
    # Its API server is stopped too.
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", a.api.port)


async def test_extra_peering_flags_are_appended(tmp_path):
    from lab.__main__ import with_extra_args

    async with lab_clusters(tmp_path, ["a"], peering_command=None) as lab:
        cmd = with_extra_args(["--log-level=debug"])(lab["a"])
        assert cmd == default_peering_command(lab["a"]) + ["--log-level=debug"]


async def _until(predicate, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_a_start_cancelled_twice_still_reaps_the_peering_process(tmp_path):
    """A start cancelled while the process is coming up stops it; a second cancellation during that stop must not
    leave the child unreaped (it would outlive the lab and warn as an unclosed transport)."""
    slow_to_stop = ("import signal, sys, time\n"
                    "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.3), sys.exit(0)))\n"
                    "print('handler installed', flush=True)\n"
                    "time.sleep(60)\n")
    cluster = LabCluster("a", tmp_path, peering_command=lambda c: [sys.executable, "-c", slow_to_stop],
                         ready_timeout=60)
    start = asyncio.create_task(cluster.start())
    try:
        log = cluster.path("peering.log")
        await _until(lambda: cluster.process is not None and log.exists() and "handler installed" in log.read_text())
        proc = cluster.process
        start.cancel()
        await _until(lambda: cluster.process is None)  # the stop has begun: SIGTERM sent, waiting for the exit
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start
        assert proc.returncode == 0
    finally:
        await cluster.stop()


async def test_a_stop_during_the_start_fails_the_start_with_the_exit_not_a_crash(tmp_path):
    """Stopping the peering process while its start still polls for readiness ends the start with what happened to
    the process (it exited), not with an error about a missing attribute."""
    never_ready = "import time\nprint('up', flush=True)\ntime.sleep(60)\n"
    cluster = LabCluster("a", tmp_path, peering_command=lambda c: [sys.executable, "-c", never_ready],
                         ready_timeout=60)
    start = asyncio.create_task(cluster.start())
    try:
        log = cluster.path("peering.log")
        await _until(lambda: cluster.process is not None and log.exists() and "up" in log.read_text())
        await cluster.stop_peering()
        with pytest.raises(RuntimeError, match="the peering process exited with -15"):
            await start
    finally:
        await cluster.stop()
