"""The lab's edge: the lab PKI, the ingress-nginx stand-in and the TCP passthrough in front of TLS listeners."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509

from lab import certs
from lab.ingress import Ingress, TcpPassthrough, forward_headers


@pytest.fixture(scope="module")
def pki() -> certs.ClusterPKI:
    return certs.cluster_pki("e")


def test_cluster_pki_names_and_keys(pki):
    def sans(ck):
        ext = ck.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return sorted(ext.get_values_for_type(x509.DNSName)), [str(i) for i in ext.get_values_for_type(x509.IPAddress)]

    assert sans(pki.api) == (["api.e.lab"], ["127.0.0.1"])
    assert sans(pki.dex) == (["dex.e.lab"], [])
    assert sans(pki.ingress) == (["peering.e.lab"], [])
    subject = pki.admin.cert.subject
    assert subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "admin"
    assert [a.value for a in subject.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME)] == ["system:masters"]
    assert pki.admin.cert.issuer == x509.load_pem_x509_certificate(pki.client_ca.cert_pem).subject
    assert pki.api.cert.public_key().curve.name == "secp256r1"
    # Each cluster gets its own CAs: a peer's public CA does not vouch for this cluster's names.
    other = certs.cluster_pki("e")
    assert other.public_ca.cert_pem != pki.public_ca.cert_pem


def test_forward_headers_drop_hop_by_hop_and_forged_forwarding():
    incoming = [("Content-Type", "application/json"), ("X-Forwarded-For", "6.6.6.6"), ("Connection", "keep-alive, X-Secret-Hop"),
                ("X-Secret-Hop", "1"), ("Transfer-Encoding", "chunked"), ("X-Real-IP", "6.6.6.6"), ("Accept", "*/*")]
    out = forward_headers(incoming, "127.0.0.1", "peering.e.lab", 443)
    assert out["X-Forwarded-For"] == "127.0.0.1"
    assert out["X-Real-IP"] == "127.0.0.1"
    assert out["X-Forwarded-Proto"] == "https"
    assert out["X-Forwarded-Host"] == "peering.e.lab"
    assert "X-Secret-Hop" not in out and "Transfer-Encoding" not in out and "Connection" not in out
    assert out["Content-Type"] == "application/json" and out["Accept"] == "*/*"
    assert len(out["X-Request-ID"]) == 32
    assert forward_headers([("X-Request-ID", "abc")], "127.0.0.1", "h", 443)["X-Request-ID"] == "abc"


@pytest.fixture
async def backend():
    """A plain-HTTP join listener stand-in: echoes what it got, and streams on demand."""
    release = asyncio.Event()

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response({"method": request.method, "path": request.path_qs, "body": body.decode(),
                                  "headers": dict(request.headers)})

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"first\n")
        await release.wait()
        await resp.write(b"second\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/stream", stream)
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield runner.addresses[0][1], release
    release.set()
    await runner.cleanup()


@pytest.fixture
async def ingress(pki):
    ing = Ingress("peering.e.lab", certs.server_ssl_context(pki.ingress))
    await ing.start()
    yield ing
    await ing.stop()


def _client_ssl(pki) -> ssl.SSLContext:
    return certs.client_ssl_context(pki.public_ca.cert_pem)


async def test_ingress_answers_503_until_the_backend_exists_then_proxies(ingress, backend, pki):
    url = f"https://127.0.0.1:{ingress.port}"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/join", data=b"{}", ssl=_client_ssl(pki), server_hostname="peering.e.lab") as r:
            assert r.status == 503
        ingress.set_backend(backend[0])
        async with http.post(f"{url}/v1/join?x=1", data=b'{"token":"t"}', ssl=_client_ssl(pki),
                             server_hostname="peering.e.lab",
                             headers={"X-Forwarded-For": "6.6.6.6", "Content-Type": "application/json"}) as r:
            assert r.status == 200
            got = await r.json()
    assert got["method"] == "POST" and got["path"] == "/v1/join?x=1" and got["body"] == '{"token":"t"}'
    assert got["headers"]["X-Forwarded-For"] == "127.0.0.1"
    assert got["headers"]["X-Forwarded-Proto"] == "https"
    assert got["headers"]["Content-Type"] == "application/json"


async def test_ingress_streams_without_buffering(ingress, backend, pki):
    port, release = backend
    ingress.set_backend(port)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"https://127.0.0.1:{ingress.port}/stream", ssl=_client_ssl(pki),
                            server_hostname="peering.e.lab") as r:
            # The first chunk arrives while the backend is still holding the rest back.
            assert await asyncio.wait_for(r.content.readline(), 5) == b"first\n"
            assert not release.is_set()
            release.set()
            assert await asyncio.wait_for(r.content.readline(), 5) == b"second\n"


async def test_ingress_502_when_backend_is_gone(ingress, pki):
    # Bind and release a port so that nothing listens there.
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    ingress.set_backend(port)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"https://127.0.0.1:{ingress.port}/", ssl=_client_ssl(pki), server_hostname="peering.e.lab") as r:
            assert r.status == 502


async def test_passthrough_keeps_the_backend_tls_and_client_cert_check(pki):
    """A client reaches a CERT_REQUIRED TLS listener through the passthrough, end to end."""
    seen = []

    async def hello(request: web.Request) -> web.Response:
        der = request.transport.get_extra_info("ssl_object").getpeercert(binary_form=True)
        seen.append(x509.load_der_x509_certificate(der).subject.rfc4514_string())
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    server_cert = pki.public_ca.issue_server(["peering-gateway.e.lab"])
    site = web.TCPSite(runner, "127.0.0.1", 0,
                       ssl_context=certs.server_ssl_context(server_cert, pki.client_ca.cert_pem, require_client_cert=True))
    await site.start()
    lb = TcpPassthrough("entrance")
    await lb.start()
    try:
        async with aiohttp.ClientSession() as http:
            # No endpoints yet: the connection is closed at once.
            with pytest.raises(aiohttp.ClientError):
                async with http.get(f"https://127.0.0.1:{lb.port}/", ssl=_client_ssl(pki),
                                    server_hostname="peering-gateway.e.lab"):
                    pass
            lb.set_target(runner.addresses[0][1])
            client = certs.client_ssl_context(pki.public_ca.cert_pem, pki.admin)
            async with http.get(f"https://127.0.0.1:{lb.port}/", ssl=client, server_hostname="peering-gateway.e.lab") as r:
                assert await r.text() == "hello"
        assert seen == ["CN=admin,O=system:masters"]
    finally:
        await lb.stop()
        await runner.cleanup()
