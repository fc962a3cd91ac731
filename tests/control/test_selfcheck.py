"""The self-check probe against real TLS servers on 127.0.0.1: one that requires a client certificate (as the
entrance does), one that serves without (a TLS terminator in front), a foreign and an expired certificate, and
nothing listening."""

from __future__ import annotations

import asyncio
import datetime
import ssl

import pytest

from control import pki
from control.selfcheck import (CONFIRM_PROBES, CONFIRM_SECONDS, RETRY_SECONDS, SelfCheck, conditions_of, probe,
                               served_certificate)
from gateway import tls
from tests.control.conftest import FakeClock
from tests.ports import closed_port

HOST = "peering-gateway.x.lab"
NOW = datetime.datetime.now(datetime.timezone.utc)


async def _serve(cert: pki.CertAndKey, *, require_client_cert: bool, tmp_path,
                 max_version: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.maximum_version = max_version
    (tmp_path / "c.pem").write_text(cert.cert_pem)
    (tmp_path / "k.pem").write_text(cert.key_pem)
    ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    if require_client_cert:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=cert.cert_pem)

    async def handle(reader, writer):
        try:
            await reader.readline()
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        except (ssl.SSLError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    return server, server.sockets[0].getsockname()[1]


@pytest.fixture(scope="module")
def ca():
    return pki.create_ca("x", now=NOW)


@pytest.mark.parametrize("require, cert_kind, expected", [
    (True, "ours", ("ClientCertRequired", "PeeringRootCert")),
    (False, "ours", ("ClientCertNotRequired", "PeeringRootCert")),
    (False, "foreign", ("ClientCertNotRequired", "ForeignCert")),
    (True, "expired", ("ClientCertRequired", "ForeignCert")),
    (True, "other-host", ("ClientCertRequired", "ForeignCert")),
])
async def test_probe_reasons(ca, tmp_path, require, cert_kind, expected):
    if cert_kind == "ours":
        served = pki.issue_server_cert(ca, [HOST], now=NOW)
    elif cert_kind == "foreign":
        served = pki.issue_server_cert(pki.create_ca("someone", now=NOW), [HOST], now=NOW)
    elif cert_kind == "expired":
        served = pki.issue_server_cert(ca, [HOST], now=NOW - datetime.timedelta(days=60))
    else:
        served = pki.issue_server_cert(ca, ["elsewhere.x.lab"], now=NOW)
    server, port = await _serve(served, require_client_cert=require, tmp_path=tmp_path)
    try:
        result = await probe(HOST, 443, ("127.0.0.1", port))
    finally:
        server.close()
        await server.wait_closed()
    client, server_cond = conditions_of(result, ca.cert_pem, HOST, NOW)
    assert (client.reason, server_cond.reason) == expected
    assert result.cert_pem is not None


@pytest.mark.parametrize("cert_kind, expected", [
    ("ours", ("ClientCertRequired", "PeeringRootCert")),
    ("foreign", ("ClientCertRequired", "ForeignCert")),
    ("expired", ("ClientCertRequired", "ForeignCert")),
])
async def test_tls12_entrance_refusing_in_the_handshake_still_shows_its_certificate(ca, tmp_path, cert_kind,
                                                                                    expected):
    # TLS 1.2 refuses the missing client certificate inside the handshake, so the plain probe fails there.
    issuer = ca if cert_kind != "foreign" else pki.create_ca("someone", now=NOW)
    issued_at = NOW if cert_kind != "expired" else NOW - datetime.timedelta(days=60)
    served = pki.issue_server_cert(issuer, [HOST], now=issued_at)
    server, port = await _serve(served, require_client_cert=True, tmp_path=tmp_path,
                                max_version=ssl.TLSVersion.TLSv1_2)
    try:
        result = await probe(HOST, 443, ("127.0.0.1", port))
    finally:
        server.close()
        await server.wait_closed()
    assert result.client == "refused" and result.detail.startswith("handshake refused")
    assert result.cert_pem is not None and result.cert_pem.strip() == served.cert_pem.strip()
    client, server_cond = conditions_of(result, ca.cert_pem, HOST, NOW)
    assert (client.reason, server_cond.reason) == expected


async def test_reading_the_certificate_of_a_plain_tcp_server_gives_none(ca):
    async def close_at_once(reader, writer):
        writer.close()
    server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        assert await served_certificate(HOST, "127.0.0.1", port, timeout=2.0) is None
    finally:
        server.close()
        await server.wait_closed()


async def test_nothing_listening_is_entrance_unreachable(ca):
    # A port that was just free: bind, learn it, close.
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    client, server_cond = conditions_of(await probe(HOST, 443, ("127.0.0.1", port)), ca.cert_pem, HOST, NOW)
    assert (client.status, client.reason) == ("Unknown", "EntranceUnreachable")
    assert (server_cond.status, server_cond.reason) == ("Unknown", "EntranceUnreachable")


async def test_selfcheck_probes_once_per_interval_and_again_after_invalidate(ca, tmp_path):
    server, port = await _serve(pki.issue_server_cert(ca, [HOST], now=NOW), require_client_cert=True,
                                tmp_path=tmp_path)
    calls = []

    def resolve(host):
        calls.append(host)
        return ("127.0.0.1", port)

    check = SelfCheck(HOST, resolve=resolve, interval=3600)
    try:
        first = await check.result()
        assert await check.result() is first and calls == [HOST]
        check.invalidate()
        await check.result()
        assert calls == [HOST, HOST]
    finally:
        server.close()
        await server.wait_closed()


async def test_a_refusal_that_arrives_before_the_certificate_is_read_is_a_refusal(ca, tmp_path, monkeypatch):
    # TLS 1.3: the server refuses the missing client certificate after the probe's side of the handshake is done;
    # when its alert is processed before the probe reads the served certificate, the TLS object is in error.
    import control.selfcheck as selfcheck

    real_open = asyncio.open_connection

    async def open_then_take_the_alert(*args, **kwargs):
        reader, writer = await real_open(*args, **kwargs)
        if kwargs.get("ssl") is None:
            return reader, writer  # the second, callback-driven handshake runs on a plain connection
        for _ in range(500):
            if reader.exception() is not None or reader.at_eof():
                break
            await asyncio.sleep(0.01)
        assert reader.exception() is not None, "the server's alert never arrived"
        return reader, writer

    monkeypatch.setattr(selfcheck.asyncio, "open_connection", open_then_take_the_alert)
    served = pki.issue_server_cert(ca, [HOST], now=NOW)
    # The gateway's own entrance TLS, which sends that alert (the stdlib server only closes).
    context = tls.server_context(served.cert_pem.encode(), served.key_pem.encode(), ca.cert_pem.encode())
    acceptor = tls.TLSAcceptor(name="entrance", context=lambda: context, make_protocol=asyncio.Protocol,
                               admit=lambda transport: True, count_failure=lambda reason: None,
                               handshake_timeout=5, max_connections=10)
    server = await asyncio.get_running_loop().create_server(acceptor, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await probe(HOST, 443, ("127.0.0.1", port))
    finally:
        server.close()
        await acceptor.close()
        await server.wait_closed()
    assert result.client == "refused" and result.cert_pem is not None
    assert result.cert_pem.strip() == served.cert_pem.strip()
    client, server_cond = conditions_of(result, ca.cert_pem, HOST, NOW)
    assert (client.reason, server_cond.reason) == ("ClientCertRequired", "PeeringRootCert")


async def test_an_unreachable_entrance_is_said_only_once_probes_confirm_it(ca, tmp_path):
    """A process that just started (or reloaded its certificates) is routed to a moment later: an unreachable
    entrance is probed again sooner, and becomes the verdict only after CONFIRM_PROBES in a row over the confirming
    time; one probe that reaches it ends the count."""

    server, port = await _serve(pki.issue_server_cert(ca, [HOST], now=NOW), require_client_cert=True,
                                tmp_path=tmp_path)
    target = {"port": closed_port()}
    clock = FakeClock()
    check = SelfCheck(HOST, resolve=lambda host: ("127.0.0.1", target["port"]), interval=60, clock=clock)
    try:
        assert await check.result() is None and check.due_in() == RETRY_SECONDS
        clock.advance(RETRY_SECONDS)
        assert await check.result() is None and check.due_in() == 2 * RETRY_SECONDS
        target["port"] = port  # it is reachable now: the verdict, and the count starts again
        clock.advance(2 * RETRY_SECONDS)
        seen = await check.result()
        assert seen is not None and seen.client == "refused" and check.due_in() == 60
        target["port"] = closed_port()
        verdicts = []
        for _ in range(CONFIRM_PROBES + 2):
            clock.advance(max(check.due_in(), CONFIRM_SECONDS / CONFIRM_PROBES))
            verdicts.append(await check.result())
        assert verdicts[:CONFIRM_PROBES - 1] == [None] * (CONFIRM_PROBES - 1)
        assert verdicts[-1] is not None and verdicts[-1].client == "unreachable"
    finally:
        server.close()
        await server.wait_closed()
