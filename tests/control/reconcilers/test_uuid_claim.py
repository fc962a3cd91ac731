"""The claim of a peer cluster UUID (control/uuid_claim.py) against an API server, on both backends: two joins of
this cluster toward one inviting cluster, run at once on caches that see neither, and exactly one goes on; a claim
held by a ClusterPeer that is gone is taken over; a release never frees another ClusterPeer's claim."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime

import pytest

from contract.names import NAMESPACE, peer_secret_name, uuid_claim_name
from contract.peer_secret import PeerCredentials
from control import connstring, pki, uuid_claim
from control.clock import SYSTEM
from control.kube import CLUSTERPEERS, LEASES, SECRETS, KubeSession
from control.peerclient import PeerClient
from control.reconcilers.clusterpeer.join import Joiner
from control.reconcilers.clusterpeer.observe import observe
from control.reconcilers.memory import Memory, PeerMemory
from tests.control.conftest import CLUSTER_UUID, closed_port

pytestmark = pytest.mark.asyncio

NOW = datetime.datetime.now(datetime.timezone.utc)
INVITER_UUID = "a1b2c3d4-0000-4000-8000-0000000000aa"
CA = pki.create_ca(CLUSTER_UUID, now=NOW)


@pytest.fixture
async def kube(api):
    async with await KubeSession.connect(str(api[1])) as session:
        yield session


def _string(token_id: str) -> str:
    """A connection string of the inviting cluster INVITER_UUID whose join endpoint refuses connections at once."""
    return connstring.encode(connstring.Invitation(
        cluster_uuid=INVITER_UUID, join_url=f"https://127.0.0.1:{closed_port()}", entrance_host="peering-gateway.a.lab",
        ca_pin=pki.spki_pin(pki.create_ca(INVITER_UUID, now=NOW).cert_pem), token_id=token_id,
        token_secret="s" * 43, expires_at=NOW + datetime.timedelta(hours=1)))


async def _join_clusterpeer(kube: KubeSession, name: str, token_id: str) -> dict:
    return await kube.create(CLUSTERPEERS, {"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                                            "metadata": {"name": name},
                                            "spec": {"type": "Join", "join": {"connectionString": _string(token_id)}}})


def _observed(cp: dict):
    return observe(cp, now=datetime.datetime.now(datetime.timezone.utc), own_uuid=CLUSTER_UUID, ca=CA,
                   issuer=("https://kubernetes.default.svc.cluster.local", '{"keys": []}'), peer_secret=None,
                   local_capabilities={}, local_projects={}, projects_absent=None, peering_version="0")


async def test_of_two_concurrent_joins_toward_one_cluster_exactly_one_sends_its_request(kube):
    first = await _join_clusterpeer(kube, "to-a-1", "tok1")
    second = await _join_clusterpeer(kube, "to-a-2", "tok2")
    client = PeerClient()
    try:
        # The caches see neither join: the check of the other ClusterPeers' UUIDs passes for both.
        joiner = Joiner(kube, client, Memory(), SYSTEM, namespace=NAMESPACE, entrance_host="peering-gateway.b.lab",
                        uuids_in_use=lambda name: {})
        outcomes = await asyncio.gather(joiner.join(_observed(first), PeerMemory()),
                                        joiner.join(_observed(second), PeerMemory()))
        claim = await kube.get(LEASES, uuid_claim_name(INVITER_UUID), NAMESPACE)
        won = first if claim["spec"]["holderIdentity"] == "to-a-1" else second
        # The winner's retry (its key stored) finds the claim its own and sends again.
        secret = await kube.get(SECRETS, peer_secret_name(won["metadata"]["name"]), NAMESPACE)
        retried = await joiner.join(dataclasses.replace(_observed(won), secret=secret,
                                                        values=PeerCredentials.from_secret(secret)), PeerMemory())
    finally:
        await client.close()
    assert retried.memory.join_error[1] == "JoinEndpointUnreachable"
    reasons = sorted(o.memory.join_error[1] for o in outcomes)
    # One request left the cluster (its endpoint refused the connection: retried); the other never left.
    assert reasons == ["ClusterUUIDInUse", "JoinEndpointUnreachable"], reasons
    holder = claim["spec"]["holderIdentity"]
    loser = next(o for o in outcomes if o.memory.join_error[1] == "ClusterUUIDInUse")
    assert holder in ("to-a-1", "to-a-2") and holder in loser.memory.join_error[2]
    assert INVITER_UUID in loser.memory.join_error[2]
    assert [r["uid"] for r in claim["metadata"]["ownerReferences"]] == [won["metadata"]["uid"]]
    assert claim["metadata"]["labels"]["peering.deckhouse.io/uuid-claim"] == INVITER_UUID


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
