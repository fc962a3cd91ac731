"""The gateway's TLS contexts on the wire: what each side sends in a handshake, seen by an independent TLS stack
(pyOpenSSL) over memory BIOs, with real certificates."""

from __future__ import annotations

import ssl

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from OpenSSL import SSL

from gateway import tls


@pytest.fixture(scope="module")
def certs():
    ca = trustme.CA(key_type=trustme.KeyType.ECDSA)
    server = ca.issue_cert("peering-gateway.x.lab", key_type=trustme.KeyType.ECDSA)
    client = ca.issue_cert("peer", key_type=trustme.KeyType.ECDSA)
    return ca, server, client


def _peer_context(method: int, ca: trustme.CA, leaf: trustme.LeafCert) -> SSL.Context:
    """An independent TLS stack trusting `ca` and presenting `leaf`, requiring the other side's certificate."""
    ctx = SSL.Context(method)
    ctx.use_certificate(x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()))
    ctx.use_privatekey(load_pem_private_key(leaf.private_key_pem.bytes(), None))
    with ca.cert_pem.tempfile() as path:
        ctx.load_verify_locations(path)
    ctx.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, lambda *args: args[-1] == 1)
    return ctx


def _handshake(ours: ssl.SSLObject, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO,
               theirs: SSL.Connection) -> None:
    """Drives both ends until both finished the handshake (bounded: a handshake is a few flights)."""
    done_ours = done_theirs = False
    for _ in range(10):
        if not done_theirs:
            try:
                theirs.do_handshake()
                done_theirs = True
            except SSL.WantReadError:
                pass
        while True:
            try:
                data = theirs.bio_read(65536)
            except SSL.WantReadError:
                break
            incoming.write(data)
        if not done_ours:
            try:
                ours.do_handshake()
                done_ours = True
            except ssl.SSLWantReadError:
                pass
        data = outgoing.read()
        if data:
            theirs.bio_write(data)
        if done_ours and done_theirs:
            return
    raise AssertionError("the handshake did not finish")


@pytest.mark.parametrize("version", [SSL.TLS1_2_VERSION, SSL.TLS1_3_VERSION])
def test_entrance_sends_its_certificate_without_the_ca(certs, version):
    ca, server, client = certs
    ctx = tls.server_context(server.cert_chain_pems[0].bytes(), server.private_key_pem.bytes(), ca.cert_pem.bytes())
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    ours = ctx.wrap_bio(incoming, outgoing, server_side=True)

    peer_ctx = _peer_context(SSL.TLS_CLIENT_METHOD, ca, client)
    peer_ctx.set_min_proto_version(version)
    peer_ctx.set_max_proto_version(version)
    theirs = SSL.Connection(peer_ctx, None)
    theirs.set_connect_state()
    _handshake(ours, incoming, outgoing, theirs)

    # The peer trusts the CA already; sending it again costs both sides a certificate decode per handshake.
    sent = theirs.get_peer_cert_chain(as_cryptography=True)
    assert [c.subject for c in sent] == [x509.load_pem_x509_certificate(server.cert_chain_pems[0].bytes()).subject]
    assert ours.getpeercert(binary_form=True)  # the client certificate was required and verified


def test_egress_client_sends_its_certificate_without_the_ca(certs):
    ca, server, client = certs
    ctx = tls.client_context(ca.cert_pem.bytes(), client.cert_chain_pems[0].bytes(), client.private_key_pem.bytes())
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    ours = ctx.wrap_bio(incoming, outgoing, server_hostname="peering-gateway.x.lab")

    theirs = SSL.Connection(_peer_context(SSL.TLS_SERVER_METHOD, ca, server), None)
    theirs.set_accept_state()
    _handshake(ours, incoming, outgoing, theirs)

    assert theirs.get_peer_certificate(as_cryptography=True).subject == x509.load_pem_x509_certificate(
        client.cert_chain_pems[0].bytes()).subject
    # On the server side OpenSSL lists only what came after the client's own certificate: nothing.
    assert not theirs.get_peer_cert_chain()


def test_setting_modes_leaves_the_context_as_python_configured_it(certs):
    ca, server, _ = certs
    ctx = tls.server_context(server.cert_chain_pems[0].bytes(), server.private_key_pem.bytes(), ca.cert_pem.bytes())
    before = (ctx.options, ctx.verify_mode, ctx.minimum_version, ctx.maximum_version)
    assert tls.add_openssl_modes(ctx, tls.SSL_MODE_NO_AUTO_CHAIN) is True
    assert (ctx.options, ctx.verify_mode, ctx.minimum_version, ctx.maximum_version) == before


