"""The admission chain (gateway/admission.py) without a server: a GatewayState with real tokens, certificates and
registry, stand-in exchange and review calls, and the decision or refusal each request gets."""

from __future__ import annotations

import dataclasses
import datetime
import time

import pytest

from contract.errors import Refusal
from gateway.admission import (Admitted, ClientState, NeedsExchange, NeedsReview, admit_egress, admit_entrance,
                               admit_peer_call, certificate_in_force, closes_connection, complete, is_watch,
                               not_held)
from gateway.authority import Authority
from gateway.exchange import ExchangeCache
from gateway.metrics import Metrics
from gateway.registry import cert_fingerprints
from gateway.state import GatewayState
from gateway.tokens import VerifiedToken
from gateway.status import upstream_refusal
from gateway.upstream import UpstreamError
from tests.gateway.support import Upstream, DexState, gateway_config, make_token, registry_for

ENTRANCE = "peering-gateway.peer.lab"


@pytest.fixture
async def state(pki, issuer_key):
    st = GatewayState.open(gateway_config(pki, Upstream(port=1), DexState(port=1), max_body_bytes=100),
                           Metrics(), registry_for(pki, issuer_key, entrance=f"{ENTRANCE}:443"))
    exchanges: list[tuple[str, str]] = []

    async def exchange(connector: str, token: str) -> tuple[str, float]:
        exchanges.append((connector, token))
        return f"exchanged-{len(exchanges)}", 300.0

    async def review(key: str, token: str) -> tuple[str, float]:
        return "read-pods", 60.0

    real = st.exchange, st.reviews
    st.exchange, st.reviews = ExchangeCache(exchange, margin=30), ExchangeCache(review, margin=0)
    st.exchanges = exchanges  # type: ignore[attr-defined]
    yield st
    for cache in (st.exchange, st.reviews):
        await cache.close()
    st.exchange, st.reviews = real
    await st.close()


@pytest.fixture
def fp(pki):
    (fingerprint,) = cert_fingerprints(pki["peer"].cert_chain_pems[0].bytes())
    return fingerprint


