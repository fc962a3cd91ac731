"""A registry behind the status (gateway/catchup.py): a request for a capability the ClusterPeer opens here but
that is not effective in this registry yet waits, bounded, for a newer registry; any other refusal is at once."""

from __future__ import annotations

import asyncio
import dataclasses
from types import MappingProxyType

import pytest

from contract.errors import Refusal
from gateway.admission import (ClientState, NeedsReview, admit_egress, admit_entrance, admit_peer_call, caught_up,
                               complete)
from gateway.catchup import AwaitRegistry
from gateway.exchange import ExchangeCache
from gateway.metrics import Metrics
from gateway.registry import Registry, cert_fingerprints
from gateway.server import Gateway
from gateway.state import GatewayState
from tests.gateway.support import (ENTRANCE_HOST, PEER_UUID, DexState, Upstream, b64, gateway_config, load_certs,
                                   make_token, registry_for)

URL = f"https://{ENTRANCE_HOST}"


def registry(pki, issuer_key, *, generation: int, effective: tuple[str, ...], opened: tuple[str, ...] = ("read-pods",),
             entrance: str | None = "peering-gateway.peer.lab:443") -> Registry:
    """registry_for's peer, with spec.capabilities `opened` (what the ClusterPeer opens here)."""
    base = registry_for(pki, issuer_key, generation=generation, effective=effective, entrance=entrance)
    peers = {n: dataclasses.replace(p, opened=frozenset(opened)) for n, p in base.peers.items()}
    by_fp = {fp: peers[p.name] for fp, p in base.by_fingerprint.items()}
    return dataclasses.replace(base, peers=MappingProxyType(peers), by_fingerprint=MappingProxyType(by_fp))


def fields(token: str) -> list[tuple[bytes, bytes]]:
    return [(b"Host", b"x"), (b"Authorization", b"Bearer " + token.encode())]


@pytest.fixture
async def state(pki, issuer_key):
    st = GatewayState.open(gateway_config(pki, Upstream(port=1), DexState(port=1), registry_catch_up=5.0),
                           Metrics(), registry(pki, issuer_key, generation=1, effective=()))
    reviews: list[str] = []

    async def exchange(connector: str, token: str) -> tuple[str, float]:
        return "exchanged", 300.0

    async def review(key: str, token: str) -> tuple[str, float]:
        reviews.append(key)
        return "read-pods", 60.0

    real = st.exchange, st.reviews
    st.exchange, st.reviews = ExchangeCache(exchange, margin=30), ExchangeCache(review, margin=0)
    st.reviewed = reviews  # type: ignore[attr-defined]
    yield st
    for cache in (st.exchange, st.reviews):
        await cache.close()
    st.exchange, st.reviews = real
    await st.close()


@pytest.fixture
def fp(pki):
    (fingerprint,) = cert_fingerprints(pki["peer"].cert_chain_pems[0].bytes())
    return fingerprint


async def settled(state, client, admit, *args):
    """What the callers of admission do: admit, wait for the registries an AwaitRegistry asks for, complete."""
    decision = await caught_up(state, admit(state, client, *args), admit, state, client, *args)
    return await complete(state, client, decision)


async def _pending(task: asyncio.Task) -> None:
    """Let the task run until it waits (for the next registry); it must not have finished."""
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done(), task


async def test_an_entrance_request_for_an_opened_capability_waits_for_the_registry_that_serves_it(
        state, fp, pki, issuer_key):
    client = ClientState()
    args = (fp, b"GET", b"/api/v1/pods?watch=1", fields(make_token(issuer_key)))
    decision = admit_entrance(state, client, *args)
    assert isinstance(decision, AwaitRegistry) and decision.refusal.reason == "TokenAudienceMismatch"
    assert decision.generation == 1 and decision.until == pytest.approx(asyncio.get_running_loop().time() + 5, abs=1)
    task = asyncio.ensure_future(settled(state, client, admit_entrance, *args))
    await _pending(task)
    state.publish(registry(pki, issuer_key, generation=2, effective=()))  # a registry still behind: waits on
    await _pending(task)
    state.publish(registry(pki, issuer_key, generation=3, effective=("read-pods",)))
    admitted = await asyncio.wait_for(task, 5)
    assert b"Authorization: Bearer exchanged" in admitted.head and admitted.watch
    assert client.capabilities == "read-pods"