def test_a_context_libssl_does_not_confirm_is_left_alone(certs, monkeypatch, caplog):
    ca, server, _ = certs
    ctx = tls.server_context(server.cert_chain_pems[0].bytes(), server.private_key_pem.bytes(), ca.cert_pem.bytes())
    openssl = tls._OpenSSL()
    monkeypatch.setattr(tls, "_OPENSSL", openssl)
    # As if the context's memory did not start with the SSL_CTX pointer: libssl reports other options.
    real = openssl.get_options
    monkeypatch.setattr(openssl, "get_options", lambda pointer: real(pointer) ^ 1)
    with caplog.at_level("WARNING", logger="gateway.tls"):
        assert tls.add_openssl_modes(ctx, tls.SSL_MODE_NO_AUTO_CHAIN) is False
    assert "could not be set" in caplog.text


def _python_handshake(server: ssl.SSLContext, client: ssl.SSLContext, session: ssl.SSLSession | None = None
                      ) -> tuple[ssl.SSLObject, ssl.SSLObject]:
    return tls.memory_handshake(server, client, session, server_hostname="peering-gateway.x.lab")


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_the_entrance_never_resumes_a_session(certs, version):
    ca, server, client = certs
    entrance = tls.server_context(server.cert_chain_pems[0].bytes(), server.private_key_pem.bytes(),
                                  ca.cert_pem.bytes())
    peer = tls.client_context(ca.cert_pem.bytes(), client.cert_chain_pems[0].bytes(),
                              client.private_key_pem.bytes())
    peer.maximum_version = version
    _, first = _python_handshake(entrance, peer)
    ours, second = _python_handshake(entrance, peer, session=first.session)
    # Every connection is a full handshake: the client certificate is presented and checked each time.
    assert (ours.session_reused, second.session_reused) == (False, False)
    assert ours.getpeercert(binary_form=True)
    assert entrance.session_stats()["number"] == 0


def test_a_session_cache_that_cannot_be_switched_off_refuses_the_context(certs, monkeypatch):
    """Was a warning, and the context served anyway: TLS 1.2 clients could then resume a session without
    presenting their certificate again. Now no such context is made (and so no handshake served with it)."""
    ca, server, _ = certs
    openssl = tls._OpenSSL()
    monkeypatch.setattr(tls, "_OPENSSL", openssl)
    real = openssl.get_options
    monkeypatch.setattr(openssl, "get_options", lambda pointer: real(pointer) ^ 1)  # libssl does not confirm it
    with pytest.raises(tls.TLSSafetyError, match="session cache .* could not be switched off"):
        tls.server_context(server.cert_chain_pems[0].bytes(), server.private_key_pem.bytes(), ca.cert_pem.bytes())
    with pytest.raises(ValueError):  # what reload_certificates refuses, keeping the previous certificates
        tls.server_context(server.cert_chain_pems[0].bytes(), server.private_key_pem.bytes(), None)


def test_the_resumption_check_passes_here_and_refuses_a_context_that_would_resume(monkeypatch):
    monkeypatch.setattr(tls, "_RESUMPTION_REFUSED", False)
    tls.require_no_resumption()
    assert tls._RESUMPTION_REFUSED is True
    # As on a platform where the settings do not hold: sessions are cached and tickets sent.
    monkeypatch.setattr(tls, "_RESUMPTION_REFUSED", False)
    monkeypatch.setattr(tls, "_never_resume", lambda ctx: None)
    with pytest.raises(tls.TLSSafetyError, match="TLSv1_2 session was resumed"):
        tls.require_no_resumption()


async def test_a_gateway_whose_tls_could_resume_does_not_start(monkeypatch):
    from gateway.config import GatewayConfig
    from gateway.server import Gateway
    from tests.gateway.support import Handlers

    monkeypatch.setattr(tls, "_RESUMPTION_REFUSED", False)
    monkeypatch.setattr(tls, "_never_resume", lambda ctx: None)
    gw = Gateway(GatewayConfig(public_domain_template="%s.x.lab", access_log=False), Handlers())
    with pytest.raises(tls.TLSSafetyError):
        await gw.start()
    assert gw.entrance_port == 0  # nothing was bound
