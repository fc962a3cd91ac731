"""The claim of a peer cluster UUID (control/uuid_claim.py) against an API server, on both backends: two joins of
this cluster toward one inviting cluster that accepts both, run at once on caches that see neither, and exactly one
stores its answer; a claim held by a ClusterPeer that is gone is taken over; a release never frees another
ClusterPeer's claim."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime

import pytest
from jwcrypto import jwk

from contract.names import NAMESPACE, peer_secret_name, uuid_claim_name
from contract.peer_secret import PeerCredentials
from control import connstring, pki, uuid_claim
from control.clock import SYSTEM
from control.kube import CLUSTERPEERS, LEASES, SECRETS, KubeSession
from control.peerclient import Answer, PeerClient
from control.reconcilers.clusterpeer.join import Joiner
from control.reconcilers.clusterpeer.observe import observe
from control.reconcilers.memory import Memory, PeerMemory
from control.rules import join as join_rules
from control.rules.offer import build_offer
from tests.control.conftest import CLUSTER_UUID
from tests.ports import closed_port

pytestmark = pytest.mark.asyncio

NOW = datetime.datetime.now(datetime.timezone.utc)
INVITER_UUID = "a1b2c3d4-0000-4000-8000-0000000000aa"
CA = pki.create_ca(CLUSTER_UUID, now=NOW)
INVITER_CA = pki.create_ca(INVITER_UUID, now=NOW)
_jwks = jwk.JWKSet()
_jwks.add(jwk.JWK.generate(kty="EC", crv="P-256"))
INVITER_OFFER = build_offer(issuer_url="https://api.a.lab", jwks=_jwks.export(private_keys=False),
                            projects={"p": ["p"]}, capabilities=[], peering_version="0.1.0")


@pytest.fixture
async def kube(api):
    async with await KubeSession.connect(str(api[1])) as session:
        yield session


def _string(token_id: str) -> str:
    """A connection string of the inviting cluster INVITER_UUID (its join endpoint refuses connections at once)."""
    return connstring.encode(connstring.Invitation(
        cluster_uuid=INVITER_UUID, join_url=f"https://127.0.0.1:{closed_port()}", entrance_host="peering-gateway.a.lab",
        ca_pin=pki.spki_pin(INVITER_CA.cert_pem), token_id=token_id,
        token_secret="s" * 43, expires_at=NOW + datetime.timedelta(hours=1)))


async def _join_clusterpeer(kube: KubeSession, name: str, token_id: str) -> dict:
    return await kube.create(CLUSTERPEERS, {"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                                            "metadata": {"name": name},
                                            "spec": {"type": "Join", "join": {"connectionString": _string(token_id)}}})


def _observed(cp: dict):
    return observe(cp, now=datetime.datetime.now(datetime.timezone.utc), own_uuid=CLUSTER_UUID, ca=CA,
                   issuer=("https://kubernetes.default.svc.cluster.local", '{"keys": []}'), peer_secret=None,
                   local_capabilities={}, local_projects={}, projects_absent=None, peering_version="0")


class AcceptingInviter:
    """An inviting cluster that accepts every join with a valid answer, as one that skips its own claim (broken, or
    lying about who it peers with) would: the joiner's claim alone keeps it to one peering."""

    def __init__(self) -> None:
        self.requests = 0

    async def join(self, inv: connstring.Invitation, body: dict) -> Answer:
        self.requests += 1
        cert = pki.issue_client_cert(INVITER_CA, body["csr"], body["clusterUUID"], now=NOW)
        return Answer(200, join_rules.join_answer(
            cluster_uuid=INVITER_UUID, alias=body["alias"], entrance="peering-gateway.a.lab",
            ca_pem=INVITER_CA.cert_pem, certificate_pem=cert, csr_pem=pki.make_key_and_csr(INVITER_UUID).cert_pem,
            offer=INVITER_OFFER))


async def test_of_two_concurrent_joins_toward_one_cluster_exactly_one_stores_its_answer(kube):
    first = await _join_clusterpeer(kube, "to-a-1", "tok1")
    second = await _join_clusterpeer(kube, "to-a-2", "tok2")
    inviter = AcceptingInviter()
    # The caches see neither join: the check of the other ClusterPeers' UUIDs passes for both.
    joiner = Joiner(kube, inviter, Memory(), SYSTEM, namespace=NAMESPACE,  # type: ignore[arg-type]
                    entrance_host="peering-gateway.b.lab", uuids_in_use=lambda name: {})
    outcomes = await asyncio.gather(joiner.join(_observed(first), PeerMemory()),
                                    joiner.join(_observed(second), PeerMemory()))
    assert inviter.requests == 2
    claim = await kube.get(LEASES, uuid_claim_name(INVITER_UUID), NAMESPACE)
    holder = claim["spec"]["holderIdentity"]
    won, lost = (first, second) if holder == "to-a-1" else (second, first)
    by_name = dict(zip(("to-a-1", "to-a-2"), outcomes))
    assert by_name[holder].memory.join_error is None and by_name[holder].values.peer_uuid == INVITER_UUID
    loser = by_name[lost["metadata"]["name"]]
    assert loser.memory.join_error[1] == "ClusterUUIDInUse"
    assert holder in loser.memory.join_error[2] and INVITER_UUID in loser.memory.join_error[2]
    # What is stored: the winner's answer; of the loser, its key only.
    stored = {cp["metadata"]["name"]: PeerCredentials.from_secret(
        await kube.get(SECRETS, peer_secret_name(cp["metadata"]["name"]), NAMESPACE)) for cp in (first, second)}
    assert stored[holder].peer_ca and stored[holder].peer_uuid == INVITER_UUID
    assert stored[lost["metadata"]["name"]].client_key and not stored[lost["metadata"]["name"]].peer_ca
    assert [r["uid"] for r in claim["metadata"]["ownerReferences"]] == [won["metadata"]["uid"]]
    assert claim["metadata"]["labels"]["peering.deckhouse.io/uuid-claim"] == INVITER_UUID


