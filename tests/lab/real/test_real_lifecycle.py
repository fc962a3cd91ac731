"""Starting and stopping the real control plane: port clashes, restarts, failures, and a lab process that dies."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from lab.real import RealControlPlane, StartError
from lab.real import runner as runner_module

ROOT = pathlib.Path(__file__).resolve().parents[3]


def alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


async def gone(pids, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            pytest.fail(f"processes still running after {timeout:.0f} s: {[p for p in pids if alive(p)]}")
        await asyncio.sleep(0.05)


async def test_a_port_taken_meanwhile_is_retried_with_new_ones(binaries, tmp_path, monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        real_free_port = runner_module.free_port
        handed = []

        def free_port():
            # The first port handed out (etcd's client port) is one another process holds by then.
            port = taken if not handed else real_free_port()
            handed.append(port)
            return port
        monkeypatch.setattr(runner_module, "free_port", free_port)
        plane = RealControlPlane("p", tmp_path, binaries=binaries)
        await plane.start()
        try:
            assert plane.ports["etcd"] != taken
            assert "address already in use" in plane.files.log("etcd").read_text()
        finally:
            await plane.stop()


async def test_a_restart_keeps_the_objects_and_the_service_account_key(binaries, tmp_path):
    plane = RealControlPlane("r", tmp_path, binaries=binaries)
    await plane.start()
    try:
        await plane.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kept"}},
                           {"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": "robot", "namespace": "kept"}}])
        token = await plane.service_account_token("kept", "robot", seconds=600)
        pids = list(plane.pids().values())
    finally:
        await plane.stop()
    assert not any(alive(p) for p in pids)
    assert not plane.files.pids.exists()

    await plane.start()
    try:
        async with plane.session() as s:
            async with s.get("/api/v1/namespaces/kept") as r:
                assert r.status == 200
            review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
            async with s.post("/apis/authentication.k8s.io/v1/tokenreviews", json=review) as r:
                assert (await r.json())["status"]["user"]["username"] == "system:serviceaccount:kept:robot"
    finally:
        await plane.stop()


async def test_a_failing_start_quotes_the_log_and_leaves_nothing_running(binaries, tmp_path):
    broken = dataclasses.replace(binaries, kube_apiserver=pathlib.Path("/bin/false"))
    plane = RealControlPlane("f", tmp_path, binaries=broken)
    started = []
    original = plane._spawn

    def spawn(name, argv):
        proc = original(name, argv)
        started.append(proc.pid)
        return proc
    plane._spawn = spawn
    with pytest.raises(StartError, match=r"kube-apiserver exited with code 1 while starting; the end of .*"
                                         r"kube-apiserver\.log"):
        await plane.start()
    assert len(started) == 2  # etcd, then the kube-apiserver that failed
    await gone(started)


async def test_the_processes_end_with_the_lab_process_that_started_them(binaries, tmp_path):
    script = (
        "import asyncio, sys, pathlib\n"
        "from lab.real import RealControlPlane\n"
        "async def main():\n"
        "    cp = RealControlPlane('k', sys.argv[1])\n"
        "    await cp.start()\n"
        "    print('up', flush=True)\n"
        "    await asyncio.Event().wait()\n"
        "asyncio.run(main())\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                          env=env, cwd=ROOT) as lab_process:
        try:
            line = await asyncio.wait_for(asyncio.to_thread(lab_process.stdout.readline), 60)
            assert line == "up\n", line
            pids = list(json.loads((tmp_path / "control-plane.json").read_text())["pids"].values())
            assert len(pids) == 3 and all(alive(p) for p in pids)
        finally:
            lab_process.send_signal(signal.SIGKILL)
            lab_process.wait()
    await gone(pids)
