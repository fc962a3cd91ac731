"""Fixtures for the emulated kube-apiserver: a started server with the module's CRDs, a kubernetes-asyncio client
and a kubectl runner, all talking real TLS to 127.0.0.1 with client certificates.

The helpers themselves live in lab/apiserver/testing.py so that other test folders can import them."""

from __future__ import annotations

import asyncio
import os
import pathlib
from dataclasses import dataclass

import pytest
from kubernetes_asyncio import client, config

from lab.apiserver.app import ApiServer
from lab.apiserver.testing import issue_client_cert, start_test_apiserver, write_kubeconfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART_CRDS = ROOT / "charts" / "peering" / "crds"
KUBECTL = ROOT / ".venv" / "bin" / "kubectl"


@dataclass
class Lab:
    server: ApiServer
    kubeconfig: pathlib.Path
    ca_pem: bytes
    tmp_path: pathlib.Path

    def user_kubeconfig(self, user: str, groups=()) -> pathlib.Path:
        """A kubeconfig of another user, authenticated by a client certificate from the same CA."""
        cert, key = issue_client_cert(self.server, user, groups)
        return write_kubeconfig(self.tmp_path / f"kubeconfig-{user}", self.server.url, self.ca_pem, cert, key)

    async def kubectl(self, *args: str, kubeconfig: pathlib.Path | None = None, stdin: str | None = None,
                      timeout: float = 30) -> tuple[int, str, str]:
        """Run kubectl against the lab server; returns (exit code, stdout, stderr)."""
        env = dict(os.environ, HOME=str(self.tmp_path), KUBECONFIG=str(kubeconfig or self.kubeconfig))
        proc = await asyncio.create_subprocess_exec(
            str(KUBECTL), "--cache-dir", str(self.tmp_path / "kube-cache"), *args, env=env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        return proc.returncode, out.decode(), err.decode()

    async def client(self, kubeconfig: pathlib.Path | None = None) -> client.ApiClient:
        cfg = client.Configuration()
        await config.load_kube_config(config_file=str(kubeconfig or self.kubeconfig), client_configuration=cfg)
        return client.ApiClient(cfg)


@pytest.fixture
async def lab(tmp_path) -> Lab:
    """A started emulated kube-apiserver with the module's CRDs; bookmarks every 0.2 s to keep tests quick."""
    server, kubeconfig, _cert, _key, ca_pem = await start_test_apiserver(
        tmp_path, crd_paths=[CHART_CRDS], bookmark_interval=0.2, history=50)
    try:
        yield Lab(server, kubeconfig, ca_pem, tmp_path)
    finally:
        await server.stop()


@pytest.fixture
async def api(lab: Lab) -> client.ApiClient:
    """A kubernetes-asyncio client of the lab's admin (system:masters)."""
    async with await lab.client() as api_client:
        yield api_client
