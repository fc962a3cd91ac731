"""The module's alerts count only what an administrator must act on (alert_eval.py says how they are evaluated).

Two lab clusters, each with the real `peering run` at its production intervals, peered with a capability; a
consumer of b reads a's ConfigMaps through b's egress and a's entrance as a controller does: it lists, gets, looks
for objects that are not there yet (a 404 is an answer, not a refusal) and opens watches that it ends itself.
Over what both processes exported meanwhile, no alert expression of the module has a sample and no alert fires.
Then a's process stops under the same consumer (the peer goes away): over b's metrics the egress's failing
requests and upstream errors raise their alerts, and no other gateway alert fires."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
import pytest

from alert_eval import alert_groups, alerts, promtool_test, scrape, series, without_annotations
from control.rules.access import audience
from gateway.resolve import OverrideResolver
from lab.testing import apiserver_backends, lab_clusters, promtool_or_skip
from peering_lab import clusterpeer, create_project_with_prices, peer_with_capability

pytestmark = pytest.mark.slow

CAP = "configmaps-reader"
PROJECT = "shop"
EGRESS_HOST = "peering-gateway.d8-peering.svc"


@pytest.fixture(scope="module")
def promtool() -> str:
    return promtool_or_skip("ALERTS NOT EVALUATED")


@pytest.fixture(scope="module")
def groups() -> list[dict]:
    return alert_groups()


@pytest.fixture(params=apiserver_backends())
def backend(request) -> str:
    return request.param


class Consumer:
    """The module controller of b that reads a's ConfigMaps in the paired project through b's egress."""

    def __init__(self, http: aiohttp.ClientSession, endpoint: str, token: str) -> None:
        self.http = http
        self.base = f"{endpoint}/api/v1/namespaces/{PROJECT}/configmaps"
        self.headers = {"Authorization": f"Bearer {token}"}
        self.codes: list[int] = []

    async def _get(self, suffix: str) -> int:
        async with self.http.get(self.base + suffix, headers=self.headers) as resp:
            await resp.read()
        self.codes.append(resp.status)
        return resp.status

    async def _watch(self) -> None:
        """A watch it ends itself once the first event came (when the peer is there to send one)."""
        async with self.http.get(self.base + "?watch=true", headers=self.headers) as resp:
            self.codes.append(resp.status)
            if resp.status == 200:
                assert (await resp.content.readline()).startswith(b'{"type":"ADDED"')
            # leaving the block closes the connection: the consumer ends its watch

    async def first_answer(self) -> None:
        """Right after Ready, a's registry may not have b's issuer yet; any other answer than 200 counts."""
        async with asyncio.timeout(30):
            while await self._get("/prices") != 200:
                await asyncio.sleep(0.1)

    async def run(self, rounds: int) -> None:
        for _ in range(rounds):
            await self._get("")
            await self._get("/prices")
            await self._get("/not-there-yet")
            await self._get("/nor-this-one")
            await self._watch()


async def test_a_fault_free_run_raises_no_alert_and_a_peer_gone_raises_the_egress_alerts(tmp_path, promtool,
                                                                                         groups, backend):
    async with lab_clusters(tmp_path / "lab", ["a", "b"], apiserver=backend) as lab:
        a, b = lab["a"], lab["b"]
        for cluster in (a, b):
            create_project_with_prices(cluster, PROJECT)
        await peer_with_capability(a, b, CAP, timeout=60, verbs=("get", "list", "watch"))
        access = clusterpeer(b, "to-a")["status"]["access"]
        sa = b.api.get("", "serviceaccounts", "app", "consumer")
        token, _ = b.api.sa_issuer.issue("consumer", "app", sa["metadata"]["uid"],
                                         [audience(a.info()["uuid"], CAP)], 3600)
        resolver = OverrideResolver({EGRESS_HOST: b.resolve_map()[EGRESS_HOST]})
        ctx = ssl.create_default_context(cadata=access["caBundle"])
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=resolver, ssl=ctx)) as http, \
                    aiohttp.ClientSession() as ops:
                consumer = Consumer(http, access["endpoint"], token)
                await consumer.first_answer()
                firsts = {c.name: await scrape(ops, c.ports["ops"]) for c in (a, b)}
                consumer.codes.clear()
                await consumer.run(40)
                lasts = {c.name: await scrape(ops, c.ports["ops"]) for c in (a, b)}
                assert sorted(set(consumer.codes)) == [200, 404], consumer.codes  # fault-free: answers only
                assert consumer.codes.count(200) == 120

                # The peer goes away (its process stops): b's consumer meets 503 UpstreamUnavailable.
                await a.stop_replica(0)
                fault_first = await scrape(ops, b.ports["ops"])
                consumer.codes.clear()
                await consumer.run(20)
                fault_last = await scrape(ops, b.ports["ops"])
                assert set(consumer.codes) == {503}, consumer.codes
        finally:
            await resolver.close()

    every = [rule["alert"] for rule in alerts(groups)]
    exprs = [rule["expr"] for rule in alerts(groups)]
    for name in ("a", "b"):
        where = tmp_path / f"fault-free-{name}"
        where.mkdir()
        code, output = await promtool_test(promtool, groups, series(firsts[name], lasts[name], f"peering-{name}"),
                                           {alert: [] for alert in every}, where, exprs_empty=exprs)
        assert code == 0, f"cluster {name}, fault-free:\n{output}"

    gateway_alerts = [alert for alert in every if alert.startswith(("D8PeeringGateway", "D8PeeringTokenExchange",
                                                                    "D8PeeringTLS"))]
    expected = {alert: [] for alert in gateway_alerts}
    on_egress = {"namespace": "d8-peering", "listener": "egress", "tier": "cluster"}
    expected["D8PeeringGatewayFailingRequests"] = [{**on_egress, "severity_level": "5"}]
    expected["D8PeeringGatewayUpstreamErrors"] = [{**on_egress, "kind": "connect", "severity_level": "6"}]
    (tmp_path / "fault").mkdir()
    code, output = await promtool_test(promtool, without_annotations(groups),
                                       series(fault_first, fault_last, "peering-b"), expected, tmp_path / "fault")
    assert code == 0, f"cluster b, its peer gone:\n{output}"
