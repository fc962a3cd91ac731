"""Two replicas of the runtime against one emulated cluster: the leader bootstraps the certificates, both
publish the same registry, and nothing writes in steady state but the leader's Lease renewals."""

from __future__ import annotations

import base64

from control import kube as k
from control import pki
from control.config import ControlSettings, LeaseSettings, Settings
from control.process import Runtime
from tests.control.conftest import CLUSTER_UUID, NAMESPACE, eventually

TEMPLATE = "%s.t.lab"


class RecordingGateway:
    """Receives what the feed publishes, as `gateway.server.Gateway` would."""

    def __init__(self):
        self.registries = []
        self.certificates = []

    def publish(self, registry):
        self.registries.append(registry)

    async def start(self):
        pass

    async def stop(self):
        pass

    async def reload_certificates(self, *, entrance_cert_pem, entrance_key_pem, ca_pem, egress_cert_pem,
                                  egress_key_pem):
        self.certificates.append(dict(entrance=entrance_cert_pem, entrance_key=entrance_key_pem, ca=ca_pem,
                                      egress=egress_cert_pem, egress_key=egress_key_pem))


def settings(identity):
    return Settings(public_domain_template=TEMPLATE,
                    lease=LeaseSettings(identity=identity, duration=2.0, renew_deadline=1.5, retry_period=0.05),
                    control=ControlSettings(feed_coalesce=0.01))


def non_lease_writes(session):
    return {key: n for key, n in session.write_counts.items() if key[1] != "leases"}


async def test_leader_bootstraps_both_replicas_publish_and_steady_state_makes_no_writes(api, kube):
    server, kubeconfig = api
    gw_a, gw_b = RecordingGateway(), RecordingGateway()
    async with await k.KubeSession.connect(str(kubeconfig)) as kube_b:
        a = Runtime(settings("a"), kube, gw_a)
        b = Runtime(settings("b"), kube_b, gw_b)
        await a.start()
        try:
            await eventually(lambda: a.elector.is_leader, what="a leads")
            await b.start()
            await eventually(lambda: gw_a.certificates and gw_b.certificates, what="certificates on both")
            await eventually(lambda: a.ready and b.ready, what="both ready")

            certs = gw_b.certificates[-1]
            ca_pem = certs["ca"].decode()
            assert pki.issued_by(certs["entrance"].decode(), ca_pem)
            assert pki.dns_names(certs["entrance"].decode()) == ["peering-gateway.t.lab"]
            assert pki.issued_by(certs["egress"].decode(), ca_pem)
            assert gw_a.registries[-1].cluster_uuid == CLUSTER_UUID == gw_b.registries[-1].cluster_uuid
            assert a.elector.is_leader and not b.elector.is_leader

            # Steady state: a few renewals pass, and only the Lease is written, only by the leader.
            # The bootstrap wrote the CA and the two server certificates, and an Event for each certificate.
            written = non_lease_writes(kube)
            assert written == {("POST", "secrets"): 3, ("POST", "events"): 2}
            renewals = kube.write_counts[("PUT", "leases")]
            await eventually(lambda: kube.write_counts[("PUT", "leases")] >= renewals + 5, what="renewals")
            assert non_lease_writes(kube) == written
            assert kube_b.writes == 0, "a replica without the Lease must not write at all"
            published = len(gw_a.registries)

            # A live peer appears in both registries.
            server.create({"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                           "metadata": {"name": "b"}, "spec": {"type": "Invite"}})
            ca = pki.CertAndKey(ca_pem, _secret_pem(server, "peering-ca", "tls.key"))
            issued = pki.issue_server_cert(ca, ["peer.example"], now=_now())
            server.create({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                           "metadata": {"name": "peer-b", "namespace": NAMESPACE,
                                        "labels": {"app.kubernetes.io/managed-by": "peering"}},
                           "data": {"issued.crt": base64.b64encode(issued.cert_pem.encode()).decode(),
                                    "peer-uuid": base64.b64encode(b"uuid-b").decode()}})
            fingerprint = pki.fingerprint(issued.cert_pem)
            for gw in (gw_a, gw_b):
                await eventually(lambda gw=gw: "b" in gw.registries[-1].peers, what="the peer in the registry")
                assert gw.registries[-1].by_fingerprint[fingerprint].name == "b"
            assert len(gw_a.registries) > published
            assert gw_a.registries[-1].generation > gw_a.registries[published - 1].generation

            # The leader repairs a deleted server certificate and both gateways reload it.
            reloads = len(gw_b.certificates)
            server.delete("", "secrets", "peering-gateway-tls", NAMESPACE)
            await eventually(lambda: len(gw_b.certificates) > reloads, what="reissued certificate reloaded")
            new_entrance = gw_b.certificates[-1]["entrance"].decode()
            assert new_entrance != certs["entrance"].decode() and pki.issued_by(new_entrance, ca_pem)
            assert gw_b.certificates[-1]["ca"] == certs["ca"], "the CA is never replaced while usable"

            # Handover: the leader stops, b takes over and, finding everything in place, writes nothing but the Lease.
            await a.stop()
            await eventually(lambda: b.elector.is_leader, timeout=5, what="b leads")
            await eventually(lambda: b.controller.runners[0].reconciles >= 1, what="b reconciles")
            assert non_lease_writes(kube_b) == {}
        finally:
            await a.stop()
            await b.stop()


def _secret_pem(server, name, key):
    secret = server.get("", "secrets", name, NAMESPACE)
    return base64.b64decode(secret["data"][key]).decode()


def _now():
    import datetime

    return datetime.datetime.now(datetime.timezone.utc)
