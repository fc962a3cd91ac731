"""An outage of any length never ends a peering: two lab clusters whose peering processes issue certificates of a
few seconds (`--client-cert-lifetime`, `--server-cert-lifetime`; production: 24 and 12 hours), each side away
(its process stopped) for ten times that lifetime, then both, restarted while apart. Every certificate either side
holds has long expired by then: the entrance certificates of the side that was away, the client certificates both
sides hold toward each other. Once the side is back, with no action, both ClusterPeers are Ready again and a
module's controller on each side lists and watches the other cluster's ConfigMaps through both gateways, within
one sync interval of the return (the side that stayed retries at most that often; the side that comes back renews
in its first pass, before its entrance serves). That bound is held on the product's own record of it, each egress's
access log (when the first request it answered arrived), not on the consumer's round trips: on a loaded machine
one of those took 1.3 s, so an attempt that arrived in time finished well after. Each side records one Event saying how long the
peer was away.

Runs on both backends; the tests of this module share one peering and run in order."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import pathlib
import ssl
import time

import aiohttp
import pytest
import pytest_asyncio

from control import pki
from control.rules.access import audience
from gateway.resolve import OverrideResolver
from lab.cluster import default_peering_command
from lab.testing import apiserver_backends, lab_clusters
from peering_lab import (clusterpeer, create_project_with_prices, peer_with_capability, ready, ready_message,
                         until)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(420)]

CAP = "configmaps-watcher"
PROJECT = "shop"
EGRESS = "peering-gateway.d8-peering.svc"
#: Every certificate's lifetime, and how long a side stays away: ten times it. Five seconds leave a renewal at
#: half of it two and a half seconds to complete, which a loaded machine needs (with three, a renewal answered a
#: second late let a certificate expire in the steady state, which is then renewed "after an outage").
LIFETIME = 5.0
AWAY = 10 * LIFETIME
#: By the end of the outage every client certificate has been expired for at least this long (it was renewed at
#: most when the outage began, so it expired at most a lifetime after; a lifetime more of margin).
AWAY_EXPIRED = datetime.timedelta(seconds=AWAY - 2 * LIFETIME)
#: How often each side pulls the other's offer, and so retries a peer that did not answer, at most.
SYNC_INTERVAL = 3.0
NAMES = {"a": "to-b", "b": "to-a"}


def short_lived(cluster) -> list[str] | None:
    cmd = default_peering_command(cluster)
    seconds = str(LIFETIME)
    return None if cmd is None else cmd + [
        "--peer-sync-interval", str(SYNC_INTERVAL), "--selfcheck-interval", "1", "--issuer-refresh-interval", "1",
        "--client-cert-lifetime", seconds, "--server-cert-lifetime", seconds]


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=apiserver_backends())
async def lab(request, tmp_path_factory):
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["a", "b"], peering_command=short_lived,
                            apiserver=request.param) as lab:
        for name in ("a", "b"):
            create_project_with_prices(lab[name], PROJECT)
        await peer_with_capability(lab["a"], lab["b"], CAP, verbs=("get", "list", "watch"), timeout=60)
        for side in "ab":
            await Consumer(lab, side).served(timeout=60)
        yield lab


async def _poll(fn, *, timeout: float, what: str):
    """Poll `fn` in a thread (the lab's client of a real kube-apiserver blocks, and the lab's balancers run on this
    loop) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(fn)
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.05)


def _ready(cluster, side: str) -> bool:
    return ready(clusterpeer(cluster, NAMES[side])) == ("Active", "True", "PeeringReady")


class Consumer:
    """A module's controller on `side`: it lists and watches the other cluster's ConfigMaps in the paired project,
    through this side's egress and the other's entrance, with one projected token (as a Pod's kubelet keeps one)."""

    def __init__(self, lab, side: str) -> None:
        self.here, self.there = lab[side], lab["b" if side == "a" else "a"]
        self.side = side
        self.refusals: list[str] = []

    async def served(self, timeout: float) -> float:
        """How long until one list and one watch were both answered with the other cluster's ConfigMap, retrying
        whatever was refused."""
        here, side = self.here, self.side
        status, account = await asyncio.to_thread(lambda: (
            clusterpeer(here, NAMES[side])["status"], here.api.get("", "serviceaccounts", "app", "consumer")))
        access = status["access"]
        token, _ = here.api.sa_issuer.issue("consumer", "app", account["metadata"]["uid"],
                                            [audience(self.there.info()["uuid"], CAP)], 600)
        start = time.monotonic()
        resolver = OverrideResolver({EGRESS: here.resolve_map()[EGRESS]})
        ctx = ssl.create_default_context(cadata=access["caBundle"])
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=resolver, ssl=ctx,
                                                                            force_close=True),
                                             timeout=aiohttp.ClientTimeout(total=10)) as http:
                while not await self._once(http, f"{access['endpoint']}/api/v1/namespaces/{PROJECT}/configmaps",
                                           {"Authorization": f"Bearer {token}"}):
                    assert time.monotonic() - start < timeout, f"{side}'s consumer not served: {self.refusals}"
                    await asyncio.sleep(0.05)
        finally:
            await resolver.close()
        return time.monotonic() - start

    async def _once(self, http: aiohttp.ClientSession, url: str, headers: dict) -> bool:
        want = self.there.name
        try:
            async with http.get(url, headers=headers) as resp:
                if resp.status != 200:
                    self.refusals.append(f"list {resp.status} {(await resp.json(content_type=None)).get('reason')}")
                    return False
                listed = [item["data"]["cluster"] for item in (await resp.json())["items"]
                          if item["metadata"]["name"] == "prices"]
            async with http.get(url + "?watch=1", headers=headers) as resp:
                if resp.status != 200:
                    self.refusals.append(f"watch {resp.status} {(await resp.json(content_type=None)).get('reason')}")
                    return False
                first = json.loads(await resp.content.readline())
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            self.refusals.append(type(exc).__name__)
            return False
        return listed == [want] and first["type"] == "ADDED" and first["object"]["data"]["cluster"] == want