def fields(token: str | None, *extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    auth = [(b"Authorization", b"Bearer " + token.encode())] if token else []
    return [(b"Host", b"x"), *auth, *extra]


def refusal(call, *args, **kwargs) -> tuple[int, str]:
    with pytest.raises(Refusal) as err:
        call(*args, **kwargs)
    return err.value.code, err.value.reason


async def test_a_peer_token_is_exchanged_once_then_admitted_from_the_cache(state, fp, issuer_key):
    token = make_token(issuer_key)
    client = ClientState()
    decision = admit_entrance(state, client, fp, b"GET", b"/api/v1/pods?watch=1", fields(token))
    assert isinstance(decision, NeedsExchange) and decision.connector == "peering-peer" and decision.watch
    assert (client.peer, client.capabilities, client.close) == ("peer", "read-pods", False)
    admitted = await complete(state, client, decision)
    assert admitted.head == (b"GET /api/v1/pods?watch=1 HTTP/1.1\r\nHost: api.x.lab\r\n"
                             b"Authorization: Bearer exchanged-1\r\n\r\n")
    again = admit_entrance(state, client, fp, b"GET", b"/api", fields(token, (b"Connection", b"close")))
    assert isinstance(again, Admitted) and b"Bearer exchanged-1" in again.head and not again.watch
    assert client.close and state.exchanges == [("peering-peer", token)]


async def test_a_body_is_framed_as_the_client_sent_it_and_bounded(state, fp, issuer_key):
    token = make_token(issuer_key)
    await complete(state, ClientState(), admit_entrance(state, ClientState(), fp, b"GET", b"/", fields(token)))
    posted = admit_entrance(state, ClientState(), fp, b"POST", b"/api", fields(token), length=5)
    assert isinstance(posted, Admitted) and posted.head.endswith(b"Content-Length: 5\r\n\r\n")
    streamed = admit_entrance(state, ClientState(), fp, b"PUT", b"/api", fields(token), chunked=True)
    assert streamed.head.endswith(b"Transfer-Encoding: chunked\r\n\r\n")
    assert refusal(admit_entrance, state, ClientState(), fp, b"POST", b"/", fields(token), length=101) == (
        413, "RequestEntityTooLarge")


async def test_entrance_refusals_name_the_rule_that_failed(state, fp, issuer_key):
    token = make_token(issuer_key)
    client = ClientState()
    assert refusal(admit_entrance, state, client, "unknown", b"GET", b"/", fields(token)) == (403, "PeerUnknown")
    assert client.peer == "-"
    assert refusal(admit_entrance, state, client, fp, b"GET", b"/", fields(token, (b"Impersonate-User", b"a"))) == (
        403, "ImpersonationRefused")
    assert client.peer == "peer"  # refusals after the peer is known are labelled with it
    assert refusal(admit_entrance, state, client, fp, b"GET", b"/", fields(None)) == (401, "TokenMissing")
    assert refusal(admit_entrance, state, client, fp, b"GET", b"/", fields(make_token(issuer_key, exp_in=-120))) == (
        401, "TokenExpired")
    # A token verified earlier that has expired since is refused from the cache, and forgotten.
    import hashlib
    stale = make_token(issuer_key)
    digest = hashlib.sha256(stale.encode()).digest()
    state.tokens._by_hash[digest] = VerifiedToken("peer", "system:serviceaccount:mod:controller",
                                                  frozenset({"read-pods"}), time.time() - 60)
    assert refusal(admit_entrance, state, client, fp, b"GET", b"/", fields(stale)) == (401, "TokenExpired")
    assert state.tokens.get(digest) is None
    assert state.exchanges == []  # Dex is never asked about a refused request


async def test_a_new_registry_forgets_verified_tokens(state, fp, pki, issuer_key):
    token = make_token(issuer_key)
    admit_entrance(state, ClientState(), fp, b"GET", b"/", fields(token))
    state.publish(registry_for(pki, issuer_key, generation=2, effective=("write-secrets",)))
    assert refusal(admit_entrance, state, ClientState(), fp, b"GET", b"/", fields(token)) == (
        401, "TokenAudienceMismatch")


async def test_peer_calls_are_admitted_by_operation_and_method(state, fp):
    client = ClientState()
    peer, op = admit_peer_call(state, client, fp, "POST", "/peering/v1/notify?x=1")
    assert (peer.name, op, client.peer) == ("peer", "notify", "peer")
    assert refusal(admit_peer_call, state, client, fp, "GET", "/peering/v1/notify") == (405, "MethodNotAllowed")
    assert refusal(admit_peer_call, state, client, fp, "GET", "/peering/v1/secrets") == (404, "UnknownOperation")
    assert refusal(admit_peer_call, state, client, None, "GET", "/peering/v1/offer") == (403, "PeerUnknown")


async def test_a_stream_ends_when_its_client_certificate_expires_if_that_comes_before_its_token(state, pki,
                                                                                              issuer_key):
    # A certificate that expires in 100 s, a token valid for 600 s: the stream it opens ends at the former.
    ends = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=100)
    leaf = pki["ca"].issue_cert("short.peer", not_after=ends)
    (short,) = cert_fingerprints(leaf.cert_chain_pems[0].bytes())
    state.publish(registry_for({**pki, "peer": leaf}, issuer_key, generation=2))
    client = ClientState()
    admit_entrance(state, client, short, b"GET", b"/api/v1/pods?watch=1", fields(make_token(issuer_key)))
    assert client.authority is not None and client.authority.expires == int(ends.timestamp())
    # The dates are the registry's copy: one past them is refused by the same rule as at the handshake's time.
    peer = state.registry.peers["peer"]
    assert certificate_in_force(peer, short, ends.timestamp() - 1) == int(ends.timestamp())
    assert refusal(certificate_in_force, peer, short, ends.timestamp() + 1) == (401, "CertificateExpired")
    assert refusal(certificate_in_force, peer, "not-its-own", time.time()) == (401, "CertificateExpired")


async def test_an_egress_request_is_reviewed_then_sent_to_the_peer_with_the_consumers_token(state, issuer_key):
    token = make_token(issuer_key)
    client = ClientState()
    decision = admit_egress(state, client, b"GET", b"/peers/peer/api/v1/pods?limit=5",
                            fields(token, (b"X-Forwarded-For", b"1.2.3.4")))
    assert isinstance(decision, NeedsReview) and decision.key == "peer/1" and decision.peer.name == "peer"
    assert client.capabilities == "-"
    admitted = await complete(state, client, decision)
    assert client.capabilities == "read-pods"
    assert admitted.head == (f"GET /api/v1/pods?limit=5 HTTP/1.1\r\nHost: {ENTRANCE}:443\r\n".encode()
                             + b"Authorization: Bearer " + token.encode() + b"\r\n\r\n")


