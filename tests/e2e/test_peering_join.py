"""Two lab clusters, each with the real `peering run` process: invite, join, and the refusals of a join."""

from __future__ import annotations

import pytest
import pytest_asyncio

from lab.testing import lab_clusters
from peering_lab import (clusterpeer, connection_string, create_invite, create_join, fast_peering_command,
                                   ready, ready_message, until, until_equal)

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lab(tmp_path_factory):
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["a", "b"], peering_command=fast_peering_command) as lab:
        yield lab


async def test_invite_then_join_is_active_and_ready_on_both_sides(lab):
    a, b = lab["a"], lab["b"]
    create_invite(a, "to-b", tokenTTL="1h")
    text = await connection_string(a, "to-b")
    create_join(b, "to-a", text)
    await until_equal(lambda: (*ready(clusterpeer(b, "to-a")), ready_message(clusterpeer(b, "to-a"))),
                      ("Active", "True", "PeeringReady", "the peering works"), timeout=20)
    await until_equal(lambda: (*ready(clusterpeer(a, "to-b")), ready_message(clusterpeer(a, "to-b"))),
                      ("Active", "True", "PeeringReady", "the peering works"), timeout=20)
    a_status, b_status = clusterpeer(a, "to-b")["status"], clusterpeer(b, "to-a")["status"]
    assert a_status["invite"]["used"] is True
    assert a_status["peer"]["alias"] == "to-a" and b_status["peer"]["alias"] == "to-b"
    assert a_status["peer"]["clusterUUID"] == b.info()["uuid"]
    assert b_status["peer"]["clusterUUID"] == a.info()["uuid"]
