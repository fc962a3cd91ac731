"""Lab clusters for tests: in-process (`lab_clusters`) or as background processes (`lab_processes`).

In-process, for tests that reach into the emulator or Dex directly:

    async with lab_clusters(tmp_path, ["a", "b"]) as lab:
        lab["a"].api.list("", "namespaces")
        lab["a"].dex.exchange_calls

As processes, exactly as `python -m lab up` runs them, for tests that use kubectl or want the real process tree:

    with lab_processes(tmp_path, ["a", "b"]) as lab:
        lab.kubectl("a", "get", "namespaces")

Each takes `apiserver="real"` for clusters on a real kube-apiserver (lab/real/; `cluster.api` is then
lab/real/api.py's, over HTTP). A fixture that runs its tests on both backends takes `params=apiserver_backends()`
and passes `request.param` on: its tests are marked `emulator` and `real` and named `[emulator]` and `[real]`.

or through the pytest fixture factories, at module level:

    lab = lab_process_fixture(["a", "b"])        # processes, one lab for the module's tests
    lab_a = lab_fixture(["a"])                     # in-process, one lab per test

    def test_x(lab): ...
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import ssl
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterable, Iterator

from lab.cluster import (APISERVERS, LAB_CRDS, READY_TIMEOUT, ROOT, Lab, PeeringCommand, check_apiserver,
                         crd_documents, default_peering_command)

KUBECTL = str(pathlib.Path(sys.executable).with_name("kubectl"))


@contextlib.asynccontextmanager
async def lab_clusters(dir: pathlib.Path, names: list[str], *,
                       peering_command: PeeringCommand | None = default_peering_command,
                       ready_timeout: float = READY_TIMEOUT, without_crds=(),
                       apiserver: str = "emulator", api_front: bool = False,
                       replicas: int = 1, keep_planes: bool = True) -> AsyncIterator[Lab]:
    """Started clusters in this event loop; all stopped on exit, also when the body fails.

    replicas: peering processes per cluster (`cluster.replicas`), behind its ingress and passthroughs.
    without_crds: CRD names every cluster starts without, or {cluster: names} (see `Lab`).
    apiserver: "emulator" or "real" (see `apiserver_backends`); api_front: on the real backend, the peering
    processes reach kube-apiserver through lab/apifront.py, so that `api.sa_issuer.jwks` can be replaced.
    keep_planes: on the real backend, the clusters take control planes an earlier lab of this process left and
    leave theirs, emptied, to the next (lab/real/pool.py; PEERING_LAB_KEEP_PLANES=0 turns it off); False: planes
    of their own, stopped on exit."""
    planes = None
    if apiserver == "real":
        real_binaries_or_skip()
        if keep_planes:
            from lab.real import pool

            planes = pool.shared()
    lab = Lab(dir, names, peering_command=peering_command, ready_timeout=ready_timeout, without_crds=without_crds,
              apiserver=apiserver, api_front=api_front, replicas=replicas, planes=planes)
    await lab.start()
    try:
        yield lab
    finally:
        await lab.stop()


class RealApiserverAlone:
    """A real etcd + kube-apiserver + kube-controller-manager and nothing else (no Dex, no user-authn, no peering
    process), with the lab's CRDs (Project, TokenExchangeProvider) and `crd_paths`, shared by the tests of a
    module: `reset()` gives the next one what a new emulator gives it (lab/apiserver/testing.py
    `start_test_apiserver`), by deleting every object made since `baseline()` (a start takes 5 to 10 s here, a
    reset well under one). `api` is lab/real/api.py's `HttpApi`, whose calls (the emulator's in-process ones:
    `get`, `list`, `create`, `update`, `delete`, `watch`, `sa_issuer`, `url`, `port`) it offers as its own;
    `kubeconfig` is the admin's (client certificate), `plane` the `RealControlPlane`.

    Its processes are started and stopped with `asyncio.run` (`started()`), outside any test's event loop."""

    def __init__(self, dir: pathlib.Path, *, crd_paths: Iterable = (), name: str = "lab") -> None:
        from lab.real import RealControlPlane

        self.plane = RealControlPlane(name, pathlib.Path(dir) / "control-plane", binaries=real_binaries_or_skip())
        self.crd_paths = [*sorted(LAB_CRDS.glob("*.yaml")), *(pathlib.Path(p) for p in crd_paths)]
        self.api: Any = None
        self._baseline: Any = None

    @property
    def kubeconfig(self) -> pathlib.Path:
        return self.plane.admin_kubeconfig

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or self.__dict__.get("api") is None:
            raise AttributeError(name)
        return getattr(self.api, name)

    @contextlib.contextmanager
    def started(self) -> Iterator["RealApiserverAlone"]:
        from lab.real.api import HttpApi

        asyncio.run(self.plane.start(crds=self.crd_paths))
        self.api = HttpApi(self.plane.name, self.plane.admin_kubeconfig, crd_documents=crd_documents())
        try:
            yield self
        finally:
            self.api.close()
            asyncio.run(self.plane.stop())

    def baseline(self) -> None:
        """What exists now is what `reset()` keeps."""
        from lab.real.baseline import Baseline

        self._baseline = Baseline.of(self.api)

    async def reset(self, timeout: float = 60.0) -> None:
        """Delete every object made since `baseline()` (finalizers taken off first, namespaces emptied by
        kube-controller-manager) and return once they are all gone."""
        await self._baseline.reset(self.api, timeout)


