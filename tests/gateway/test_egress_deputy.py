"""The egress is no confused deputy: a local consumer reaches only the peer's Kubernetes API through
it, never the peer protocol or anything else the peer's entrance serves with this cluster's client certificate,
and only with a token that names exactly one audience, the capability's, so that the peer cannot replay it."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from gateway.admission import egress_path_allowed
from tests.gateway.support import CLUSTER, make_token
from tests.gateway.test_egress import EGRESS, _egress_gateway

AUDIENCE = f"peering.deckhouse.io/{CLUSTER}/read-pods"


@pytest.mark.parametrize("path", [
    b"/api", b"/api/v1/namespaces/default/pods?watch=true", b"/apis", b"/apis/apps/v1/deployments", b"/version",
    b"/version?timeout=32s", b"/openapi/v2", b"/openapi/v3", b"/openapi/v3/apis/apps/v1",
    b"/apis/rbac.authorization.k8s.io/v1/clusterroles/system%3Aaggregate-to-view",
])
def test_kubernetes_api_paths_pass_the_egress(path):
    assert egress_path_allowed(path)


@pytest.mark.parametrize("path", [
    b"/peering/v1/offer", b"/peering/v1/notify", b"/peering/v1/credentials", b"/peering/v1/certificate", b"/",
    b"", b"/logs", b"/metrics", b"/debug/pprof/", b"/healthz", b"/apix", b"/api/../peering/v1/offer",
    b"/api/%2e%2e/peering/v1/offer", b"/api/v1/%2F..%2Fpeering", b"/api/./v1", b"//peering/v1/offer",
    b"/api\\..\\peering", b"/versions", b"/openapi/v2/x", b"/api#x", b"/api/", b"/api/v1//pods",
    b"/api/%252e%252e/x", b"/ap%69", b"/api/v1/%5c..",
])
def test_anything_else_is_refused_at_the_egress(path):
    assert not egress_path_allowed(path)


async def test_the_peer_protocol_is_never_spoken_through_the_egress(gateway, pki, issuer_key, upstream, dex,
                                                                    handlers, session_for):
    egress = await _egress_gateway(pki, issuer_key, upstream, dex, handlers, gateway)
    try:
        s = session_for(egress, None)
        auth = {"Authorization": f"Bearer {make_token(issuer_key)}"}
        for method, path in [("GET", "/peers/peer/peering/v1/offer"), ("POST", "/peers/peer/peering/v1/notify"),
                             ("POST", "/peers/peer/peering/v1/credentials"),
                             ("POST", "/peers/peer/peering/v1/certificate"), ("GET", "/peers/peer/metrics"),
                             ("GET", "/peers/peer/api/../peering/v1/offer")]:
            async with s.request(method, EGRESS + path, headers=auth, json={} if method == "POST" else None) as r:
                body = await r.json()
                assert (r.status, body["reason"]) == (403, "PathNotAllowed"), (path, body)
                assert "Kubernetes API paths" in body["message"]
        # Neither the peer's handlers nor its API server saw any of it, and no token was reviewed for it.
        assert handlers.calls == [] and upstream.requests == [] and upstream.reviews == 0
        async with s.get(EGRESS + "/peers/peer/version", headers=auth) as r:
            assert r.status == 200
        assert upstream.requests[-1]["path"] == "/version"
    finally:
        await egress.stop()


@pytest.mark.parametrize("aud", [
    [AUDIENCE, "https://kubernetes.default.svc"], [AUDIENCE, AUDIENCE], [], 7, None,
])
async def test_a_token_with_more_than_the_capability_audience_is_refused(gateway, pki, issuer_key, upstream, dex,
                                                                          handlers, session_for, aud):
    egress = await _egress_gateway(pki, issuer_key, upstream, dex, handlers, gateway)
    try:
        s = session_for(egress, None)
        token = make_token(issuer_key, aud=aud) if aud is not None else make_token(issuer_key, extra={"aud": None})
        async with s.get(EGRESS + "/peers/peer/api/v1/pods", headers={"Authorization": f"Bearer {token}"}) as r:
            body = await r.json()
        assert (r.status, body["reason"]) == (401, "TokenAudienceTooBroad")
        assert "exactly one audience" in body["message"] and "status.access.audiences" in body["message"]
        assert token not in body["message"]
        assert upstream.requests == [] and upstream.reviews == 0 and dex.calls == 0
    finally:
        await egress.stop()


@pytest.mark.parametrize("aud", [AUDIENCE, [AUDIENCE]])
async def test_exactly_the_capability_audience_passes(gateway, pki, issuer_key, upstream, dex, handlers,
                                                       session_for, aud):
    egress = await _egress_gateway(pki, issuer_key, upstream, dex, handlers, gateway)
    try:
        s = session_for(egress, None)
        token = make_token(issuer_key, aud=aud)
        async with s.get(EGRESS + "/peers/peer/api/v1/pods", headers={"Authorization": f"Bearer {token}"}) as r:
            assert r.status == 200
    finally:
        await egress.stop()


async def _raw(port: int, ctx: ssl.SSLContext, host: str, data: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=host)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int([line.split(b":", 1)[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")][0])
            return int(head.split(b" ", 2)[1]), await reader.readexactly(length)
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, ssl.SSLError):
            pass


@pytest.mark.parametrize("line", [b"CONNECT api.x.lab:443 HTTP/1.1", b"TRACE /api/v1/pods HTTP/1.1",
                                  b"PROPFIND /api/v1/pods HTTP/1.1", b"TRACE /api/v1/pods HTTP/1.0"])
async def test_connect_and_trace_never_reach_the_upstream_on_the_entrance(gateway, pki, issuer_key, upstream,
                                                                          line):
    from tests.gateway.support import ENTRANCE_HOST, client_ssl
    data = line + b"\r\nHost: x\r\nAuthorization: Bearer " + make_token(issuer_key).encode() + b"\r\n\r\n"
    status, body = await _raw(gateway.entrance_port, client_ssl(pki), ENTRANCE_HOST, data)
    assert status == 405 and b'"reason":"MethodNotAllowed"' in body
    assert upstream.requests == []


@pytest.mark.parametrize("line", [b"CONNECT peering-gateway.x.lab:443 HTTP/1.1",
                                  b"TRACE /peers/peer/api/v1/pods HTTP/1.1"])
async def test_connect_and_trace_never_reach_the_peer_on_the_egress(gateway, pki, issuer_key, upstream, dex,
                                                                    handlers, line):
    from tests.gateway.support import client_ssl
    egress = await _egress_gateway(pki, issuer_key, upstream, dex, handlers, gateway)
    try:
        data = line + b"\r\nHost: x\r\nAuthorization: Bearer " + make_token(issuer_key).encode() + b"\r\n\r\n"
        status, body = await _raw(egress.egress_port, client_ssl(pki, None), "peering-gateway.d8-peering.svc", data)
        assert status == 405 and b'"reason":"MethodNotAllowed"' in body
        assert upstream.requests == [] and upstream.reviews == 0
    finally:
        await egress.stop()