async def test_a_join_that_could_not_store_its_answer_finds_its_claim_on_the_next_pass(kube):
    cp = await _join_clusterpeer(kube, "to-a", "tok1")
    await uuid_claim.claim(kube, NAMESPACE, cp, INVITER_UUID)  # a pass that claimed, then crashed
    client = PeerClient()
    try:
        joiner = Joiner(kube, client, Memory(), SYSTEM, namespace=NAMESPACE, entrance_host="peering-gateway.b.lab",
                        uuids_in_use=lambda name: {})
        # Its inviter is unreachable now: a failure that is retried keeps the claim.
        out = await joiner.join(_observed(cp), PeerMemory())
    finally:
        await client.close()
    assert out.memory.join_error[1] == "JoinEndpointUnreachable"
    claim = await kube.get(LEASES, uuid_claim_name(INVITER_UUID), NAMESPACE)
    assert claim["spec"]["holderIdentity"] == "to-a"
    # The next pass, with the key the first one stored, is answered: its claim is its own and the answer stored.
    secret = await kube.get(SECRETS, peer_secret_name("to-a"), NAMESPACE)
    observed = dataclasses.replace(_observed(cp), secret=secret, values=PeerCredentials.from_secret(secret))
    accepted = await Joiner(kube, AcceptingInviter(), Memory(), SYSTEM, namespace=NAMESPACE,  # type: ignore[arg-type]
                            entrance_host="peering-gateway.b.lab", uuids_in_use=lambda name: {}).join(
        observed, PeerMemory())
    assert accepted.memory.join_error is None and accepted.values.peer_uuid == INVITER_UUID


async def _deleting(kube: KubeSession, name: str, token_id: str) -> dict:
    """A ClusterPeer being deleted (a finalizer holds it, so garbage collection leaves what it owns): its claim
    counts as free, deterministically on both backends."""
    cp = await _join_clusterpeer(kube, name, token_id)
    await kube.patch(CLUSTERPEERS, name, {"metadata": {"finalizers": ["example.com/hold"]}})
    await uuid_claim.claim(kube, NAMESPACE, cp, INVITER_UUID)
    await kube.delete(CLUSTERPEERS, name)
    return cp


async def test_a_claim_of_a_clusterpeer_gone_is_taken_over_and_a_live_one_is_kept(kube):
    gone = await _deleting(kube, "gone", "tok3")
    await uuid_claim.claim(kube, NAMESPACE, gone, INVITER_UUID.upper())  # ours already (any case): no error
    again = await _join_clusterpeer(kube, "again", "tok3")
    other = await _join_clusterpeer(kube, "other", "tok4")
    await uuid_claim.claim(kube, NAMESPACE, again, INVITER_UUID)
    claim = await kube.get(LEASES, uuid_claim_name(INVITER_UUID), NAMESPACE)
    assert [r["uid"] for r in claim["metadata"]["ownerReferences"]] == [again["metadata"]["uid"]]
    with pytest.raises(uuid_claim.UUIDClaimed) as held:
        await uuid_claim.claim(kube, NAMESPACE, other, INVITER_UUID)
    assert held.value.holder == "again"
    assert "ClusterPeer again" in held.value.message(own_uuid=CLUSTER_UUID, side="the inviting cluster")
    # A release by a ClusterPeer that does not hold it keeps it; its holder's release frees it.
    await uuid_claim.release(kube, NAMESPACE, other, INVITER_UUID)
    assert await kube.get_or_none(LEASES, uuid_claim_name(INVITER_UUID), NAMESPACE) is not None
    await uuid_claim.release(kube, NAMESPACE, again, INVITER_UUID)
    assert await kube.get_or_none(LEASES, uuid_claim_name(INVITER_UUID), NAMESPACE) is None
    await uuid_claim.claim(kube, NAMESPACE, other, INVITER_UUID)


async def test_concurrent_takeovers_of_a_stale_claim_leave_one_holder(kube):
    await _deleting(kube, "gone", "tok5")
    peers = [await _join_clusterpeer(kube, f"taker-{i}", f"tok{i}x") for i in range(4)]
    results = await asyncio.gather(*(uuid_claim.claim(kube, NAMESPACE, cp, INVITER_UUID) for cp in peers),
                                   return_exceptions=True)
    won = [cp["metadata"]["name"] for cp, r in zip(peers, results) if r is None]
    assert len(won) == 1, results
    assert all(isinstance(r, uuid_claim.UUIDClaimed) and r.holder == won[0] for r in results if r is not None)
    claim = await kube.get(LEASES, uuid_claim_name(INVITER_UUID), NAMESPACE)
    assert claim["spec"]["holderIdentity"] == won[0]
