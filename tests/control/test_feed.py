"""The registry feed against the emulated API server: bursts are coalesced into few snapshots, a change that does
not alter the snapshot publishes nothing, and each snapshot carries the next generation; server certificates are
loaded only within their validity period."""

from __future__ import annotations

import asyncio
import contextlib
import datetime

from control import pki
from control.bootstrap import tls_secret
from control.feed import Feed
from control.informers import Informers
from tests.control.conftest import NAMESPACE, eventually


class Recorder:
    def __init__(self):
        self.registries = []
        self.reloads = 0

    async def publish(self, registry):
        self.registries.append(registry)

    def reload_certificates(self, **pems):
        self.reloads += 1


def capability(name, version="v1"):
    return {"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "PeeringCapability", "metadata": {"name": name},
            "spec": {"version": version, "consumers": [{"kind": "ServiceAccount", "namespace": "m", "name": "c"}],
                     "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}}


@contextlib.asynccontextmanager
async def running_feed(kube, coalesce: float):
    """A started feed over the cluster's informers, publishing to a Recorder, once its first registry is out."""
    informers = Informers(kube)
    sink = Recorder()
    feed = Feed(informers, sink, NAMESPACE, coalesce=coalesce)
    informers.start()
    feed.start()
    try:
        await asyncio.wait_for(feed.ready.wait(), 10)
        yield feed, sink
    finally:
        await feed.stop()
        await informers.stop()


async def test_bursts_are_coalesced_and_no_op_changes_publish_nothing(api, kube):
    server, _ = api
    async with running_feed(kube, coalesce=0.2) as (feed, sink):
        assert len(sink.registries) == 1 and sink.registries[0].generation == 1 and not sink.reloads
        for i in range(30):
            server.create(capability(f"cap{i}"))
            await asyncio.sleep(0)  # let the watch deliver between writes: a real burst, not one batch
        await eventually(lambda: len(sink.registries[-1].capabilities) == 30, what="all 30 capabilities")
        assert len(sink.registries) <= 4, f"{len(sink.registries)} snapshots for one burst"
        generations = [r.generation for r in sink.registries]
        assert generations == list(range(1, len(generations) + 1))

        # A label on a capability changes its object but not the snapshot: nothing is published.
        published = len(sink.registries)
        obj = server.get("peering.deckhouse.io", "peeringcapabilities", "cap0")
        obj["metadata"]["labels"] = {"x": "y"}
        server.update(obj)
        await eventually(lambda: feed.capabilities.get("cap0")["metadata"].get("labels") == {"x": "y"},
                         what="the label in the cache")
        await feed.publish_once()
        assert len(sink.registries) == published
        server.create(capability("marker", version="v2"))
        await eventually(lambda: "marker" in sink.registries[-1].capabilities, what="the marker")
        assert len(sink.registries) == published + 1
        assert sink.registries[-1].capabilities["marker"].version == "v2"


async def test_published_tells_of_each_registry_and_waits_for_one_that_serves():
    from control.feed import Published
    from gateway.registry import Registry

    def registry(generation: int) -> Registry:
        return Registry.from_objects(cluster_uuid="u", clusterpeers=[], peer_secrets=[], capabilities=[],
                                     generation=generation)

    published = Published()
    told: list[tuple[int, int]] = []
    unsubscribe = published.subscribe(lambda old, new: told.append((old.generation, new.generation)))
    # Served already: no wait. Never served: False after the bound.
    assert await published.until(lambda r: True, 0)
    assert not await published.until(lambda r: r.generation >= 9, 0.05)
    waiting = asyncio.ensure_future(published.until(lambda r: r.generation >= 2, 5))
    await asyncio.sleep(0)
    published.set(registry(1))
    await asyncio.sleep(0)
    assert not waiting.done()  # a newer registry that does not serve it yet: waits on
    published.set(registry(2))
    assert await asyncio.wait_for(waiting, 5)
    assert told == [(0, 1), (1, 2)]
    unsubscribe()
    published.set(registry(3))
    assert told == [(0, 1), (1, 2)] and published.registry.generation == 3


SERVERS = (("peering-gateway-tls", "peering-gateway.t.lab"), ("peering-egress-tls", "peering-gateway.d8-peering.svc"))


async def test_a_server_certificate_outside_its_dates_is_not_served_until_the_leader_renews_it(api, kube):
    # A process back after longer than its server certificates live finds them expired in their Secrets.
    server, _ = api
    now = datetime.datetime.now(datetime.timezone.utc)
    ca = pki.create_ca("c", now=now - datetime.timedelta(days=40))
    server.create(tls_secret("peering-ca", NAMESPACE, ca, None))
    for name, host in SERVERS:
        stale = pki.issue_server_cert(ca, [host], now=now - datetime.timedelta(days=30))
        server.create(tls_secret(name, NAMESPACE, stale, ca.cert_pem))
    async with running_feed(kube, coalesce=0.01) as (feed, sink):
        await feed.publish_once()
        assert sink.reloads == 0 and feed.certificates is None
        # Nothing is served: a ClusterPeer's renewal after the outage waits (bounded) for the entrance first.
        assert not feed.published.serving.is_set() and not await feed.published.until_serving(0.05)
        waiting = asyncio.ensure_future(feed.published.until_serving(30))
        # The leader's first pass renews both (bootstrap.plan: due for renewal): they are loaded at once.
        for name, host in SERVERS:
            fresh = pki.issue_server_cert(ca, [host], now=now)
            current = server.get("", "secrets", name, NAMESPACE)
            server.update({**tls_secret(name, NAMESPACE, fresh, ca.cert_pem), "metadata": current["metadata"]})
        await eventually(lambda: sink.reloads == 1, what="the renewed certificates loaded")
        assert feed.certificates is not None and pki.valid_at(feed.certificates.entrance_cert_pem.decode(), now)
        assert await waiting and feed.published.serving.is_set()
