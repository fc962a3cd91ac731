"""The peer protocol's handlers answer from the informers' caches: an offer pull, a renewal answered again and a
delivery made before cost the API server no read at all; a renewal that issues costs one write and no read. The
offer is as fresh as a read of the API was: right after the reconciler wrote a new offer (and notified the peer),
a pull answered before this process's watch delivered that write gets the new offer, not the cached old one.

Against the emulated API server, with the session's counters (`KubeSession.read_counts`, `write_counts`)."""

from __future__ import annotations

import pytest

from contract.errors import Refusal
from contract.names import CA_SECRET, peer_secret_name
from contract.peer_secret import PeerCredentials
from control import pki
from control.bootstrap import tls_secret
from control.config import KubeSettings, Settings
from control.context import Context
from control.handlers.dispatch import Handlers
from control.handlers.peer import PeerHandlers
from control.informers import Informers
from control.rules import credentials as creds
from control.rules import join as join_rules
from gateway.protocol import PeerCall
from gateway.registry import Peer
from tests.control.conftest import CLUSTER_UUID, NAMESPACE, FakeClock, eventually

GROUP = "peering.deckhouse.io"
PEER_UUID = "7c5e0000-0000-4000-8000-0000000000b2"
OFFER = {"projects": [{"name": "shop", "namespaces": ["shop"]}], "capabilities": [], "peeringVersion": "0.1.0"}
NEW_OFFER = {**OFFER, "projects": [{"name": "shop", "namespaces": ["shop", "shop-eu"]}]}
HOUR = 3600.0


class Peering:
    """A peering "to-b" as the inviter holds it once established: the ClusterPeer with its offer, the CA, the peer
    Secret with the certificate issued to the peer's key (and our key toward it); the handlers over synced caches."""

    def __init__(self, server, kube, clock: FakeClock) -> None:
        self.server, self.kube, self.clock = server, kube, clock
        now = clock.now()
        self.ca = pki.create_ca(CLUSTER_UUID, now=now)
        self.peer_ca = pki.create_ca(PEER_UUID, now=now)
        self.peer_key = pki.make_key_and_csr(PEER_UUID)
        self.own_key = pki.make_key_and_csr(CLUSTER_UUID)
        server.create(tls_secret(CA_SECRET, NAMESPACE, self.ca, None))
        cp = server.create({"apiVersion": f"{GROUP}/v1alpha1", "kind": "ClusterPeer", "metadata": {"name": "to-b"},
                            "spec": {"type": "Invite"}})
        cp["status"] = {"offer": OFFER}
        self.cp = server.update(cp, subresource="status")
        issued = pki.issue_client_cert(self.ca, self.peer_key.cert_pem, PEER_UUID, now=now)
        server.create(creds.peer_secret(self.cp, NAMESPACE, PeerCredentials.from_values({
            "peer-ca.crt": self.peer_ca.cert_pem, "client.key": self.own_key.key_pem, "issued.crt": issued,
            "peer-uuid": PEER_UUID, "peer-entrance": "peering-gateway.b.lab"})))
        self.informers = Informers(kube)
        self.ctx = Context(Settings(public_domain_template="%s.a.lab", kube=KubeSettings(namespace=NAMESPACE)),
                           kube, self.informers, Handlers(), clock=clock)
        self.ctx.cluster_uuid_informer()
        self.handlers = PeerHandlers(self.ctx, pull_now=lambda name: None)
        self.peer = Peer(name="to-b", uuid=PEER_UUID, fingerprints=frozenset(), issuer_url=None, jwks_json=None,
                         effective=frozenset(), connector_id="peering-to-b", entrance=None, peer_ca_pem=None,
                         client_cert_pem=None, client_key_pem=None)

    async def start(self) -> None:
        self.informers.start()
        await self.informers.wait_synced()
        await eventually(lambda: self.ctx.cluster_uuid() == CLUSTER_UUID, what="the cluster UUID in the cache")

    def reads(self) -> int:
        return sum(self.kube.read_counts.values())

    def writes(self) -> int:
        return sum(self.kube.write_counts.values())

    async def call(self, op: str, body: dict | None = None) -> dict:
        return await getattr(self.handlers, op)(PeerCall(peer=self.peer, op=op, body=body))

    def secret(self) -> dict[str, str]:
        return creds.secret_values(self.server.get("", "secrets", peer_secret_name("to-b"), NAMESPACE))

    async def cached(self, check) -> None:
        await eventually(lambda: check(creds.secret_values(self.handlers.secrets.get(peer_secret_name("to-b"),
                                                                                      NAMESPACE))),
                         what="the peer Secret's write in the cache")


@pytest.fixture
async def peering(api, kube):
    p = Peering(api[0], kube, FakeClock())
    await p.start()
    try:
        yield p
    finally:
        await p.informers.stop()


