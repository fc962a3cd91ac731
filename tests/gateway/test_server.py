"""The gateway's other edges: raw HTTP refusals, ops, join, peer calls, certificate reloads and the egress."""

from __future__ import annotations

import asyncio
import json
import ssl
import warnings

import aiohttp
import pytest

from tests.gateway.support import (CLUSTER, ENTRANCE_HOST, PEER_UUID, client_ssl, gateway_config, load_certs, make_token,
                      registry_for)
from gateway.server import Gateway

URL = f"https://{ENTRANCE_HOST}"


async def raw_request(gw: Gateway, pki, data: bytes) -> tuple[int, dict]:
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.entrance_port, ssl=client_ssl(pki),
                                                   server_hostname=ENTRANCE_HOST)
    try:
        writer.write(data)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = int([line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")][0])
        body = json.loads(await reader.readexactly(length))
        return status, body
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, ssl.SSLError):
            pass


async def test_oversized_header_gives_431(gateway, pki):
    status, body = await raw_request(gateway, pki, b"GET /api HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000
                                     + b"\r\n\r\n")
    assert (status, body["kind"], body["reason"]) == (431, "Status", "RequestHeaderFieldsTooLarge")


async def test_too_many_headers_gives_431(gateway, pki):
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(200))
    status, body = await raw_request(gateway, pki, b"GET /api HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert (status, body["reason"]) == (431, "RequestHeaderFieldsTooLarge")


async def test_content_length_with_transfer_encoding_is_refused(gateway, pki, upstream):
    status, body = await raw_request(gateway, pki, b"POST /api/v1/namespaces HTTP/1.1\r\nHost: x\r\n"
                                     b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert status == 400 and body["kind"] == "Status"
    assert upstream.requests == []


async def test_ops_listener_reports_health_readiness_and_metrics(pki, issuer_key, upstream, dex, handlers,
                                                                 session_for):
    gw = Gateway(gateway_config(pki, upstream, dex), handlers)
    await gw.start()
    try:
        async with aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{gw.ops_port}"
            async with http.get(base + "/healthz") as r:
                assert r.status == 200
            async with http.get(base + "/readyz") as r:
                assert r.status == 503 and "certificates" in await r.text()
            # Until certificates are loaded, the entrance refuses handshakes.
            s = session_for(gw)
            with pytest.raises(aiohttp.ClientError):
                async with s.get(URL + "/api") as resp:
                    await resp.read()
            load_certs(gw, pki)
            async with http.get(base + "/readyz") as r:
                assert r.status == 503 and "registry" in await r.text()
            gw.publish(registry_for(pki, issuer_key))
            async with http.get(base + "/readyz") as r:
                assert r.status == 200
            async with s.get(URL + "/api/v1/pods", headers={"Authorization": f"Bearer {make_token(issuer_key)}"}) as r:
                assert r.status == 200
            async with http.get(base + "/metrics") as r:
                text = await r.text()
            assert ('peering_gateway_requests_total{capability="read-pods",code="2xx",listener="entrance",'
                    'outcome="answered",peer="peer"}') in text
            assert 'peering_gateway_handshake_failures_total{listener="entrance",reason="certificates_not_loaded"}' \
                in text
            assert "peering_gateway_token_exchange_calls_total" in text and "peering_gateway_dex_seconds" in text
            assert "Bearer" not in text and "/api/v1/pods" not in text
    finally:
        await gw.stop()


async def test_access_log_is_one_json_line_without_token(gateway, session_for, issuer_key, caplog):
    import logging
    gateway.config.access_log = True
    token = make_token(issuer_key)
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        async with session_for(gateway).get(URL + "/api/v1/pods", headers={"Authorization": f"Bearer {token}"}) as r:
            assert r.status == 200
    [record] = [r for r in caplog.records if r.name == "gateway.access"]
    line = json.loads(record.getMessage())
    assert (line["listener"], line["peer"], line["code"], line["method"]) == ("entrance", "peer", 200, "GET")
    assert token not in caplog.text and "exchanged-" not in caplog.text


async def test_certificate_reload_serves_new_handshakes_and_keeps_open_connections(
        gateway, pki, session_for, issuer_key, upstream):
    import trustme
    upstream.watch_events, upstream.watch_interval = 30, 0.02
    s = session_for(gateway)
    token = make_token(issuer_key)
    async with s.get(URL + "/api/v1/pods?watch=true", headers={"Authorization": f"Bearer {token}"}) as watch:
        await watch.content.readline()
        new_cert = pki["ca"].issue_cert(ENTRANCE_HOST)
        gateway.reload_certificates(entrance_cert_pem=new_cert.cert_chain_pems[0].bytes(),
                                    entrance_key_pem=new_cert.private_key_pem.bytes(),
                                    ca_pem=pki["ca"].cert_pem.bytes(),
                                    egress_cert_pem=pki["egress"].cert_chain_pems[0].bytes(),
                                    egress_key_pem=pki["egress"].private_key_pem.bytes())
        # A new connection sees the new certificate...
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.entrance_port, ssl=client_ssl(pki),
                                                       server_hostname=ENTRANCE_HOST)
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        await writer.wait_closed()
        assert der == ssl.PEM_cert_to_DER_cert(new_cert.cert_chain_pems[0].bytes().decode())
        # ...and the open watch keeps streaming to its end.
        rest = [line async for line in watch.content]
        assert len(rest) == 29


async def test_bad_certificates_are_refused_with_a_reason_and_the_old_ones_kept(gateway, pki):
    with pytest.raises(ValueError, match="do not load"):
        gateway.reload_certificates(entrance_cert_pem=pki["entrance"].cert_chain_pems[0].bytes(),
                                    entrance_key_pem=pki["peer"].private_key_pem.bytes(),
                                    ca_pem=pki["ca"].cert_pem.bytes(),
                                    egress_cert_pem=pki["egress"].cert_chain_pems[0].bytes(),
                                    egress_key_pem=pki["egress"].private_key_pem.bytes())
    assert gateway.readiness() == (True, "ok")


async def test_peer_calls_reach_the_control_loop_typed(gateway, session_for, handlers, issuer_key):
    s = session_for(gateway)
    async with s.get(URL + "/peering/v1/offer") as r:
        assert r.status == 200 and await r.json() == {"op": "offer", "peer": "peer"}
    async with s.post(URL + "/peering/v1/notify", json={"generation": 3}) as r:
        assert r.status == 200
    async with s.post(URL + "/peering/v1/notify", json={"refuse": True}) as r:
        body = await r.json()
        assert (r.status, body["reason"], body["kind"]) == (409, "OfferStale", "Status")
    async with s.post(URL + "/peering/v1/certificate", data=b"x" * (300 * 1024)) as r:
        assert r.status == 413
    async with s.post(URL + "/peering/v1/credentials", data=b"[1]") as r:
        assert (r.status, (await r.json())["reason"]) == (400, "MalformedBody")
    async with s.get(URL + "/peering/v1/notify") as r:
        assert r.status == 405
    async with s.get(URL + "/peering/v1/secrets") as r:
        assert r.status == 404
    calls = [(c.op, c.peer.name, c.body) for c in handlers.calls]
    assert calls == [("offer", "peer", None), ("notify", "peer", {"generation": 3}), ("notify", "peer", {"refuse": True})]


async def test_join_listener_passes_typed_calls_and_rate_limits_failures(pki, upstream, dex, handlers):
    gw = Gateway(gateway_config(pki, upstream, dex, join_failures_per_minute=3), handlers)
    await gw.start()
    try:
        async with aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{gw.join_port}"
            async with http.post(base + "/v1/join", json={"token": "good"}) as r:
                assert r.status == 200 and await r.json() == {"joined": True}
            for _ in range(3):
                async with http.post(base + "/v1/join", json={"token": "bad"}) as r:
                    assert (r.status, (await r.json())["reason"]) == (403, "InvalidToken")
            async with http.post(base + "/v1/join", json={"token": "good"}) as r:
                assert (r.status, (await r.json())["reason"]) == (429, "TooManyAttempts")
            async with http.post(base + "/v1/join", data=b"x" * (65 * 1024)) as r:
                assert r.status in (413, 429)
            async with http.get(base + "/v1/join") as r:
                assert r.status == 405
            async with http.post(base + "/peering/v1/offer") as r:
                assert r.status == 404
        assert handlers.calls[0].body == {"token": "good"} and handlers.calls[0].remote == "127.0.0.1"
        assert len(handlers.calls) == 4
    finally:
        await gw.stop()


async def test_join_body_over_the_limit_gives_413(pki, upstream, dex, handlers):
    gw = Gateway(gateway_config(pki, upstream, dex), handlers)
    await gw.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"http://127.0.0.1:{gw.join_port}/v1/join", data=b"x" * (65 * 1024)) as r:
                assert (r.status, (await r.json())["reason"]) == (413, "RequestEntityTooLarge")
        assert handlers.calls == []
    finally:
        await gw.stop()