async def test_egress_refusals_name_the_rule_that_failed(state, pki, issuer_key):
    token = make_token(issuer_key)
    client = ClientState()
    assert refusal(admit_egress, state, client, b"GET", b"/api/v1/pods", fields(token)) == (404, "NotFound")
    assert refusal(admit_egress, state, client, b"GET", b"/peers/nobody/api", fields(token)) == (404, "PeerNotFound")
    assert refusal(admit_egress, state, client, b"GET", b"/peers/peer/api", fields(None)) == (401, "TokenMissing")
    assert refusal(admit_egress, state, client, b"GET", b"/peers/peer/api",
                   fields(token, (b"Upgrade", b"websocket"))) == (400, "UpgradeRefused")
    registry = state.registry
    peer = registry.peers["peer"]
    state.publish(dataclasses.replace(registry, peers={"peer": dataclasses.replace(peer, effective=frozenset())}))
    assert refusal(admit_egress, state, client, b"GET", b"/peers/peer/api", fields(token)) == (
        403, "NoEffectiveCapability")
    state.publish(dataclasses.replace(registry, peers={"peer": dataclasses.replace(peer, entrance=None)}))
    assert refusal(admit_egress, state, client, b"GET", b"/peers/peer/api", fields(token)) == (
        503, "PeerNotConnected")


def test_upstream_failures_and_closing_refusals():
    assert (upstream_refusal(UpstreamError("connect", "ConnectionRefusedError")).code,
            upstream_refusal(UpstreamError("connect", "x")).reason) == (503, "UpstreamUnavailable")
    failed = upstream_refusal(UpstreamError("request", "malformed response"))
    assert (failed.code, failed.reason) == (502, "UpstreamFailed") and "malformed response" in failed.message
    # A peer's entrance refusing our client certificate is the ClusterPeer's reason, for the egress (the peering
    # is named); for the entrance's API server, an upstream failure like any other.
    refused = upstream_refusal(UpstreamError("certificate_refused", "CERTIFICATE_EXPIRED"), "to-a")
    assert (refused.code, refused.reason) == (503, "PeerRefusedCertificate")
    assert "to-a" in refused.message and "checks its dates in the handshake" in refused.message
    assert "update the module there" in refused.message
    new_ca = upstream_refusal(UpstreamError("certificate_refused", "UNKNOWN_CA"), "to-a")
    assert "enabled again" in new_ca.message and "anew on both clusters" in new_ca.message
    revoked = upstream_refusal(UpstreamError("certificate_refused", "CERTIFICATE_UNKNOWN"), "to-a")
    assert "revoked" in revoked.message and "anew" not in revoked.message
    assert upstream_refusal(UpstreamError("certificate_refused", "UNKNOWN_CA")).reason == "UpstreamFailed"
    assert closes_connection(Refusal(403, "PeerUnknown", "")) and closes_connection(Refusal(400, "UpgradeRefused", ""))
    assert closes_connection(Refusal(401, "CertificateExpired", ""))
    assert closes_connection(Refusal(401, "CertificateNotYetValid", ""))
    assert not closes_connection(Refusal(401, "TokenExpired", ""))
    assert [is_watch(t) for t in (b"/a?watch=1", b"/a?x=1&watch=true", b"/a?watch=false", b"/watch", b"/a")] == [
        True, True, False, False, False]


def test_a_request_held_back_says_whether_its_token_expired_or_its_grant_was_withdrawn():
    """What admitted a request may end while it waited (for Dex, a review, a connection): an expiry is
    TokenExpired, as admission would have said a moment later; a newer registry is a withdrawal."""
    def authority(expires: float) -> Authority:
        return Authority("peer", frozenset({"read-pods"}), ("mod", "controller"), expires)

    gone = not_held(authority(time.time() - 1))
    assert (gone.code, gone.reason) == (401, "TokenExpired")
    withdrawn = not_held(authority(time.time() + 600))
    assert (withdrawn.code, withdrawn.reason) == (403, "NoEffectiveCapability") and "withdrawn" in withdrawn.message
    assert not_held(None).reason == "NoEffectiveCapability"