def _without_peer(base: Registry, *, generation: int, pending: frozenset[str]) -> Registry:
    return dataclasses.replace(base, peers=MappingProxyType({}), by_fingerprint=MappingProxyType({}),
                               generation=generation, pending=pending)


async def test_a_certificate_unknown_while_a_peering_is_mid_exchange_waits_for_the_registry_that_has_it(
        state, fp, pki, issuer_key):
    """The joiner uses the certificate we issued before our registry has the peering (its Secret is complete only
    once the joiner delivered ours): PeerUnknown waits for it while some ClusterPeer is pending, never otherwise."""
    live = registry(pki, issuer_key, generation=3, effective=("read-pods",))
    state.publish(_without_peer(live, generation=2, pending=frozenset({"peer"})))
    client = ClientState()
    args = (fp, b"GET", b"/api/v1/pods", fields(make_token(issuer_key)))
    decision = admit_entrance(state, client, *args)
    assert isinstance(decision, AwaitRegistry) and decision.refusal.reason == "PeerUnknown"
    task = asyncio.ensure_future(settled(state, client, admit_entrance, *args))
    await _pending(task)
    state.publish(live)
    admitted = await asyncio.wait_for(task, 5)
    assert b"Authorization: Bearer exchanged" in admitted.head and client.peer == "peer"
    # No peering mid-exchange (a revoked peer's certificate): refused at once.
    state.publish(_without_peer(live, generation=4, pending=frozenset()))
    with pytest.raises(Refusal, match="belongs to no live peering"):
        admit_entrance(state, ClientState(), fp, b"GET", b"/api", fields(make_token(issuer_key)))
    # Mid-exchange, but no newer registry in time: the refusal.
    state.limits.registry_catch_up = 0.2
    state.publish(_without_peer(live, generation=5, pending=frozenset({"other"})))
    with pytest.raises(Refusal, match="PeerUnknown|belongs to no live peering"):
        await asyncio.wait_for(settled(state, ClientState(), admit_entrance, fp, b"GET", b"/api",
                                       fields(make_token(issuer_key))), 5)


async def test_a_peer_call_with_a_certificate_unknown_mid_exchange_waits_for_the_registry_that_has_it(
        state, fp, pki, issuer_key):
    """A joiner delivers its half the moment the join is answered, maybe to a replica whose registry lacks the
    peering yet: the peer protocol waits the same bounded way as a proxied request, and only while a ClusterPeer
    is mid-exchange."""
    live = registry(pki, issuer_key, generation=3, effective=())
    state.publish(_without_peer(live, generation=2, pending=frozenset({"peer"})))
    client = ClientState()
    decision = admit_peer_call(state, client, fp, "POST", "/peering/v1/credentials")
    assert isinstance(decision, AwaitRegistry) and decision.refusal.reason == "PeerUnknown"
    task = asyncio.ensure_future(caught_up(state, decision, admit_peer_call, state, client, fp, "POST",
                                           "/peering/v1/credentials"))
    await _pending(task)
    state.publish(live)
    peer, op = await asyncio.wait_for(task, 5)
    assert (peer.name, op, client.peer) == ("peer", "credentials", "peer")
    # Nothing mid-exchange: refused at once, as a revoked peer's certificate is.
    state.publish(_without_peer(live, generation=4, pending=frozenset()))
    with pytest.raises(Refusal, match="belongs to no live peering"):
        admit_peer_call(state, ClientState(), fp, "POST", "/peering/v1/credentials")


