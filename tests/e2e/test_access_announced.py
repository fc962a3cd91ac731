"""Access is announced only when it works: in a fresh peering, a module's controller that starts the moment
status.access shows its audience (and, on the inviter, status.grants the project) is never refused, on either
side. Its own egress serves what its status announces (control/rules/access.py: an audience is announced once the
registry the feed published serves it); the peer's entrance catches up within its bound (gateway/catchup.py).
A healthy join raises no Warning Event on either side: the join answer is sent once the inviter's entrance admits
the certificate it carries, and a peer's protocol call meets the same bounded catch-up.

Twenty fresh peerings between the same two lab clusters, each consumer polling its ClusterPeer every few
milliseconds, on both backends; and five with the registry feeds gathering changes for 0.5 s
(`--feed-coalesce`), far longer than a join takes on an idle machine, which is when a registry behind the status
showed (before, the joiner's consumer met 404 PeerNotFound and the joiner a Warning PeerRefusedCertificate). And
on a real kube-apiserver, three with each cluster's RoleBindings reaching its API server 0.5 s late (its API front
holds them): the peer's entrance tries a 403 of a grant on its way again (gateway/grantlag.py)."""

from __future__ import annotations

import asyncio
import ssl
import time

import aiohttp
import pytest
import pytest_asyncio

from control.rules.access import audience
from gateway.resolve import OverrideResolver
from lab.testing import apiserver_backends, lab_clusters
from peering_lab import (GROUP, clusterpeer, connection_string, create_capability, create_project_with_prices,
                         fast_peering_command, until, warning_events)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

CAP = "configmaps-reader"
PROJECT = "shop"
EGRESS = "peering-gateway.d8-peering.svc"
#: (feed coalescing in seconds or None as shipped, rounds on the emulator, rounds on a real kube-apiserver)
LAGS = {"as-shipped": (None, 20, 10), "registry-0.5s-behind": (0.5, 5, 5)}


def _lagging(coalesce: float | None):
    def command(cluster) -> list[str] | None:
        cmd = fast_peering_command(cluster)
        return cmd if cmd is None or coalesce is None else cmd + ["--feed-coalesce", str(coalesce)]
    return command


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=apiserver_backends())
async def backend(request):
    return request.param


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=list(LAGS))
async def lab(request, backend, tmp_path_factory):
    coalesce, on_emulator, on_real = LAGS[request.param]
    rounds = on_real if backend == "real" else on_emulator
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["a", "b"], peering_command=_lagging(coalesce),
                            apiserver=backend) as lab:
        for cluster in (lab["a"], lab["b"]):
            create_capability(cluster, CAP)
            create_project_with_prices(cluster, PROJECT)
        lab.rounds = rounds
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
        # In a thread: the lab's client of a real kube-apiserver blocks, and the lab's passthroughs run here.
        access = await asyncio.to_thread(_announced, here, name)
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


async def _fresh_peerings(a, b, rounds: int, prefix: str = "") -> list[list[tuple[int, str, float]]]:
    """`rounds` fresh peerings of `a` and `b`, one after another, each with a consumer on both sides starting the
    moment its access is announced (`_consumer`): their answers, round by round."""
    answers = []
    for n in range(rounds):
        invite, join = f"{prefix}to-b-{n}", f"{prefix}to-a-{n}"
        # Both administrators open the capability in the ClusterPeer they create: a fresh peering, all at once.
        a.api.create({"apiVersion": f"{GROUP}/v1alpha1", "kind": "ClusterPeer", "metadata": {"name": invite},
                      "spec": {"type": "Invite", "capabilities": [CAP]}})
        consumers = [asyncio.ensure_future(_consumer(a, invite, b)), asyncio.ensure_future(_consumer(b, join, a))]
        b.api.create({"apiVersion": f"{GROUP}/v1alpha1", "kind": "ClusterPeer", "metadata": {"name": join},
                      "spec": {"type": "Join", "capabilities": [CAP],
                               "join": {"connectionString": await connection_string(a, invite)}}})
        try:
            answers.append(await asyncio.gather(*consumers))
        finally:
            for c in consumers:
                c.cancel()
        await asyncio.gather(_gone(a, invite), _gone(b, join))
    return answers


async def test_a_consumer_starting_when_access_is_announced_is_never_refused(lab):
    a, b = lab["a"], lab["b"]
    answers = await _fresh_peerings(a, b, lab.rounds)
    # Each consumer read the other cluster's ConfigMap at its first request (a gateway that waited for its
    # registry longer than its catch-up bound would have answered the refusal).
    assert [[(code, what) for code, what, _ in r] for r in answers] == [[(200, "b"), (200, "a")]] * lab.rounds, answers
    # And no side warned of anything while twenty peerings were made.
    assert warning_events(a) == [] and warning_events(b) == []


#: How long the peer's front holds each RoleBinding's creation, and the rounds of the test below.
HELD, HELD_ROUNDS = 0.5, 3


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=apiserver_backends(("real",)))
async def held_lab(request, tmp_path_factory):
    async with lab_clusters(tmp_path_factory.mktemp("held"), ["a", "b"], peering_command=fast_peering_command,
                            apiserver=request.param, api_front=True) as lab:
        for cluster in (lab["a"], lab["b"]):
            create_capability(cluster, CAP)
            create_project_with_prices(cluster, PROJECT)
            cluster.front.hold("rolebindings", HELD)
        yield lab


async def test_a_consumer_starting_when_access_is_announced_waits_for_the_peers_grants_in_force(held_lab):
    """Each cluster's RoleBindings reach its kube-apiserver HELD s after its control loop writes them (its API front
    holds their creations): a consumer that starts the moment status.access shows its audience reaches the peer
    before the grants there are in force, and the peer's API server would answer 403 Forbidden. The peer's entrance
    tries such a request again until they are (gateway/grantlag.py, within `Limits.registry_catch_up`): the
    consumer is answered 200, as always."""
    a, b = held_lab["a"], held_lab["b"]
    answers = await _fresh_peerings(a, b, HELD_ROUNDS, prefix="held-")
    print("answers (code, cluster or reason, seconds after the announcement):", answers)
    assert [[(code, what) for code, what, _ in r] for r in answers] == [[(200, "b"), (200, "a")]] * HELD_ROUNDS, answers
    assert warning_events(a) == [] and warning_events(b) == []
