"""The pair of backends: one real control plane for the whole folder (started once, outside any event loop: it is
only processes) and one emulator per test module, both with the same PKI, so that one client certificate is the
same user on both, and the same CRDs: the module's (with `x-kubernetes-sensitive-data` taken out for the real
one, which a stock kube-apiserver refuses) and the lab's Project and TokenExchangeProvider.

Without the built binaries the folder skips loudly (`PEERING_REQUIRE_REAL_APISERVER=1`: fails)."""

from __future__ import annotations

import asyncio
import pathlib

import pytest
import pytest_asyncio
from differential_support import Backend, Pair, opened

from lab import certs
from lab.apiserver.app import ApiServer
from lab.real import RealControlPlane
from lab.real import build as builder

ROOT = pathlib.Path(__file__).resolve().parents[3]
CHART_CRDS = ROOT / "charts" / "peering" / "crds"
LAB_CRDS = ROOT / "lab" / "apiserver" / "crds"
# Deckhouse's (and the lab clusters') ServiceAccount issuer: the same on both, so token answers compare.
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


@pytest.fixture(scope="session")
def shared_pki() -> certs.ClusterPKI:
    return certs.cluster_pki("a")


@pytest.fixture(scope="session")
def real_plane(shared_pki, tmp_path_factory):
    try:
        binaries = builder.require_built()
    except builder.BuildError as e:
        if builder.required():
            pytest.fail(f"{builder.REQUIRE_ENV} is set, so the real backend must run: {e}", pytrace=False)
        pytest.skip(f"REAL KUBE-APISERVER BACKEND NOT TESTED: {e}")
    plane = RealControlPlane("a", tmp_path_factory.mktemp("differential-real"), pki=shared_pki, binaries=binaries)

    async def start() -> None:
        await plane.start()
        try:
            await plane.install_crds([CHART_CRDS, LAB_CRDS])
        except BaseException:
            await plane.stop()
            raise

    asyncio.run(start())
    yield plane
    asyncio.run(plane.stop())


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def emulator(shared_pki):
    server = ApiServer(name="a", crd_paths=[CHART_CRDS], serving_cert_pem=shared_pki.api.cert_pem,
                       serving_key_pem=shared_pki.api.key_pem, client_ca_pem=shared_pki.client_ca.cert_pem,
                       issuer_url=SERVICE_ACCOUNT_ISSUER)
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.stop()


# Cluster-scoped custom resources: each test module starts with none of them on the real backend either (its
# emulator is new), so that what a module lists is what it made.
CLUSTER_SCOPED = ("/apis/peering.deckhouse.io/v1alpha1/clusterpeers",
                  "/apis/peering.deckhouse.io/v1alpha1/peeringcapabilities",
                  "/apis/deckhouse.io/v1alpha1/tokenexchangeproviders", "/apis/deckhouse.io/v1alpha3/projects")


async def _clear(real: Backend, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    for path in CLUSTER_SCOPED:
        while True:
            listed = await real.call("GET", path)
            assert listed.status == 200, listed
            if not listed.body["items"]:
                break
            for obj in listed.body["items"]:
                if obj["metadata"].get("finalizers"):
                    await real.call("PATCH", f"{path}/{obj['metadata']['name']}", body={
                        "metadata": {"finalizers": None}}, content_type="application/merge-patch+json")
            await real.call("DELETE", path)
            assert asyncio.get_running_loop().time() < deadline, f"{path} still lists {listed.body['items']}"
            await asyncio.sleep(0.05)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pair(emulator, real_plane, shared_pki):
    user_certs: dict = {}
    emu = Backend("emulator", emulator.url, shared_pki, user_certs)
    real = Backend("real", real_plane.url, shared_pki, user_certs)
    async with opened(emu, real):
        await _clear(real)
        yield Pair(emu, real)