@dataclass
class LabProcesses:
    """A running `python -m lab up` lab, as its lab.json describes it."""

    dir: pathlib.Path
    info: dict

    def cluster(self, name: str) -> dict:
        return self.info["clusters"][name]

    def kubeconfig(self, name: str) -> str:
        return self.cluster(name)["files"]["kubeconfig"]

    def resolve(self, name: str) -> dict[str, str]:
        return self.cluster(name)["resolve"]

    def ssl_context(self, name: str) -> ssl.SSLContext:
        """Trusts the public CA of cluster `name` (its API server, Dex and ingress)."""
        return ssl.create_default_context(cadata=self.cluster(name)["caBundles"]["public"])

    def kubectl(self, name: str, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run([KUBECTL, "--kubeconfig", self.kubeconfig(name), *args], capture_output=True,
                              text=True, check=check, timeout=timeout)


def lab_up(dir: pathlib.Path, names: list[str], *, peering: bool = True, timeout: float = 180,
           without_crds: list[str] = (), apiserver: str = "emulator", replicas: int = 1) -> LabProcesses:
    """`python -m lab up`; without_crds are --without-crd values (NAME, or CLUSTER:NAME); replicas: peering
    processes per cluster (--replicas)."""
    if apiserver == "real":
        real_binaries_or_skip()
    cmd = [sys.executable, "-m", "lab", "up", "--clusters", ",".join(names), "--dir", str(dir),
           "--timeout", str(timeout), "--apiserver", apiserver, "--replicas", str(replicas)]
    if not peering:
        cmd.append("--no-peering")
    cmd += [f"--without-crd={n}" for n in without_crds]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), timeout=timeout + 30)
    if done.returncode != 0:
        raise RuntimeError(f"python -m lab up failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return LabProcesses(pathlib.Path(dir), json.loads((pathlib.Path(dir) / "lab.json").read_text()))


def lab_down(dir: pathlib.Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab", "down", "--dir", str(dir)], capture_output=True, text=True,
                          cwd=str(ROOT), timeout=timeout + 30, check=True)


@contextlib.contextmanager
def lab_processes(dir: pathlib.Path, names: list[str], *, peering: bool = True,
                  without_crds: list[str] = (), apiserver: str = "emulator",
                  replicas: int = 1) -> Iterator[LabProcesses]:
    """`python -m lab up` on entry, `python -m lab down` on exit."""
    lab = lab_up(dir, names, peering=peering, without_crds=without_crds, apiserver=apiserver, replicas=replicas)
    try:
        yield lab
    finally:
        lab_down(dir)


def lab_process_fixture(names: list[str], *, scope: str = "module", peering: bool = True,
                        apiservers: tuple[str, ...] = ("emulator",)):
    """A pytest fixture giving a `LabProcesses` with clusters `names`, shared by the tests of its scope; with
    several `apiservers` (e.g. `APISERVERS`) it is parametrized by them (see `apiserver_backends`)."""
    import pytest

    @pytest.fixture(scope=scope, params=apiserver_backends(apiservers))
    def _lab(request, tmp_path_factory) -> Iterator[LabProcesses]:
        with lab_processes(tmp_path_factory.mktemp("lab"), names, peering=peering, apiserver=request.param) as lab:
            yield lab

    return _lab


def lab_fixture(names: list[str], *, peering_command: PeeringCommand | None = default_peering_command,
                apiservers: tuple[str, ...] = ("emulator",)):
    """A pytest fixture giving a started in-process `Lab` with clusters `names`, one per test; parametrized by
    `apiservers` as `lab_process_fixture`."""
    import pytest_asyncio

    @pytest_asyncio.fixture(params=apiserver_backends(apiservers))
    async def _lab(request, tmp_path) -> AsyncIterator[Lab]:
        async with lab_clusters(tmp_path, names, peering_command=peering_command, apiserver=request.param) as lab:
            yield lab

    return _lab


def apiserver_backends(apiservers: tuple[str, ...] = APISERVERS) -> list:
    """pytest params for a fixture run on each backend: marked `emulator` or `real`, so that `-m real` and
    `-m "not real"` select them; the fixture's `request.param` is the backend's name, its test ids `[emulator]`
    and `[real]`."""
    import pytest

    for name in apiservers:
        check_apiserver(name)
    return [pytest.param(name, id=name, marks=getattr(pytest.mark, name)) for name in apiservers]


def _built_or_skip(require, not_tested: str):
    import pytest

    from lab.real import build as builder

    try:
        return require()
    except builder.BuildError as e:
        if builder.required():
            pytest.fail(f"{builder.REQUIRE_ENV} is set, so the real components must run: {e}", pytrace=False)
        pytest.skip(f"{not_tested}: {e}")


def real_binaries_or_skip():
    """The real backend's binaries; without them a loud skip (`REAL KUBE-APISERVER BACKEND NOT TESTED: why`),
    or a failure when PEERING_REQUIRE_REAL_APISERVER=1 (CI)."""
    from lab.real import build as builder

    return _built_or_skip(builder.require_built, "REAL KUBE-APISERVER BACKEND NOT TESTED")


def upstream_dex_or_skip():
    """The built upstream `dex` binary; without it a loud skip (`UPSTREAM DEX NOT TESTED: why`), or a failure
    when PEERING_REQUIRE_REAL_APISERVER=1 (CI)."""
    from lab.real import build as builder

    return _built_or_skip(builder.require_dex, "UPSTREAM DEX NOT TESTED")


def promtool_or_skip(not_tested: str) -> str:
    """The built `promtool`; without it a loud skip (`<not_tested>: why`), or a failure when
    PEERING_REQUIRE_REAL_APISERVER=1 (CI)."""
    from lab.real import build as builder

    return str(_built_or_skip(builder.promtool, not_tested))