async def test_no_newer_registry_in_time_answers_the_refusal(state, fp, issuer_key):
    state.limits.registry_catch_up = 0.2
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(Refusal) as refused:
        await asyncio.wait_for(settled(state, ClientState(), admit_entrance, fp, b"GET", b"/api",
                                       fields(make_token(issuer_key))), 5)
    assert (refused.value.code, refused.value.reason) == (401, "TokenAudienceMismatch")
    assert loop.time() - start >= 0.2


async def test_a_capability_not_opened_or_not_consumed_is_refused_at_once(state, fp, pki, issuer_key):
    state.publish(registry(pki, issuer_key, generation=2, effective=(), opened=()))
    with pytest.raises(Refusal, match="TokenAudienceMismatch"):
        admit_entrance(state, ClientState(), fp, b"GET", b"/api", fields(make_token(issuer_key)))
    state.publish(registry(pki, issuer_key, generation=3, effective=()))
    with pytest.raises(Refusal, match="TokenAudienceMismatch"):  # opened, but this subject is no consumer of it
        admit_entrance(state, ClientState(), fp, b"GET", b"/api",
                       fields(make_token(issuer_key, sub="system:serviceaccount:mod:other")))
    state.limits.registry_catch_up = 0
    with pytest.raises(Refusal, match="TokenAudienceMismatch"):  # waiting turned off
        admit_entrance(state, ClientState(), fp, b"GET", b"/api", fields(make_token(issuer_key)))


async def test_an_egress_request_waits_for_the_registry_that_serves_its_audience(state, pki, issuer_key):
    token = make_token(issuer_key, aud=[f"peering.deckhouse.io/{PEER_UUID}/read-pods"])
    client = ClientState()
    args = (b"GET", b"/peers/peer/api/v1/pods", fields(token))
    decision = admit_egress(state, client, *args)
    assert isinstance(decision, AwaitRegistry)  # NoEffectiveCapability is not answered yet
    assert decision.refusal.reason == "NoEffectiveCapability"
    task = asyncio.ensure_future(settled(state, client, admit_egress, *args))
    await _pending(task)
    assert state.reviewed == []  # no TokenReview asked for audiences the registry does not serve yet
    state.publish(registry(pki, issuer_key, generation=2, effective=("read-pods",)))
    admitted = await asyncio.wait_for(task, 5)
    assert admitted.head.startswith(b"GET /api/v1/pods HTTP/1.1\r\n") and state.reviewed == ["peer/2"]
    assert client.capabilities == "read-pods"
    # A capability this ClusterPeer does not open: NoEffectiveCapability at once.
    state.publish(registry(pki, issuer_key, generation=3, effective=(), opened=()))
    with pytest.raises(Refusal, match="NoEffectiveCapability"):
        admit_egress(state, ClientState(), b"GET", b"/peers/peer/api/v1/pods", fields(token))


async def test_over_tls_both_entrance_paths_answer_once_the_registry_catches_up(pki, issuer_key, upstream, dex,
                                                                                 handlers, session_for):
    gw = Gateway(gateway_config(pki, upstream, dex, registry_catch_up=10.0), handlers)
    await gw.start()
    try:
        load_certs(gw, pki)
        gw.publish(registry(pki, issuer_key, generation=1, effective=()))
        session = session_for(gw)
        token = make_token(issuer_key)
        auth = {"Authorization": f"Bearer {token}"}

        async def call(method: str, body: bytes | None) -> int:
            async with session.request(method, URL + "/api/v1/namespaces/x/configmaps", data=body,
                                       headers=auth) as r:
                return r.status

        # A plain GET and a request with a body both wait.
        calls = [asyncio.ensure_future(call("GET", None)), asyncio.ensure_future(call("POST", b"{}"))]
        async with asyncio.timeout(10):
            while gw.metrics.registry.get_sample_value("peering_gateway_requests_in_flight",
                                                       {"listener": "entrance"}) != 2:
                await asyncio.sleep(0.01)
        assert not any(c.done() for c in calls)
        gw.publish(registry(pki, issuer_key, generation=2, effective=("read-pods",)))
        assert await asyncio.wait_for(asyncio.gather(*calls), 10) == [200, 200]
        assert dex.calls == 1
    finally:
        await gw.stop()


