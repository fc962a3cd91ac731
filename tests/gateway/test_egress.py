"""The egress for real: a local consumer's request goes through TokenReview and the consumer check, then over
pooled mTLS to the peer's entrance (here another Gateway), whose token checks and exchange then apply."""

from __future__ import annotations

import aiohttp

from tests.gateway.support import CLUSTER, ENTRANCE_HOST, gateway_config, load_certs, make_token, registry_for
from gateway.server import Gateway
from tests.ports import closed_port

EGRESS = "https://peering-gateway.d8-peering.svc"


async def _egress_gateway(pki, issuer_key, upstream, dex, handlers, target: Gateway, **limits) -> Gateway:
    cfg = gateway_config(pki, upstream, dex, **limits)
    cfg.resolve[ENTRANCE_HOST] = f"127.0.0.1:{target.entrance_port}"
    gw = Gateway(cfg, handlers)
    await gw.start()
    load_certs(gw, pki)
    # Our view of the peer: its UUID is the target's cluster UUID, its entrance the target gateway.
    reg = registry_for(pki, issuer_key, entrance=f"{ENTRANCE_HOST}:443")
    peer = reg.peers["peer"]
    from dataclasses import replace
    peer = replace(peer, uuid=CLUSTER)
    gw.publish(replace(reg, peers={"peer": peer}, by_fingerprint={fp: peer for fp in peer.fingerprints}))
    return gw


async def test_consumer_reaches_the_peer_api_through_egress_and_entrance(
        gateway, pki, issuer_key, upstream, dex, handlers, session_for):
    egress = await _egress_gateway(pki, issuer_key, upstream, dex, handlers, gateway)
    try:
        s = session_for(egress, None)
        token = make_token(issuer_key)
        for _ in range(3):
            async with s.get(EGRESS + "/peers/peer/api/v1/namespaces/default/pods?limit=5",
                             headers={"Authorization": f"Bearer {token}", "X-Forwarded-For": "1.2.3.4"}) as r:
                assert r.status == 200
                body = await r.json()
        # The entrance of the peer exchanged the consumer's token; the API server saw only the exchanged one.
        assert body["seen"]["auth"] == "Bearer exchanged-1"
        assert upstream.requests[-1]["path"] == "/api/v1/namespaces/default/pods?limit=5"
        assert all(k.lower() != "x-forwarded-for" for k, _ in upstream.requests[-1]["headers"])
        assert upstream.reviews == 1 and dex.calls == 1  # both cached by token hash
        # Pooled: three requests, one connection to the peer's entrance.
        assert gateway.state.connections.count() == 1
    finally:
        await egress.stop()


async def test_egress_refusals(gateway, pki, issuer_key, upstream, dex, handlers, session_for):
    egress = await _egress_gateway(pki, issuer_key, upstream, dex, handlers, gateway)
    try:
        s = session_for(egress, None)

        async def reason(path: str, token: str | None, **headers) -> tuple[int, str]:
            if token:
                headers["Authorization"] = f"Bearer {token}"
            async with s.get(EGRESS + path, headers=headers) as r:
                return r.status, (await r.json())["reason"]

        good = make_token(issuer_key)
        assert await reason("/peers/nobody/api", good) == (404, "PeerNotFound")
        assert await reason("/api/v1/pods", good) == (404, "NotFound")
        assert await reason("/peers/peer/api", None) == (401, "TokenMissing")
        assert await reason("/peers/peer/api", make_token(issuer_key, iss="https://other")) == (401, "TokenInvalid")
        assert await reason("/peers/peer/api", make_token(issuer_key, sub="system:serviceaccount:mod:other")) == (
            403, "NotAConsumer")
        calls = dex.calls
        assert await reason("/peers/peer/api", make_token(issuer_key, aud=["peering.deckhouse.io/x/read-pods"])) == (
            401, "TokenAudienceMismatch")
        assert dex.calls == calls == 0 and upstream.requests == []  # refused here, never sent to the peer
        assert await reason("/peers/peer/api", good, **{"Impersonate-User": "admin"}) == (403, "ImpersonationRefused")
    finally:
        await egress.stop()


async def test_egress_reports_an_unreachable_peer(pki, issuer_key, upstream, dex, handlers, session_for, gateway):
    egress = await _egress_gateway(pki, issuer_key, upstream, dex, handlers, gateway)
    try:
        port = closed_port()
        await egress.state.resolver.close()
        egress.state.resolver._overrides[ENTRANCE_HOST] = ("127.0.0.1", port)
        s = session_for(egress, None)
        async with s.get(EGRESS + "/peers/peer/api", headers={"Authorization": f"Bearer {make_token(issuer_key)}"}) as r:
            assert (r.status, (await r.json())["reason"]) == (503, "UpstreamUnavailable")
    finally:
        await egress.stop()


async def test_a_token_past_its_expiry_is_token_expired_though_the_api_server_would_still_review_it(
        gateway, pki, issuer_key, upstream, dex, handlers, session_for):
    """kube-apiserver authenticates its own tokens for a minute past `exp` (go-jose's leeway): the egress refuses
    such a token as expired, as the peer's entrance does, not as a withdrawal (403 NoEffectiveCapability) and not
    later as TokenInvalid."""
    egress = await _egress_gateway(pki, issuer_key, upstream, dex, handlers, gateway)
    try:
        s = session_for(egress, None)
        for past in (1, 20, 59, 120):
            async with s.get(EGRESS + "/peers/peer/api", headers={
                    "Authorization": f"Bearer {make_token(issuer_key, exp_in=-past)}"}) as r:
                assert (r.status, (await r.json())["reason"]) == (401, "TokenExpired"), past
        assert upstream.reviews == 0 and dex.calls == 0  # decided here: never reviewed, never sent to the peer
    finally:
        await egress.stop()


async def test_a_peer_refusing_our_client_certificate_is_peer_refused_certificate(
        gateway, pki, issuer_key, upstream, dex, handlers, session_for):
    """The peer's entrance refuses our client certificate at the handshake (a TLS alert: here one of a CA it does not
    know, as after its module was disabled and enabled again): the consumer gets the ClusterPeer's reason,
    PeerRefusedCertificate, with what its administrator does, not 502 UpstreamFailed."""
    import trustme
    from dataclasses import replace

    egress = await _egress_gateway(pki, issuer_key, upstream, dex, handlers, gateway)
    try:
        foreign = trustme.CA().issue_cert("peer.foreign")
        reg = egress.state.registry
        peer = replace(reg.peers["peer"], client_cert_pem=foreign.cert_chain_pems[0].bytes(),
                       client_key_pem=foreign.private_key_pem.bytes())
        egress.publish(replace(reg, generation=2, peers={"peer": peer}))
        s = session_for(egress, None)
        async with s.get(EGRESS + "/peers/peer/api", headers={"Authorization": f"Bearer {make_token(issuer_key)}"}) as r:
            body = await r.json()
        assert (r.status, body["reason"], body["details"]["causes"][0]["reason"]) == (
            503, "PeerRefusedCertificate", "PeerRefusedCertificate")
        assert "unknown_ca" in body["message"] and "anew on both clusters" in body["message"]
        assert egress.metrics.upstream_errors.labels("egress", "certificate_refused")._value.get() == 1
        assert gateway.metrics.handshake_failures.labels("entrance", "untrusted_certificate")._value.get() == 1
    finally:
        await egress.stop()
