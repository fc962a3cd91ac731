"""The renewal of a client certificate that expired during an outage, against the issuing side as it runs: the
real gateway (its entrance's TLS and admission) fed by the control loop's registry from an emulated API server,
the real peer handlers behind it, and the control loop's own peer client in front, all over real TLS.

What it proves, attack by attack: an expired certificate renews for its own key and identity and for nothing else
(another key: KeyMismatch; another peering's UUID in the CSR: issued for the presenting peering's own UUID only;
another peering's key: KeyMismatch), a replayed renewal changes nothing, a deleted ClusterPeer's certificate renews
nothing, a not-yet-valid one is treated alike, and a certificate of the CA a re-enabled module no longer has never
gets past the handshake. On the data plane and in every other operation such a certificate is refused."""

from __future__ import annotations

import datetime

import aiohttp
import pytest

from contract.peer_secret import PeerCredentials
from control import pki
from control.config import ControlSettings, LeaseSettings, Settings
from control.handlers.dispatch import Handlers
from control.handlers.peer import PeerHandlers, _certs
from control.peerclient import PeerClient, peer_context
from control.process import Runtime, certificates
from control.rules import conditions as cond
from control.rules import credentials as creds
from control.rules import join as join_rules
from control.rules import renewal
from gateway.config import GatewayConfig
from gateway.resolve import OverrideResolver
from gateway.server import Gateway
from tests.control.conftest import NAMESPACE, eventually

TEMPLATE = "%s.t.lab"
ENTRANCE = "peering-gateway.t.lab"
B_UUID = "7c5e0000-0000-4000-8000-0000000000b2"
C_UUID = "7c5e0000-0000-4000-8000-0000000000c3"
DAY = datetime.timedelta(days=1)
LIFETIME = datetime.timedelta(hours=24)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