def test_the_registry_keeps_what_the_clusterpeer_opens(pki, issuer_key):
    base = registry_for(pki, issuer_key)
    cp = {"metadata": {"name": "peer"}, "spec": {"capabilities": ["read-pods", 7, "write-pods"]},
          "status": {"effectiveCapabilities": ["read-pods"]}}
    secret = {"metadata": {"name": "peer-peer"}, "data": {"issued.crt": b64(pki["peer"].cert_chain_pems[0].bytes())}}
    peer = Registry.from_objects(cluster_uuid=base.cluster_uuid, clusterpeers=[cp], peer_secrets=[secret],
                                 capabilities=[], generation=1).peers["peer"]
    assert peer.opened == {"read-pods", "write-pods"} and peer.effective == {"read-pods"}


async def test_before_the_peers_first_offer_its_consumers_token_waits_for_the_issuer(state, fp, pki, issuer_key):
    issuer_less = registry(pki, issuer_key, generation=2, effective=())
    peers = {n: dataclasses.replace(p, issuer_url=None, jwks_json=None) for n, p in issuer_less.peers.items()}
    state.publish(dataclasses.replace(issuer_less, peers=MappingProxyType(peers), by_fingerprint=MappingProxyType(
        {f: peers[p.name] for f, p in issuer_less.by_fingerprint.items()})))
    client = ClientState()
    args = (fp, b"GET", b"/api", fields(make_token(issuer_key)))
    decision = admit_entrance(state, client, *args)
    assert isinstance(decision, AwaitRegistry) and decision.refusal.reason == "PeerIssuerUnknown"
    task = asyncio.ensure_future(settled(state, client, admit_entrance, *args))
    await _pending(task)
    state.publish(registry(pki, issuer_key, generation=3, effective=("read-pods",)))
    assert b"Bearer exchanged" in (await asyncio.wait_for(task, 5)).head


async def test_an_egress_request_for_a_peering_the_registry_lacks_yet_waits_for_it(state, pki, issuer_key):
    # The ClusterPeer exists, its Secret is not in this registry yet.
    state.publish(dataclasses.replace(registry_for(pki, issuer_key, generation=2, peers=()),
                                      pending=frozenset({"peer"})))
    token = make_token(issuer_key, aud=[f"peering.deckhouse.io/{PEER_UUID}/read-pods"])
    client = ClientState()
    args = (b"GET", b"/peers/peer/api/v1/pods?watch=1", fields(token))
    decision = admit_egress(state, client, *args)
    assert isinstance(decision, AwaitRegistry) and decision.refusal.reason == "PeerNotFound"
    task = asyncio.ensure_future(settled(state, client, admit_egress, *args))
    await _pending(task)
    state.publish(registry(pki, issuer_key, generation=3, effective=("read-pods",)))
    admitted = await asyncio.wait_for(task, 5)
    assert admitted.watch and state.reviewed == ["peer/3"]
    assert client.peer == "peer"
    # A token of no local consumer, or none at all: PeerNotFound at once; so for a ClusterPeer that does not exist.
    state.publish(dataclasses.replace(registry_for(pki, issuer_key, generation=4, peers=()),
                                      pending=frozenset({"peer"})))
    for other in (fields(make_token(issuer_key, sub="system:serviceaccount:mod:other",
                                    aud=[f"peering.deckhouse.io/{PEER_UUID}/read-pods"])), [(b"Host", b"x")]):
        with pytest.raises(Refusal, match="PeerNotFound"):
            admit_egress(state, ClientState(), b"GET", b"/peers/peer/api/v1/pods", other)
    with pytest.raises(Refusal, match="PeerNotFound"):
        admit_egress(state, ClientState(), b"GET", b"/peers/nobody/api/v1/pods", fields(token))


