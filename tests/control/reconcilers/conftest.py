"""The reconcilers' tests that talk to an API server run on both backends (`[emulator]`, `[real]`): their `api` is,
for each test, a new emulator, or the module's real kube-apiserver brought back to what a new one holds: the
module's CRDs, its namespace and the cluster UUID (tests/control/conftest.py `real_apiserver`). `kube`
(tests/control/conftest.py) is an API session to it."""

from __future__ import annotations

import pytest

from tests.control.conftest import on_backend


@pytest.fixture
async def api(backend, real_apiserver, tmp_path):
    async with on_backend(real_apiserver, tmp_path) as started:
        yield started