async def test_two_hundred_offer_pulls_read_nothing_from_the_api(peering):
    before = peering.reads()
    for _ in range(200):
        assert await peering.call("offer") == {"alias": "to-b", "offer": OFFER}
    assert peering.reads() - before == 0


async def test_a_pull_right_after_the_reconciler_wrote_a_new_offer_gets_it_before_the_watch_delivers_it(peering):
    cached = peering.handlers.clusterpeers.get("to-b")
    # The reconciler's write as the API has it now; this process's watch has not delivered it yet.
    peering.ctx.written_status["to-b"] = (cached["metadata"]["resourceVersion"], {"offer": NEW_OFFER})
    assert (await peering.call("offer"))["offer"] == NEW_OFFER
    # Once the cache moved on (the write delivered, or anything newer), the cache is what is served.
    written = peering.server.update({**cached, "status": {"offer": NEW_OFFER}}, subresource="status")
    await eventually(lambda: peering.handlers.clusterpeers.get("to-b")["metadata"]["resourceVersion"] ==
                     written["metadata"]["resourceVersion"], what="the write in the cache")
    peering.server.update({**written, "status": {"offer": OFFER}}, subresource="status")
    await eventually(lambda: peering.handlers.clusterpeers.get("to-b")["status"]["offer"] == OFFER,
                     what="the next write in the cache")
    assert (await peering.call("offer"))["offer"] == OFFER


async def test_no_offer_yet_is_a_retryable_503(peering):
    peering.ctx.written_status["to-b"] = (peering.handlers.clusterpeers.get("to-b")["metadata"]["resourceVersion"],
                                          {})
    with pytest.raises(Refusal) as refused:
        await peering.call("offer")
    assert refused.value.code == 503 and "not computed yet" in refused.value.message


async def test_renewals_read_nothing_and_one_that_issues_writes_once(peering):
    csr = pki.csr_for_key(peering.peer_key.key_pem, PEER_UUID)
    issued = peering.secret()["issued.crt"]
    reads, writes = peering.reads(), peering.writes()
    for _ in range(200):  # within the first half of its lifetime: answered again
        assert await peering.call("certificate", {"csr": csr}) == {"certificate": issued}
    assert (peering.reads() - reads, peering.writes() - writes) == (0, 0)
    peering.clock.advance(13 * HOUR)  # past half of the 24 hours
    renewed = (await peering.call("certificate", {"csr": csr}))["certificate"]
    assert renewed != issued and (peering.reads() - reads, peering.writes() - writes) == (0, 1)
    await peering.cached(lambda v: v.get("issued.crt", "").startswith(renewed))
    for _ in range(199):
        assert await peering.call("certificate", {"csr": csr}) == {"certificate": renewed}
    assert (peering.reads() - reads, peering.writes() - writes) == (0, 1)
    assert peering.secret()["issued.crt"] == renewed + issued  # the one before stays accepted


async def test_a_write_from_a_cache_behind_the_api_is_read_again_and_not_lost(peering):
    csr = pki.csr_for_key(peering.peer_key.key_pem, PEER_UUID)
    peering.clock.advance(13 * HOUR)
    # Another replica renewed meanwhile: the API holds a newer Secret than this cache.
    other = pki.issue_client_cert(peering.ca, csr, PEER_UUID, now=peering.clock.now())
    current = peering.server.get("", "secrets", peer_secret_name("to-b"), NAMESPACE)
    values = creds.secret_values(current)
    await peering.informers.stop()  # this cache stays behind
    peering.server.update({**current, "data": creds.peer_secret(peering.cp, NAMESPACE, PeerCredentials.from_values({
        **values, "issued.crt": other + values["issued.crt"]}))["data"]})
    reads = peering.reads()
    assert await peering.call("certificate", {"csr": csr}) == {"certificate": other}
    assert peering.reads() - reads == 2  # the stale write failed its precondition: read from the API once


async def test_a_repeated_credentials_delivery_reads_nothing(peering):
    now = peering.clock.now()
    own_csr = pki.csr_for_key(peering.own_key.key_pem, CLUSTER_UUID)
    delivered = pki.issue_client_cert(peering.peer_ca, own_csr, CLUSTER_UUID, now=now)
    body = join_rules.credentials_message(delivered)
    assert await peering.call("credentials", body) == {}
    await peering.cached(lambda v: v.get("client.crt") == delivered)
    reads, writes = peering.reads(), peering.writes()
    for _ in range(50):
        assert await peering.call("credentials", body) == {}
    assert (peering.reads() - reads, peering.writes() - writes) == (0, 0)
    other = pki.issue_client_cert(pki.create_ca("other", now=now), own_csr, CLUSTER_UUID, now=now)
    with pytest.raises(Refusal) as refused:
        await peering.call("credentials", join_rules.credentials_message(other))
    assert refused.value.code == 400 and peering.reads() - reads == 0