def test_the_registry_names_the_clusterpeers_whose_exchange_is_under_way(pki, issuer_key):
    """Only a ClusterPeer mid-exchange arms the wait (and keeps a connection of a certificate no live peering
    holds): an Invite whose token was used, a Join not refused for good; never an unused Invite, for its whole
    TTL, nor a Join that ended in Error, nor one being deleted."""
    live = registry_for(pki, issuer_key)
    cps = [{"metadata": {"name": "redeemed"}, "spec": {"type": "Invite"}, "status": {"invite": {"used": True}}},
           {"metadata": {"name": "joining"}, "spec": {"type": "Join"}, "status": {"phase": "Pending"}},
           {"metadata": {"name": "just-made"}, "spec": {"type": "Join"}},
           {"metadata": {"name": "unused"}, "spec": {"type": "Invite"}, "status": {"invite": {"used": False}}},
           {"metadata": {"name": "not-issued-yet"}, "spec": {"type": "Invite"}},
           {"metadata": {"name": "refused"}, "spec": {"type": "Join"}, "status": {"phase": "Error"}},
           {"metadata": {"name": "leaving", "deletionTimestamp": "2026-12-01T00:00:00Z"},
            "spec": {"type": "Join"}, "status": {"phase": "Pending"}}]
    reg = Registry.from_objects(cluster_uuid=live.cluster_uuid, clusterpeers=cps, peer_secrets=[], capabilities=[],
                                generation=1)
    assert reg.pending == {"redeemed", "joining", "just-made"} and not reg.peers
    import pickle
    assert pickle.loads(pickle.dumps(reg)).pending == reg.pending  # as the workers receive it
    only_unused = Registry.from_objects(cluster_uuid=live.cluster_uuid, clusterpeers=cps[3:], peer_secrets=[],
                                        capabilities=[], generation=2)
    assert only_unused.pending == frozenset()
    assert not only_unused.certificate_may_come("f" * 64, 2.0) and reg.certificate_may_come("f" * 64, 2.0)
    assert not reg.certificate_may_come("f" * 64, 0) and not reg.certificate_may_come(None, 2.0)


async def test_the_wait_is_plain_data_and_keeps_its_bound_across_registries_still_behind(state, fp, issuer_key):
    """Admission only says what to wait for: the caller admits again with the bound, which a newer registry that is
    still behind does not extend; past it, the request gets its registry's answer without waiting."""
    loop = asyncio.get_running_loop()
    args = (fp, b"GET", b"/api", fields(make_token(issuer_key)))
    decision = admit_entrance(state, ClientState(), *args)
    assert isinstance(decision, AwaitRegistry) and not any(callable(getattr(decision, n)) for n in decision.__slots__)
    until = loop.time() + 0.5
    again = admit_entrance(state, ClientState(), *args, until=until)
    assert isinstance(again, AwaitRegistry) and again.until == until
    with pytest.raises(Refusal, match="TokenAudienceMismatch|audience"):
        admit_entrance(state, ClientState(), *args, until=loop.time())


async def test_past_its_bound_an_egress_request_for_a_capability_not_served_yet_goes_to_the_review(
        state, pki, issuer_key):
    state.publish(registry(pki, issuer_key, generation=2, effective=("write-pods",), opened=("read-pods",
                                                                                            "write-pods")))
    token = make_token(issuer_key, aud=[f"peering.deckhouse.io/{PEER_UUID}/read-pods"])
    args = (b"GET", b"/peers/peer/api/v1/pods", fields(token))
    assert isinstance(admit_egress(state, ClientState(), *args), AwaitRegistry)
    decision = admit_egress(state, ClientState(), *args, until=asyncio.get_running_loop().time())
    assert isinstance(decision, NeedsReview) and decision.key == "peer/2"
