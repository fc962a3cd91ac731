"""Access is announced only when it works (issue 15 item 4): in a fresh peering, a module's controller that
starts the moment status.access shows its audience (and, on the inviter, status.grants the project) is never
refused, on either side, by a gateway whose registry has not caught up yet (gateway/catchup.py). Twenty fresh
peerings between the same two lab clusters, each consumer polling its ClusterPeer every few milliseconds."""

from __future__ import annotations

import asyncio
import ssl
import time

import aiohttp
import pytest
import pytest_asyncio

from control.rules.access import audience
from gateway.resolve import OverrideResolver
from lab.testing import lab_clusters
from peering_lab import (GROUP, clusterpeer, connection_string, create_capability, create_invite, create_join,
                         create_project_with_prices, fast_peering_command, until)

pytestmark = pytest.mark.asyncio(loop_scope="module")

CAP = "configmaps-reader"
PROJECT = "shop"
ROUNDS = 20
EGRESS = "peering-gateway.d8-peering.svc"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lab(tmp_path_factory):
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["a", "b"], peering_command=fast_peering_command) as lab:
        for cluster in (lab["a"], lab["b"]):
            create_capability(cluster, CAP)
            create_project_with_prices(cluster, PROJECT)
        yield lab


def _status(cluster, name: str) -> dict:
    return (clusterpeer(cluster, name) or {}).get("status") or {}


def _announced(cluster, name: str) -> dict | None:
    """status.access once it shows the capability's audience and status.grants pairs the project, else None."""
    status = _status(cluster, name)
    access = status.get("access") or {}
    if not any(a.get("capability") == CAP for a in access.get("audiences") or []):
        return None
    grants = status.get("grants") or []
    if not any(g.get("capability") == CAP and PROJECT in (g.get("namespaces") or []) for g in grants):
        return None
    return access


async def _consumer(here, name: str, there) -> tuple[int, str, float]:
    """A module's controller on `here`: it waits (polling every 5 ms) for status.access of ClusterPeer `name` to
    show the capability, then at once reads the peer's ConfigMap through both gateways. Its answer's code, its
    reason, and how long after the announcement it came."""
    access = None
    deadline = time.monotonic() + 60
    while access is None:
        assert time.monotonic() < deadline, f"status.access of {here.name}'s {name} never showed {CAP}"
        access = _announced(here, name)
        if access is None:
            await asyncio.sleep(0.005)
    seen = time.monotonic()
    sa = here.api.get("", "serviceaccounts", "app", "consumer")
    token, _ = here.api.sa_issuer.issue("consumer", "app", sa["metadata"]["uid"],
                                        [audience(there.info()["uuid"], CAP)], 600)
    resolver = OverrideResolver({EGRESS: here.resolve_map()[EGRESS]})
    try:
        ctx = ssl.create_default_context(cadata=access["caBundle"])
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=resolver, ssl=ctx)) as http:
            async with http.get(f"{access['endpoint']}/api/v1/namespaces/{PROJECT}/configmaps/prices",
                                headers={"Authorization": f"Bearer {token}"}) as resp:
                body = await resp.json(content_type=None)
    finally:
        await resolver.close()
    reason = body.get("reason", "") if resp.status != 200 else body["data"]["cluster"]
    return resp.status, reason, time.monotonic() - seen


async def _gone(cluster, name: str) -> None:
    cluster.api.delete(GROUP, "clusterpeers", name)
    await until(lambda: clusterpeer(cluster, name) is None, timeout=30, what=f"{cluster.name}'s {name} deleted")


async def test_a_consumer_starting_when_access_is_announced_is_never_refused(lab):
    a, b = lab["a"], lab["b"]
    answers = []
    for n in range(ROUNDS):
        invite, join = f"to-b-{n}", f"to-a-{n}"
        # Both administrators open the capability in the ClusterPeer they create: a fresh peering, all at once.
        a.api.create({"apiVersion": f"{GROUP}/v1alpha1", "kind": "ClusterPeer", "metadata": {"name": invite},
                      "spec": {"type": "Invite", "capabilities": [CAP]}})
        consumers = [asyncio.ensure_future(_consumer(a, invite, b)), asyncio.ensure_future(_consumer(b, join, a))]
        b.api.create({"apiVersion": f"{GROUP}/v1alpha1", "kind": "ClusterPeer", "metadata": {"name": join},
                      "spec": {"type": "Join", "capabilities": [CAP],
                               "join": {"connectionString": await connection_string(a, invite)}}})
        try:
            round_answers = await asyncio.gather(*consumers)
        finally:
            for c in consumers:
                c.cancel()
        answers.append(round_answers)
        await asyncio.gather(_gone(a, invite), _gone(b, join))
    # Each consumer read the other cluster's ConfigMap at its first request.
    assert [[(code, what) for code, what, _ in r] for r in answers] == [[(200, "b"), (200, "a")]] * ROUNDS, answers
