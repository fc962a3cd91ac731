"""Fixtures of the control loop's runtime tests: an emulated API server with the module's CRDs, its namespace and
cluster UUID, and one API session to it (admin client certificate over real TLS)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import pathlib
from typing import Awaitable, Callable

import pytest

from control.kube import KubeSession
from lab.apiserver.testing import start_test_apiserver
from lab.testing import RealApiserverAlone, apiserver_backends


CRDS = pathlib.Path(__file__).resolve().parents[2] / "charts" / "peering" / "crds"
NAMESPACE = "d8-peering"
CLUSTER_UUID = "9b2f3a4e-0000-4000-8000-00000000000a"


def seed(server) -> None:
    """The module's namespace and the cluster UUID, on either backend (`server.create`)."""
    server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    server.create({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "d8-cluster-uuid", "namespace": "kube-system"},
                   "data": {"cluster-uuid": CLUSTER_UUID}})


async def start_api(tmp_path, **kwargs):
    server, kubeconfig, *_ = await start_test_apiserver(tmp_path, crd_paths=sorted(CRDS.glob("*.yaml")), **kwargs)
    seed(server)
    return server, kubeconfig


@pytest.fixture(scope="module", params=apiserver_backends())
def backend(request) -> str:
    """The backend of a module whose tests run on both (`[emulator]`, `[real]`): they ask for `real_apiserver`."""
    return request.param


@pytest.fixture(scope="module")
def real_apiserver(backend, tmp_path_factory):
    """One real kube-apiserver for the module's `[real]` tests, seeded as `start_api` seeds an emulator, each test
    starting from that (`await real_apiserver.reset()`); None for `[emulator]`."""
    if backend != "real":
        yield None
        return
    real = RealApiserverAlone(tmp_path_factory.mktemp("real-apiserver"), crd_paths=[CRDS])
    with real.started():
        seed(real.api)
        real.baseline()
        yield real


@contextlib.asynccontextmanager
async def on_backend(real_apiserver, tmp_path, **emulator):
    """(server, admin kubeconfig path) for an `api` fixture of a module on both backends: the module's real
    kube-apiserver brought back to what a new one holds, or a new emulator (`start_api(**emulator)`). Either
    `server` offers the emulator's in-process calls."""
    if real_apiserver is not None:
        await real_apiserver.reset()
        yield real_apiserver, real_apiserver.kubeconfig
        return
    server, kubeconfig = await start_api(tmp_path, **emulator)
    try:
        yield server, kubeconfig
    finally:
        await server.stop()


@pytest.fixture
async def api(tmp_path):
    """(server, kubeconfig path) of a fresh emulated cluster."""
    server, kubeconfig = await start_api(tmp_path)
    try:
        yield server, kubeconfig
    finally:
        await server.stop()


@pytest.fixture
async def kube(api):
    async with await KubeSession.connect(str(api[1])) as session:
        yield session


async def eventually(check: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0, what: str = "") -> None:
    """Poll `check` until it is true, at most `timeout` seconds (a bounded poll, not a fixed sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or check}")
        await asyncio.sleep(0.02)


class FakeClock:
    """A `control.clock.Clock` that moves only when told: both its wall time and its monotonic time."""

    def __init__(self, start: datetime.datetime | None = None) -> None:
        self._now = start or datetime.datetime.now(datetime.timezone.utc)
        self._monotonic = 1000.0

    def now(self) -> datetime.datetime:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        self._now += datetime.timedelta(seconds=seconds)
        self._monotonic += seconds