def _outage_events(cluster, side: str) -> list[str]:
    return [e.get("message", "") for e in cluster.api.list("", "events")
            if (e.get("involvedObject") or {}).get("name") == NAMES[side] and e.get("reason") == "CertificateRenewed"
            and "after an outage" in (e.get("message") or "")]


def _first_served(log: pathlib.Path, side: str, since: float) -> float | None:
    """When (epoch seconds) the first list of the other cluster's ConfigMaps that `side`'s egress answered 200 had
    arrived there, since `since`, by its access log (logged at the answer's end, with its duration): the moment
    the product served, without the consumer's own round trip."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            record = json.loads(line)
            if record.get("logger") != "gateway.access":
                continue
            access = json.loads(record["msg"])
            at = (datetime.datetime.fromisoformat(record["time"].replace("Z", "+00:00")).timestamp()
                  - float(access["ms"]) / 1000)
        except (ValueError, KeyError, TypeError):
            continue
        if (at >= since and access.get("listener") == "egress" and access.get("peer") == NAMES[side]
                and access.get("code") == 200 and access.get("outcome") == "answered"
                and access.get("path", "").endswith(f"/namespaces/{PROJECT}/configmaps")):
            return at
    return None


def _client_cert(cluster, side: str) -> str:
    data = (cluster.api.get("", "secrets", f"peer-{NAMES[side]}", "d8-peering") or {}).get("data") or {}
    return base64.b64decode(data.get("client.crt", "")).decode()


async def _outage(lab, away: list[str]) -> dict[str, float]:
    """Stop the processes of `away` for AWAY seconds, start them again; how long after the return each side was
    Ready and its egress served its consumer (the consumers' own times are printed)."""
    stays = [s for s in "ab" if s not in away]
    events = {s: len(await asyncio.to_thread(_outage_events, lab[s], s)) for s in "ab"}
    for side in away:
        await lab[side].stop_peering()
    stopped = time.monotonic()
    for side in stays:
        # The side that stays says its certificate expired meanwhile and is renewed once the peer is back.
        await _poll(lambda: "expired meanwhile" in ready_message(clusterpeer(lab[side], NAMES[side])),
                    timeout=AWAY, what=f"{side}'s Ready saying its certificate expired meanwhile")
    # The outage's length is the scenario itself: a bounded wait on the clock.
    await until(lambda: time.monotonic() - stopped >= AWAY, timeout=AWAY + 1, what="ten lifetimes apart")
    for side in "ab":
        # Every client certificate either side holds has expired by now, long since.
        held = await asyncio.to_thread(_client_cert, lab[side], side)
        assert pki.not_after(held) < datetime.datetime.now(datetime.timezone.utc) - AWAY_EXPIRED
    await asyncio.gather(*(lab[side].start_peering() for side in away))
    back, back_at = time.monotonic(), time.time()
    took: dict[str, float] = {}
    round_trips: dict[str, float] = {}

    async def ready_again(side: str) -> None:
        await _poll(lambda: _ready(lab[side], side), timeout=30, what=f"{side} Ready again")
        took[f"{side} ready"] = time.monotonic() - back

    async def served(consumer: Consumer) -> None:
        await consumer.served(timeout=30)
        round_trips[consumer.side] = time.monotonic() - back
        # The record is written once the answer has gone out, so it may follow the consumer's reading by a moment.
        at = await _poll(lambda: _first_served(lab[consumer.side].path("peering.log"), consumer.side, back_at),
                         timeout=10, what=f"{consumer.side}'s egress logging the answer its consumer was served")
        took[f"{consumer.side} served"] = at - back_at

    consumers = [Consumer(lab, side) for side in "ab"]
    await asyncio.gather(*(ready_again(side) for side in "ab"), *(served(c) for c in consumers))
    for side in "ab":
        notes = await _poll(lambda: _outage_events(lab[side], side)[events[side]:], timeout=10,
                            what=f"{side}'s Event of the renewal after the outage")
        assert len(notes) == 1 and "the peer was away for" in notes[0], notes
    print(f"outage of {away}: {', '.join(f'{k} after {v:.2f}s' for k, v in sorted(took.items()))}; consumers "
          f"done after {', '.join(f'{k} {v:.2f}s' for k, v in sorted(round_trips.items()))}; refused meanwhile: "
          f"{[c.refusals for c in consumers]}")
    return took


@pytest.mark.parametrize("away", [["b"], ["a"], ["a", "b"]], ids=["joiner-away", "inviter-away", "both-restarted"])
async def test_after_ten_lifetimes_apart_the_peering_resumes_by_itself(lab, away):
    took = await _outage(lab, away)
    # Within one sync interval of the return: the side that stayed retried at most that long after it.
    assert max(took.values()) <= SYNC_INTERVAL, took
