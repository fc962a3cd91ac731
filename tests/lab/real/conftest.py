"""Fixtures of the real backend: the built binaries (or a loud skip), a loopback JWT issuer, and one control plane
per test module trusting that issuer as Deckhouse's kube-apiserver trusts Dex."""

from __future__ import annotations

import asyncio
import pathlib

import pytest
from real_support import LoopbackIssuer, binaries_or_skip

from lab.real import JWTIssuer, RealControlPlane


@pytest.fixture(scope="module")
def binaries():
    return binaries_or_skip()


@pytest.fixture(scope="module")
def issuer():
    iss = LoopbackIssuer()
    iss.start()
    yield iss
    iss.stop()


@pytest.fixture(scope="module")
def plane(binaries, issuer, tmp_path_factory):
    """A started control plane (started and stopped outside any test's event loop: it is only processes)."""
    cp = RealControlPlane("a", tmp_path_factory.mktemp("real-a"), binaries=binaries,
                          jwt_issuer=JWTIssuer(issuer.url, issuer.ca_pem), resolve={issuer.host: issuer.address})
    asyncio.run(cp.start())
    yield cp
    asyncio.run(cp.stop())


def pytest_collection_modifyitems(config, items):
    """The tests here that run a real kube-apiserver (all but test_real_parts.py, which needs no binaries) are
    marked `real`, so that `-m real` and `-m "not real"` select them."""
    here = pathlib.Path(__file__).parent
    for item in items:
        path = pathlib.Path(str(item.fspath))
        if here in path.parents and path.name != "test_real_parts.py":
            item.add_marker(pytest.mark.real)