async def test_connection_limits_and_handshake_timeout(pki, issuer_key, upstream, dex, handlers, session_for):
    gw = Gateway(gateway_config(pki, upstream, dex, max_connections_per_peer=2, max_connections=3,
                                handshake_timeout=0.3), handlers)
    await gw.start()
    opened = []
    try:
        load_certs(gw, pki)
        gw.publish(registry_for(pki, issuer_key, peers=("peer", "peer2")))

        async def connect(cert: str = "peer"):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.entrance_port, ssl=client_ssl(pki, cert),
                                                           server_hostname=ENTRANCE_HOST)
            opened.append(writer)
            writer.write(b"GET /peering/v1/offer HTTP/1.1\r\nHost: x\r\n\r\n")
            return reader, writer

        async def answered(reader) -> bool:
            try:
                return (await asyncio.wait_for(reader.readline(), 2)).startswith(b"HTTP/1.1 200")
            except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
                return False

        a, b = await connect(), await connect()
        assert await answered(a[0]) and await answered(b[0])
        third = await connect()  # a third connection of the same peer is closed after the handshake
        assert not await answered(third[0])
        # A silent TCP client is cut after the handshake timeout and counted.
        silent_reader, silent_writer = await asyncio.open_connection("127.0.0.1", gw.entrance_port)
        opened.append(silent_writer)
        async with asyncio.timeout(3):
            assert await silent_reader.read() == b""
        text = gw.metrics_text().decode()
        assert 'reason="peer_connection_limit"' in text and 'reason="timeout"' in text
        # The total limit counts every open connection of the listener.
        c = await connect("peer2")
        assert await answered(c[0])
        try:
            d = await connect("peer2")
        except (ConnectionError, ssl.SSLError):
            pass  # closed before the handshake completed
        else:
            assert not await answered(d[0])
        assert 'reason="too_many_connections"' in gw.metrics_text().decode()
    finally:
        for w in opened:
            w.close()
        await gw.stop()


