"""`peering run` as a real process: it binds OS-chosen ports, reports them, becomes ready, and on SIGTERM or
SIGINT stops cleanly and releases its Lease."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import aiohttp
import yaml
import pytest

from tests.control.conftest import NAMESPACE, eventually

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_peering_run_serves_readyz_and_stops_on_a_signal(api, tmp_path, stop_signal):
    server, kubeconfig = api
    ports_file = tmp_path / "ports.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "control.cli", "run", "--kubeconfig", str(kubeconfig),
        "--public-domain-template", "%s.s.lab", "--bind-host", "127.0.0.1", "--entrance-port", "0",
        "--join-port", "0", "--egress-port", "0", "--ops-port", "0", "--ports-file", str(ports_file),
        "--identity", "replica-1", "--dex-url", "https://dex.s.lab", "--resolve", "dex.s.lab=127.0.0.1:9",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        await eventually(ports_file.exists, timeout=30, what="the ports file")
        ports = json.loads(ports_file.read_text())
        assert set(ports) == {"entrance", "join", "egress", "ops"} and all(p > 0 for p in ports.values())

        async with aiohttp.ClientSession() as http:
            async def ready():
                async with http.get(f"http://127.0.0.1:{ports['ops']}/readyz") as resp:
                    return resp.status == 200

            await eventually(ready, timeout=30, what="/readyz 200")
            async with http.get(f"http://127.0.0.1:{ports['ops']}/healthz") as resp:
                assert resp.status == 200
            # The control loop's metrics are served next to the gateway's.
            async with http.get(f"http://127.0.0.1:{ports['ops']}/metrics") as resp:
                metrics = await resp.text()
                assert 'peering_api_writes_total{resource="leases",verb="POST"} 1.0' in metrics, metrics[-2000:]
                assert 'peering_reconciles_total{outcome="ok",reconciler="certificates"}' in metrics
                assert "peering_gateway_requests_total" in metrics
            # The join listener is wired to the control loop's handlers: a refusal comes back as a Status.
            async with http.post(f"http://127.0.0.1:{ports['join']}/v1/join", json={"token": "x"}) as resp:
                body = await resp.json()
                assert resp.status >= 400 and body["kind"] == "Status" and body["reason"], body

        lease = server.get("coordination.k8s.io", "leases", "peering", NAMESPACE)
        assert lease["spec"]["holderIdentity"] == "replica-1"
        assert server.get("", "secrets", "peering-ca", NAMESPACE) is not None

        proc.send_signal(stop_signal)
        await asyncio.wait_for(proc.wait(), 20)
        stderr = (await proc.stderr.read()).decode()
        assert proc.returncode == 0, stderr[-3000:]
        lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
        assert any(line["msg"] == "control loop stopped" for line in lines)
        assert len(lines) == len([x for x in stderr.splitlines() if x.strip()]), "every log line is JSON"
        assert "BEGIN" not in stderr and "PRIVATE KEY" not in stderr
        lease = server.get("coordination.k8s.io", "leases", "peering", NAMESPACE)
        assert "holderIdentity" not in lease["spec"], "the Lease is released on the way out"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_stop_while_starting_ends_the_process_at_once(api, tmp_path):
    """The API server takes connections and never answers (hung, or gone with the lab that ran it): a SIGTERM
    while `peering run` waits for its first reads ends it at once, not after the start's 30 s timeout."""
    _, kubeconfig = api
    held: list[asyncio.StreamWriter] = []
    connected = asyncio.Event()

    async def black_hole(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        connected.set()

    hole = await asyncio.start_server(black_hole, "127.0.0.1", 0)
    port = hole.sockets[0].getsockname()[1]
    config = yaml.safe_load(kubeconfig.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    hung = tmp_path / "hung-kubeconfig"
    hung.write_text(yaml.safe_dump(config))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "control.cli", "run", "--kubeconfig", str(hung),
        "--public-domain-template", "%s.s.lab", "--bind-host", "127.0.0.1", "--entrance-port", "0",
        "--join-port", "0", "--egress-port", "0", "--ops-port", "0", "--identity", "replica-1",
        "--dex-url", "https://dex.s.lab", "--resolve", "dex.s.lab=127.0.0.1:9",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        # Its first read has reached the API server: the process is starting, its signal handlers in place.
        await asyncio.wait_for(connected.wait(), 30)
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 10)
        stderr = (await proc.stderr.read()).decode()
        assert proc.returncode == 0, stderr[-3000:]
        lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
        assert any(line["msg"] == "stopped while starting" for line in lines), stderr[-3000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for writer in held:
            writer.close()
        hole.close()
        await hole.wait_closed()
