"""A client certificate outside its validity period, over real TLS: the entrance's handshake accepts a certificate
of our CA whatever its dates (tls.py), so that an expired one can still prove possession of its key for the
renewal; admission refuses it everything else, on both entrance paths and every other peer operation, and closes
the connection. A certificate of another CA, expired or not, never gets past the handshake."""

from __future__ import annotations

import datetime
import ssl

import aiohttp
import pytest
import trustme

from gateway.resolve import OverrideResolver
from gateway.tls import VERIFY_NO_CHECK_TIME, server_context
from tests.gateway.support import ENTRANCE_HOST, PEER_UUID, make_token, registry_for
from tests.gateway.test_entrance import PODS, URL, _counter, _until, status_of

NOW = datetime.datetime.now(datetime.timezone.utc)
DAY = datetime.timedelta(days=1)


@pytest.fixture(scope="module")
def dated(pki):
    """Certificates of the peering CA for the peer, one expired a day ago and one valid only from tomorrow."""
    ca: trustme.CA = pki["ca"]
    return {"expired": ca.issue_cert(f"{PEER_UUID}.peer", not_before=NOW - 2 * DAY, not_after=NOW - DAY),
            "future": ca.issue_cert(f"{PEER_UUID}.peer", not_before=NOW + DAY, not_after=NOW + 2 * DAY),
            "foreign": trustme.CA().issue_cert(f"{PEER_UUID}.peer", not_before=NOW - 2 * DAY, not_after=NOW - DAY)}


@pytest.fixture
async def connect(pki):
    """Sessions to the entrance presenting a given certificate; `force_close` off, so that a connection the
    gateway closes shows (`closed`)."""
    sessions: list[aiohttp.ClientSession] = []

    def make(gw, leaf: trustme.LeafCert) -> aiohttp.ClientSession:
        ctx = ssl.create_default_context()
        pki["ca"].configure_trust(ctx)
        leaf.configure_cert(ctx)
        resolver = OverrideResolver({ENTRANCE_HOST: f"127.0.0.1:{gw.entrance_port}"})
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, resolver=resolver))
        sessions.append(session)
        return session

    yield make
    for s in sessions:
        await s.close()


def _held_by_the_peer(pki, issuer_key, leaf: trustme.LeafCert, generation: int = 2):
    """The registry of a live peering whose issued.crt holds `leaf`, the certificate the peer presents."""
    return registry_for({**pki, "peer": leaf}, issuer_key, generation=generation)


def test_only_a_context_that_requires_client_certificates_leaves_their_dates_to_admission(pki):
    leaf = pki["entrance"]
    cert, key = leaf.cert_chain_pems[0].bytes(), leaf.private_key_pem.bytes()
    entrance = server_context(cert, key, pki["ca"].cert_pem.bytes())
    assert entrance.verify_mode == ssl.CERT_REQUIRED and int(entrance.verify_flags) & VERIFY_NO_CHECK_TIME
    assert not int(server_context(cert, key, None).verify_flags) & VERIFY_NO_CHECK_TIME


@pytest.mark.parametrize("which,reason", [("expired", "CertificateExpired"), ("future", "CertificateNotYetValid")])
async def test_a_certificate_outside_its_dates_admits_nothing_on_either_path(gateway, connect, pki, dated,
                                                                             issuer_key, upstream, dex, which, reason):
    gateway.publish(_held_by_the_peer(pki, issuer_key, dated[which]))
    s = connect(gateway, dated[which])
    headers = {"Authorization": f"Bearer {make_token(issuer_key)}"}
    # A plain GET, a watch, and a request with a body: each refused, the connection closed.
    for method, url, body in (("GET", PODS, None), ("GET", PODS + "?watch=true", None),
                              ("POST", PODS, b'{"kind": "Pod"}')):
        async with s.request(method, url, headers=headers, data=body) as resp:
            assert await status_of(resp) == (401, reason)
            assert resp.headers.get("Connection", "").lower() == "close"
            message = (await resp.json())["message"]
            assert "renewal" in message and "peer" in message
    assert upstream.requests == [] and dex.calls == 0
    assert _counter(gateway, "handshake_failures", "expired_certificate") == 0