async def test_tls_below_1_2_is_refused_and_1_3_and_1_2_are_served(gateway, pki):
    for version, ok in ((ssl.TLSVersion.TLSv1_3, True), (ssl.TLSVersion.TLSv1_2, True),
                        (ssl.TLSVersion.TLSv1_1, False)):
        ctx = client_ssl(pki)
        with warnings.catch_warnings():
            # An old client is the point of this test.
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
            ctx.maximum_version = version
        if not ok:
            ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", gateway.entrance_port, ssl=ctx,
                                                           server_hostname=ENTRANCE_HOST)
        except (ssl.SSLError, ConnectionError):
            assert not ok
            continue
        assert ok and writer.get_extra_info("ssl_object").version() == {
            ssl.TLSVersion.TLSv1_3: "TLSv1.3", ssl.TLSVersion.TLSv1_2: "TLSv1.2"}[version]
        writer.close()
        await writer.wait_closed()
    assert 'reason="protocol_version"' in gateway.metrics_text().decode()


async def test_no_session_tickets_are_issued(gateway, pki):
    # Every connection is a full handshake checked against the current CA, as nginx is configured in the bench.
    for version in (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2):
        ctx = client_ssl(pki)
        ctx.maximum_version = version
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.entrance_port, ssl=ctx,
                                                       server_hostname=ENTRANCE_HOST)
        try:
            # TLS 1.3 tickets come after the handshake: an answer read means any ticket would have arrived.
            writer.write(b"GET /api HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 401 ")
            session = writer.get_extra_info("ssl_object").session
            assert session is None or not session.has_ticket, version
        finally:
            writer.close()
            await writer.wait_closed()
