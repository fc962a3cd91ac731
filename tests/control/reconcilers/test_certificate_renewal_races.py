"""A client certificate renewal is never lost to a race, and never refused for one.

Three races broke renewals of short-lived certificates (the e2e test of seconds-long certificates found them):
- the reconciler's write of our renewed certificate met the peer handlers' write of the same peer Secret (the
  certificate we issue to the peer) and was dropped, so the next pass asked for one more renewal with the old
  certificate;
- the issuer answered every such retry with one more certificate and kept only one earlier one, so the certificate
  the requester still held was soon no longer accepted;
- the issuer's entrance learns a certificate it issued through its own watch, a moment after answering, so the first
  call with the new certificate could be refused.
Each is reproduced here against the emulated API server (real conflicts) or a stand-in entrance that refuses the new
certificate the way the gateway does (403 PeerUnknown).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import types

import pytest

from contract import reasons
from contract.errors import Refusal
from contract.names import MANAGED_BY, MANAGED_BY_VALUE
from contract.peer_secret import PeerCredentials
from control import pki
from control.handlers.peer import KEEP_ISSUED, PeerHandlers, _certs
from control.informers import Informers
from control.kube import SECRETS
from control.peer_secret import PeeringGone, update_peer_secret
from control.peerclient import Answer
from control.reconcilers.clusterpeer.sync import Syncer
from control.reconcilers.memory import Memory, PeerMemory
from control.rules import credentials as creds
from control.rules import join as join_rules
from control.rules.spec import JOIN
from gateway.protocol import PeerCall
from gateway.registry import Peer
from tests.control.conftest import CLUSTER_UUID, NAMESPACE, FakeClock

PEER_UUID = "7c5e0000-0000-4000-8000-0000000000b2"
LIFETIME = datetime.timedelta(hours=24)
PEER = Peer(name="to-b", uuid=PEER_UUID, fingerprints=frozenset(), issuer_url=None, jwks_json=None,
            effective=frozenset(), connector_id="peering-to-b", entrance=None, peer_ca_pem=None,
            client_cert_pem=None, client_key_pem=None)


def _encode(values: dict[str, str]) -> dict[str, str]:
    return {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}


class Setup:
    """This cluster's CA Secret, the ClusterPeer `to-b` and its peer Secret holding the certificate we issued to
    the peer's key `peer_key` at `issued_at`."""

    def __init__(self, server, issued_at: datetime.datetime) -> None:
        self.server = server
        self.ca = pki.create_ca(CLUSTER_UUID, now=issued_at - datetime.timedelta(days=1))
        server.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "peering-ca",
                                                                          "namespace": NAMESPACE,
                                                                          "labels": {MANAGED_BY: MANAGED_BY_VALUE}},
                       "data": _encode({"tls.crt": self.ca.cert_pem, "tls.key": self.ca.key_pem})})
        self.cp = server.create({"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                                 "metadata": {"name": "to-b"}, "spec": {"type": "Invite"}})
        self.peer_key = pki.make_key_and_csr(PEER_UUID)
        self.first = pki.issue_client_cert(self.ca, self.peer_key.cert_pem, PEER_UUID, now=issued_at,
                                           lifetime=LIFETIME)
        server.create(creds.peer_secret(self.cp, NAMESPACE, PeerCredentials(issued=self.first, peer_uuid=PEER_UUID)))

    def issued(self) -> list[str]:
        return _certs(creds.secret_values(self.server.get("", "secrets", "peer-to-b", NAMESPACE))["issued.crt"])


async def _admitted(clusterpeer: str, cert_pem: str) -> bool:
    return True  # no gateway runs here: nothing to wait for before answering


@contextlib.asynccontextmanager
async def handlers(kube, clock: FakeClock):
    """The peer handlers over informers synced with the API server (they answer from the caches)."""
    informers = Informers(kube)
    ctx = types.SimpleNamespace(kube=kube, namespace=NAMESPACE, handlers=None, clock=clock, informers=informers,
                                cluster_uuid=lambda: CLUSTER_UUID, admitted=_admitted,
                                current_status=lambda cp: (cp or {}).get("status") or {},
                                settings=types.SimpleNamespace(control=types.SimpleNamespace(client_lifetime=LIFETIME)))
    h = PeerHandlers(ctx, pull_now=lambda name: None)
    informers.start()
    try:
        await informers.wait_synced()
        yield h
    finally:
        await informers.stop()


def renewal(csr_pem: str) -> PeerCall:
    return PeerCall(peer=PEER, op="certificate", body=join_rules.certificate_request(csr_pem))


async def test_a_renewal_asked_again_while_the_last_is_fresh_gets_the_same_certificate(api, kube):
    server, _ = api
    clock = FakeClock()
    setup = Setup(server, clock.now() - datetime.timedelta(hours=13))
    async with handlers(kube, clock) as h:
        one = await h.certificate(renewal(setup.peer_key.cert_pem))
        assert setup.issued()[0] != setup.first and len(setup.issued()) == 2
        rv = server.get("", "secrets", "peer-to-b", NAMESPACE)["metadata"]["resourceVersion"]
        # The requester did not store that answer (its write lost a race) and asks again: the same certificate,
        # and nothing written, so its current certificate is not pushed out.
        for _ in range(5):
            again = await h.certificate(renewal(setup.peer_key.cert_pem))
            assert again == one
    assert server.get("", "secrets", "peer-to-b", NAMESPACE)["metadata"]["resourceVersion"] == rv
    assert setup.issued()[1] == setup.first
    assert join_rules.certificate_answer(setup.issued()[0]) == one


async def test_renewals_keep_the_newest_three_certificates_expired_or_not(api, kube):
    server, _ = api
    clock = FakeClock()
    setup = Setup(server, clock.now() - datetime.timedelta(hours=13))
    held = [setup.first]
    async with handlers(kube, clock) as h:
        for _ in range(4):
            answer = await h.certificate(renewal(setup.peer_key.cert_pem))
            held.insert(0, answer["certificate"])
            bundle = setup.issued()
            assert bundle[0] == held[0]
            # The newest KEEP_ISSUED stay known, an expired one too: it admits only the renewal (gateway admission),
            # so a peer whose renewal answer was lost can ask again with the certificate it holds.
            assert bundle == held[:KEEP_ISSUED]
            clock.advance(13 * 3600)
    assert len(setup.issued()) == KEEP_ISSUED
    assert not pki.valid_at(setup.issued()[-1], clock.now())


async def test_a_renewal_for_another_key_is_refused_and_changes_nothing(api, kube):
    server, _ = api
    clock = FakeClock()
    setup = Setup(server, clock.now() - datetime.timedelta(hours=13))
    other = pki.make_key_and_csr(PEER_UUID)
    async with handlers(kube, clock) as h:
        with pytest.raises(Refusal) as refused:
            await h.certificate(renewal(other.cert_pem))
    assert refused.value.reason == reasons.KEY_MISMATCH
    assert setup.issued() == [setup.first]


class RacingKube:
    """The real session, except that right after the first read of the peer Secret someone else writes it (as the
    peer handlers do), so the write that follows meets a real 409 from the API server."""

    def __init__(self, kube, server, values: dict[str, str]) -> None:
        self.kube = kube
        self.server = server
        self.values = values
        self.raced = False

    def __getattr__(self, name):
        return getattr(self.kube, name)

    async def get_or_none(self, resource, name, namespace=None):
        got = await self.kube.get_or_none(resource, name, namespace)
        if resource is SECRETS and not self.raced:
            self.raced = True
            fresh = self.server.get("", "secrets", name, namespace)
            fresh["data"] = {**fresh.get("data", {}), **_encode(self.values)}
            self.server.update(fresh)
        return got


async def test_a_write_that_meets_a_concurrent_one_is_applied_over_it(api, kube):
    server, _ = api
    cp = server.create({"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                        "metadata": {"name": "to-b"}, "spec": {"type": "Invite"}})
    server.create(creds.peer_secret(cp, NAMESPACE, PeerCredentials(client_key="k", client_cert="old")))
    racing = RacingKube(kube, server, {"issued.crt": "theirs"})
    written = await update_peer_secret(racing, NAMESPACE, "to-b", lambda v: v.replace(client_cert="new"))
    assert racing.raced
    stored = creds.secret_values(server.get("", "secrets", "peer-to-b", NAMESPACE))
    assert stored == written.values() == {"client.key": "k", "client.crt": "new", "issued.crt": "theirs"}


async def test_a_write_for_a_peering_that_is_gone_says_so(api, kube):
    with pytest.raises(PeeringGone):
        await update_peer_secret(kube, NAMESPACE, "nowhere", lambda v: v)


class Entrance:
    """The peer's entrance as the gateway answers it: a certificate it has not learnt yet is 403 PeerUnknown."""

    def __init__(self, accepted: set[str]) -> None:
        self.accepted = accepted
        self.presented: list[str] = []
        self.ops: list[str] = []

    async def call(self, entrance, op, *, peer_ca_pem, client_cert_pem, client_key_pem, body=None) -> Answer:
        self.presented.append(client_cert_pem)
        self.ops.append(op)
        if client_cert_pem not in self.accepted:
            return Answer(403, {"kind": "Status", "reason": reasons.PEER_UNKNOWN, "message": "unknown"})
        return Answer(200, {})


async def test_the_certificate_before_a_renewal_is_used_while_the_peer_has_not_learnt_the_new_one():
    clock = FakeClock()
    peer_ca = pki.create_ca("peer", now=clock.now() - datetime.timedelta(days=1))
    key = pki.make_key_and_csr(CLUSTER_UUID)
    old = pki.issue_client_cert(peer_ca, key.cert_pem, CLUSTER_UUID, now=clock.now(), lifetime=LIFETIME)
    new = pki.issue_client_cert(peer_ca, key.cert_pem, CLUSTER_UUID, now=clock.now(), lifetime=LIFETIME)
    entrance = Entrance({old})
    syncer = Syncer(None, entrance, Memory(clock=clock), clock, namespace=NAMESPACE)
    mem = PeerMemory(previous_client_cert=old)
    values = PeerCredentials(peer_entrance="e", peer_ca=peer_ca.cert_pem, client_cert=new, client_key=key.key_pem)
    answer, previous = await syncer._call(mem, values, "notify", {})
    assert answer.ok and entrance.presented == [new, old] and previous == old
    # Once the entrance answers the new certificate, the old one is forgotten.
    entrance.accepted.add(new)
    answer, previous = await syncer._call(mem, values, "notify", {})
    assert answer.ok and entrance.presented[2:] == [new] and previous == ""
    # A revocation stays a revocation: the refusal is what the caller sees.
    entrance.accepted.clear()
    answer, _ = await syncer._call(mem.learnt(previous_client_cert=previous), values, "notify", {})
    assert answer.status == 403
    assert entrance.presented[3:] == [new]


async def test_an_expired_previous_certificate_is_not_tried():
    clock = FakeClock()
    peer_ca = pki.create_ca("peer", now=clock.now() - datetime.timedelta(days=3))
    key = pki.make_key_and_csr(CLUSTER_UUID)
    old = pki.issue_client_cert(peer_ca, key.cert_pem, CLUSTER_UUID, now=clock.now() - datetime.timedelta(days=2),
                                lifetime=LIFETIME)
    new = pki.issue_client_cert(peer_ca, key.cert_pem, CLUSTER_UUID, now=clock.now(), lifetime=LIFETIME)
    entrance = Entrance(set())
    syncer = Syncer(None, entrance, Memory(clock=clock), clock, namespace=NAMESPACE)
    mem = PeerMemory(previous_client_cert=old)
    values = PeerCredentials(peer_entrance="e", peer_ca=peer_ca.cert_pem, client_cert=new, client_key=key.key_pem)
    assert (await syncer._call(mem, values, "offer"))[0].status == 403
    assert entrance.presented == [new]


async def test_a_renewal_by_the_inviter_leaves_the_joiner_nothing_to_deliver():
    """The joiner delivered the certificate it issued for the inviter's key (/peering/v1/credentials). The inviter
    renews it over the joiner's /peering/v1/certificate, whose answer carries the new one, and that changes the
    joiner's issued.crt: there is nothing to deliver again, and Ready does not go False (CredentialsPending) while
    the joiner's registry catches up with the renewed certificate, as it did on a real kube-apiserver."""
    clock = FakeClock()
    now = clock.now()
    our_ca, peer_ca = pki.create_ca(CLUSTER_UUID, now=now), pki.create_ca(PEER_UUID, now=now)
    our_key, inviter_key = pki.make_key_and_csr(CLUSTER_UUID), pki.make_key_and_csr(PEER_UUID)
    ours = pki.issue_client_cert(peer_ca, our_key.cert_pem, CLUSTER_UUID, now=now, lifetime=LIFETIME)
    issued = pki.issue_client_cert(our_ca, inviter_key.cert_pem, PEER_UUID, now=now, lifetime=LIFETIME)
    entrance = Entrance({ours})
    admitted: set[str] = {issued}
    syncer = Syncer(None, entrance, Memory(clock=clock), clock, namespace=NAMESPACE,
                    admits=lambda clusterpeer, cert_pem: cert_pem in admitted)
    mem = PeerMemory(pull_at=clock.monotonic() + 3600)
    obs = types.SimpleNamespace(spec=types.SimpleNamespace(type=JOIN), key="to-a", now=now, own_uuid=CLUSTER_UUID)
    values = PeerCredentials(peer_entrance="e", peer_ca=peer_ca.cert_pem, client_cert=ours,
                             client_key=our_key.key_pem, issued=issued)
    peer = {"clusterUUID": PEER_UUID}

    def deliveries() -> int:
        return entrance.ops.count("credentials")
    first = await syncer.sync(obs, mem, values, peer, just_joined=False)
    mem = first.memory
    assert deliveries() == 1 and not first.undelivered
    clock.advance(13 * 3600)
    renewed = pki.issue_client_cert(our_ca, inviter_key.cert_pem, PEER_UUID, now=clock.now(), lifetime=LIFETIME)
    obs.now = clock.now()
    ours = pki.issue_client_cert(peer_ca, our_key.cert_pem, CLUSTER_UUID, now=clock.now(), lifetime=LIFETIME)
    entrance.accepted.add(ours)
    after = await syncer.sync(obs, mem, values.replace(client_cert=ours, issued=renewed + issued), peer,
                              just_joined=False)
    mem = after.memory
    assert deliveries() == 1 and not after.undelivered
    # Another key is another certificate to deliver.
    other = pki.issue_client_cert(our_ca, pki.make_key_and_csr(PEER_UUID).cert_pem, PEER_UUID, now=clock.now(),
                                  lifetime=LIFETIME)
    again = await syncer.sync(obs, mem, values.replace(client_cert=ours, issued=other), peer, just_joined=False)
    mem = again.memory
    assert deliveries() == 1 and again.undelivered
    admitted.add(other)
    delivered = await syncer.sync(obs, mem, values.replace(client_cert=ours, issued=other), peer,
                                  just_joined=False)
    assert deliveries() == 2 and not delivered.undelivered