class Issuer:
    """This cluster as the peers see it: its process's gateway and control loop (the certificates reconciler and
    the peer handlers), with ClusterPeers `to-b` and `to-c` whose peers hold keys `b` and `c`."""

    def __init__(self, server, kube) -> None:
        self.server = server
        self.kube = kube
        self.handlers = Handlers()
        self.gateway = Gateway(GatewayConfig(public_domain_template=TEMPLATE, access_log=False), self.handlers)
        settings = Settings(public_domain_template=TEMPLATE,
                            lease=LeaseSettings(identity="issuer", duration=2.0, renew_deadline=1.5, retry_period=0.05),
                            control=ControlSettings(feed_coalesce=0.01, client_cert_lifetime=LIFETIME.total_seconds()))
        self.runtime = Runtime(settings, kube, self.gateway, handlers=self.handlers, reconcilers=(certificates,))
        PeerHandlers(self.runtime.ctx, pull_now=lambda name: None).register()
        self.keys = {"b": pki.make_key_and_csr(B_UUID), "c": pki.make_key_and_csr(C_UUID)}
        self.client: PeerClient | None = None

    async def start(self) -> None:
        await self.runtime.start()
        await eventually(lambda: self.gateway.readiness()[0], what="the issuer's certificates loaded")
        self.client = PeerClient(OverrideResolver({ENTRANCE: f"127.0.0.1:{self.gateway.entrance_port}"}))

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.close()
        await self.runtime.stop()

    @property
    def ca(self) -> pki.CertAndKey:
        values = creds.secret_values(self.server.get("", "secrets", "peering-ca", NAMESPACE))
        return pki.CertAndKey(values["tls.crt"], values["tls.key"])

    def issue(self, who: str, at: datetime.datetime) -> str:
        uuid = B_UUID if who == "b" else C_UUID
        return pki.issue_client_cert(self.ca, self.keys[who].cert_pem, uuid, now=at, lifetime=LIFETIME)

    async def peering(self, who: str, issued: str) -> None:
        """ClusterPeer `to-<who>` established, its Secret holding `issued` for the peer; once the registry has it."""
        cp = self.server.create({"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                                 "metadata": {"name": f"to-{who}"}, "spec": {"type": "Invite"}})
        self.server.create(creds.peer_secret(cp, NAMESPACE, PeerCredentials.from_values({"issued.crt": issued,
                                                             "peer-uuid": B_UUID if who == "b" else C_UUID})))
        fingerprint = pki.fingerprint(issued)
        await eventually(lambda: fingerprint in self.runtime.feed.registry.by_fingerprint,
                         what=f"the registry holding to-{who}'s certificate")

    def issued(self, who: str) -> list[str]:
        return _certs(creds.secret_values(self.server.get("", "secrets", f"peer-to-{who}", NAMESPACE))["issued.crt"])

    def version(self, who: str) -> str:
        return self.server.get("", "secrets", f"peer-to-{who}", NAMESPACE)["metadata"]["resourceVersion"]

    async def call(self, op: str, who: str, cert: str, *, body: dict | None = None, trust: str | None = None):
        assert self.client is not None
        return await self.client.call(ENTRANCE, op, peer_ca_pem=trust or self.ca.cert_pem, client_cert_pem=cert,
                                      client_key_pem=self.keys[who].key_pem, body=body)

    async def renew(self, who: str, cert: str, csr: str | None = None, **kw):
        return await self.call("certificate", who, cert, body=join_rules.certificate_request(
            csr or self.keys[who].cert_pem), **kw)


@pytest.fixture
async def issuer(api, kube):
    server, _ = api
    side = Issuer(server, kube)
    await side.start()
    try:
        yield side
    finally:
        await side.stop()


async def test_an_expired_certificate_renews_for_its_own_key_and_admits_nothing_else(issuer):
    expired = issuer.issue("b", now() - 3 * DAY)
    await issuer.peering("b", expired)
    # Every operation but the renewal, and the data plane, refuse it.
    for op, body in (("offer", None), ("notify", {}), ("credentials", {"certificate": expired})):
        answer = await issuer.call(op, "b", expired, body=body)
        assert (answer.status, answer.body["reason"]) == (401, "CertificateExpired"), op
    assert issuer.version("b") and issuer.issued("b") == [expired]
    answer = await issuer.renew("b", expired)
    assert answer.status == 200
    fresh = answer.body["certificate"]
    # For the pinned key and the peer's own identity, from this cluster's CA, valid from now for the lifetime.
    assert pki.public_key_fingerprint(fresh) == pki.public_key_fingerprint(issuer.keys["b"].cert_pem)
    assert pki.common_name(fresh) == B_UUID and pki.issued_by(fresh, issuer.ca.cert_pem)
    assert pki.valid_at(fresh, now()) and pki.not_after(fresh) - now() > LIFETIME - datetime.timedelta(minutes=1)
    assert issuer.issued("b") == [fresh, expired]
    # Answered once this replica's entrance admits it: the next call with it passes at once, the old one still not.
    assert (await issuer.call("notify", "b", fresh, body={})).status == 200
    assert (await issuer.call("notify", "b", expired, body={})).status == 401


async def test_a_replayed_renewal_changes_nothing(issuer):
    expired = issuer.issue("b", now() - 3 * DAY)
    await issuer.peering("b", expired)
    first = await issuer.renew("b", expired)
    version = issuer.version("b")
    # The same request again, with the expired certificate (an answer lost) or with the fresh one: the same
    # certificate, nothing written, nothing pushed out of issued.crt.
    for cert in (expired, first.body["certificate"], expired):
        again = await issuer.renew("b", cert)
        assert again.status == 200 and again.body == first.body
    assert issuer.version("b") == version and issuer.issued("b") == [first.body["certificate"], expired]


async def test_a_renewal_with_the_expired_certificate_for_another_key_is_refused(issuer):
    expired = issuer.issue("b", now() - 3 * DAY)
    await issuer.peering("b", expired)
    version = issuer.version("b")
    stranger = pki.make_key_and_csr(B_UUID)
    answer = await issuer.renew("b", expired, stranger.cert_pem)
    assert (answer.status, answer.body["reason"]) == (403, "KeyMismatch")
    assert issuer.version("b") == version and issuer.issued("b") == [expired]
    # What the caller shows for it: the reason and its fix.
    reason, message = renewal.renewal_failure("to-a", answer.status, answer.body)
    assert reason == "KeyMismatch" and "peer-to-a" in message and "establish the peering anew" in message


async def test_a_renewal_naming_another_peering_is_issued_for_the_presenting_one_or_refused(issuer):
    b_cert, c_cert = issuer.issue("b", now() - 3 * DAY), issuer.issue("c", now())
    await issuer.peering("b", b_cert)
    await issuer.peering("c", c_cert)
    c_version = issuer.version("c")
    # b's key, but the CSR names c's cluster UUID: the subject is ours to set, so it is b's own identity.
    named_c = pki.csr_for_key(issuer.keys["b"].key_pem, C_UUID)
    answer = await issuer.renew("b", b_cert, named_c)
    assert answer.status == 200 and pki.common_name(answer.body["certificate"]) == B_UUID
    assert issuer.issued("b")[0] == answer.body["certificate"]
    # c's key (its CSR, as c would send it) presented over b's handshake: refused, neither Secret changes.
    b_version = issuer.version("b")
    refused = await issuer.renew("b", b_cert, issuer.keys["c"].cert_pem)
    assert (refused.status, refused.body["reason"]) == (403, "KeyMismatch")
    assert (issuer.version("b"), issuer.version("c")) == (b_version, c_version)
    assert issuer.issued("c") == [c_cert]


async def test_the_certificate_of_a_deleted_clusterpeer_renews_nothing(issuer):
    expired = issuer.issue("b", now() - 3 * DAY)
    await issuer.peering("b", expired)
    issuer.server.delete("peering.deckhouse.io", "clusterpeers", "to-b")
    fingerprint = pki.fingerprint(expired)
    await eventually(lambda: fingerprint not in issuer.runtime.feed.registry.by_fingerprint,
                     what="the registry without to-b")
    # Its Secret goes with it (owned; garbage collection), and the renewal brings nothing back.
    await eventually(lambda: issuer.server.get("", "secrets", "peer-to-b", NAMESPACE) is None,
                     what="the peer Secret collected with its ClusterPeer")
    answer = await issuer.renew("b", expired)
    assert (answer.status, answer.body["reason"]) == (403, "PeerUnknown")
    assert issuer.server.get("", "secrets", "peer-to-b", NAMESPACE) is None
    assert renewal.renewal_failure("to-a", answer.status, answer.body) == (cond.PEER_REFUSED_CERTIFICATE,
                                                                          renewal.REVOKED)


async def test_a_not_yet_valid_certificate_is_refused_all_but_its_renewal(issuer):
    future = issuer.issue("b", now() + 2 * DAY)
    await issuer.peering("b", future)
    answer = await issuer.call("notify", "b", future, body={})
    assert (answer.status, answer.body["reason"]) == (401, "CertificateNotYetValid")
    renewed = await issuer.renew("b", future)
    assert renewed.status == 200 and pki.valid_at(renewed.body["certificate"], now())


async def test_a_certificate_of_the_ca_a_reenabled_module_no_longer_has_never_passes_the_handshake(issuer):
    expired = issuer.issue("b", now() - 3 * DAY)
    await issuer.peering("b", expired)
    old_ca = issuer.ca.cert_pem
    # The module disabled and enabled again: a new peering CA (the leader reissues the server certificates).
    issuer.server.delete("", "secrets", "peering-ca", NAMESPACE)
    await eventually(lambda: (issuer.server.get("", "secrets", "peering-ca", NAMESPACE) or {}).get("data")
                     and issuer.ca.cert_pem != old_ca, what="a new peering CA")
    served = lambda: issuer.runtime.feed.certificates  # noqa: E731
    await eventually(lambda: served() is not None and served().ca_pem == issuer.ca.cert_pem.encode()
                     and pki.issued_by(served().entrance_cert_pem.decode(), issuer.ca.cert_pem),
                     what="the gateway serving with the new CA")
    # A peer that trusts the new CA's entrance is refused in the handshake (unknown CA)...
    answer = await issuer.renew("b", expired, trust=issuer.ca.cert_pem)
    assert answer.status is None and answer.refused_certificate and answer.tls_alert == "unknown_ca"
    assert renewal.renewal_failure("to-a", answer.status, answer.body, refused_certificate=True,
                                   tls_alert="unknown_ca") == (cond.PEER_REFUSED_CERTIFICATE,
                                                               renewal.PEER_HAS_ANOTHER_CA)
    # ...and one that still trusts the old CA does not trust the entrance in the first place.
    answer = await issuer.renew("b", expired, trust=old_ca)
    assert answer.status is None and answer.untrusted_server == "foreign"
    reason, message = renewal.call_failure(None, answer.body, untrusted_server="foreign")
    assert reason == cond.PEER_UNREACHABLE and message.startswith(renewal.FOREIGN_ENTRANCE)
    assert issuer.issued("b") == [expired]


async def test_an_expired_certificate_is_refused_on_the_data_plane(issuer):
    expired = issuer.issue("b", now() - 3 * DAY)
    await issuer.peering("b", expired)
    # The control loop's client speaks only the peer protocol; the data plane is asked over the same TLS, on the
    # raw path (a GET) and the aiohttp path (a body).
    ctx = peer_context(issuer.ca.cert_pem, expired, issuer.keys["b"].key_pem)
    resolver = OverrideResolver({ENTRANCE: f"127.0.0.1:{issuer.gateway.entrance_port}"})
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, resolver=resolver)) as http:
            for method, data in (("GET", None), ("POST", b"{}")):
                async with http.request(method, f"https://{ENTRANCE}/api/v1/namespaces", data=data,
                                        headers={"Authorization": "Bearer x"}) as resp:
                    body = await resp.json()
                    assert (resp.status, body["reason"]) == (401, "CertificateExpired")
    finally:
        await resolver.close()