@pytest.mark.parametrize("which,reason", [("expired", "CertificateExpired"), ("future", "CertificateNotYetValid")])
async def test_a_certificate_outside_its_dates_may_call_the_renewal_and_no_other_operation(gateway, connect, pki,
                                                                                          dated, issuer_key, handlers,
                                                                                          which, reason):
    gateway.publish(_held_by_the_peer(pki, issuer_key, dated[which]))
    s = connect(gateway, dated[which])
    for method, op in (("GET", "offer"), ("POST", "notify"), ("POST", "credentials"), ("GET", "certificate"),
                       ("POST", "nothing")):
        async with s.request(method, f"{URL}/peering/v1/{op}", json={} if method == "POST" else None) as resp:
            assert await status_of(resp) == (401, reason), op
            assert resp.headers.get("Connection", "").lower() == "close"
    assert handlers.calls == []
    async with s.post(f"{URL}/peering/v1/certificate", json={"csr": "x"}) as resp:
        assert resp.status == 200 and await resp.json() == {"op": "certificate", "peer": "peer"}
    (call,) = handlers.calls
    assert (call.op, call.peer.name, call.body) == ("certificate", "peer", {"csr": "x"})


async def test_a_valid_certificate_of_the_same_peering_still_serves_everything(gateway, connect, pki, dated,
                                                                            issuer_key, handlers, upstream):
    # The peering holds its expired certificate and a fresh one (issued.crt after a renewal): only the fresh one
    # serves the data plane and the other operations.
    gateway.publish(registry_for({**pki, "peer": _Bundle(pki["peer"], dated["expired"])}, issuer_key, generation=2))
    fresh = connect(gateway, pki["peer"])
    async with fresh.get(PODS, headers={"Authorization": f"Bearer {make_token(issuer_key)}"}) as resp:
        assert resp.status == 200
    async with fresh.get(f"{URL}/peering/v1/offer") as resp:
        assert resp.status == 200
    stale = connect(gateway, dated["expired"])
    async with stale.get(f"{URL}/peering/v1/offer") as resp:
        assert await status_of(resp) == (401, "CertificateExpired")
    assert [c.op for c in handlers.calls] == ["offer"] and len(upstream.requests) == 1


async def test_an_expired_certificate_of_another_ca_never_passes_the_handshake(gateway, connect, pki, dated,
                                                                             handlers, upstream):
    s = connect(gateway, dated["foreign"])
    for url in (PODS, f"{URL}/peering/v1/certificate"):
        with pytest.raises(aiohttp.ClientError):
            async with s.post(url, json={"csr": "x"}) as resp:
                await resp.read()
    await _until(lambda: _counter(gateway, "handshake_failures", "untrusted_certificate") >= 2)
    assert handlers.calls == [] and upstream.requests == []


async def test_an_expired_certificate_no_peering_holds_is_refused_before_anything_is_called(gateway, connect, pki,
                                                                                          dated, handlers, upstream):
    # Our CA's, but no ClusterPeer's issued.crt lists it (a peering deleted since, or never): PeerUnknown, or the
    # connection refused outright; never an operation, not even the renewal.
    s = connect(gateway, dated["expired"])
    for url in (PODS, f"{URL}/peering/v1/certificate"):
        try:
            async with s.post(url, json={"csr": "x"}) as resp:
                assert await status_of(resp) == (403, "PeerUnknown")
        except aiohttp.ClientError:
            pass
    assert handlers.calls == [] and upstream.requests == []


class _Bundle:
    """Two leaf certificates as one issued.crt (newest first), with the first one's key for the client side."""

    def __init__(self, first: trustme.LeafCert, *rest: trustme.LeafCert) -> None:
        self.cert_chain_pems = [_Pem(b"".join(c.cert_chain_pems[0].bytes() for c in (first, *rest)))]
        self.private_key_pem = first.private_key_pem


class _Pem:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def bytes(self) -> bytes:
        return self._data
