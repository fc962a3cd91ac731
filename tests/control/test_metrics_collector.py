"""The control loop's scrape-time metrics (control/metrics.py) from the caches of an emulated cluster: per peer
the Ready state and reason, the certificates' expiry and renewal, the last sync (leader only), whether this replica
leads; bounded labels, series gone with their object, and nothing secret in the text."""

from __future__ import annotations

import base64
import datetime

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families

from contract.peer_secret import PeerCredentials
from control import pki
from control.informers import Informers
from control.kube import CLUSTERPEERS, SECRETS
from control.metrics import ControlCollector
from control.reconcilers.memory import Memory, PeerMemory
from control.rules import credentials as creds
from tests.control.conftest import NAMESPACE, eventually

API_VERSION = "peering.deckhouse.io/v1alpha1"
NOW = datetime.datetime.now(datetime.timezone.utc)


def _samples(collector: ControlCollector) -> dict[tuple, float]:
    registry = prometheus_client.CollectorRegistry()
    registry.register(collector)
    text = prometheus_client.generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out, text


async def test_peerings_certificates_and_leadership_as_metrics(api, kube):
    server, _ = api
    ca = pki.create_ca("x", now=NOW)
    peer_ca = pki.create_ca("y", now=NOW)
    entrance = pki.issue_entrance_cert(ca, "%s.x.lab", now=NOW)
    server.create({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                   "metadata": {"name": "peering-gateway-tls", "namespace": NAMESPACE,
                                "labels": {"app.kubernetes.io/managed-by": "peering"}},
                   "data": {"tls.crt": base64.b64encode(entrance.cert_pem.encode()).decode(),
                            "tls.key": base64.b64encode(entrance.key_pem.encode()).decode()}})
    ok = server.create({"apiVersion": API_VERSION, "kind": "ClusterPeer", "metadata": {"name": "ok"},
                        "spec": {"type": "Join", "join": {"connectionString": "d8peer1.x"}}})
    server.update({**ok, "status": {"phase": "Active", "conditions": [
        {"type": "Ready", "status": "True", "reason": "PeeringReady", "message": "works",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}, subresource="status")
    down = server.create({"apiVersion": API_VERSION, "kind": "ClusterPeer", "metadata": {"name": "down"},
                          "spec": {"type": "Invite"}})
    server.update({**down, "status": {"phase": "Active", "conditions": [
        {"type": "Ready", "status": "False", "reason": "PeerUnreachable", "message": "no answer",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}, subresource="status")
    mine, theirs = pki.make_key_and_csr("x-uuid"), pki.make_key_and_csr("y-uuid")
    client = pki.issue_client_cert(peer_ca, mine.cert_pem, "x-uuid", now=NOW)
    issued = pki.issue_client_cert(ca, theirs.cert_pem, "y-uuid", now=NOW - datetime.timedelta(hours=2))
    server.create(creds.peer_secret(down, NAMESPACE, PeerCredentials(client_key=mine.key_pem, client_cert=client,
                                                                     issued=issued, peer_ca=peer_ca.cert_pem)))
    informers = Informers(kube)
    informers.get(CLUSTERPEERS)
    informers.get(SECRETS, namespace=NAMESPACE, label_selector="app.kubernetes.io/managed-by=peering")
    informers.start()
    try:
        await informers.wait_synced()
        leading = [False]
        memory = Memory()
        memory.keep("down", PeerMemory(last_sync=1_700_000_000.0))
        collector = ControlCollector(informers, NAMESPACE, leading=lambda: leading[0], memory=memory)
        samples, text = _samples(collector)
        assert samples[("peering_leader", ())] == 0.0
        assert samples[("peering_peer_ready", (("peer", "ok"),))] == 1.0
        assert samples[("peering_peer_ready", (("peer", "down"),))] == 0.0
        assert samples[("peering_peer_ready_info", (("peer", "down"), ("phase", "Active"),
                                                     ("reason", "PeerUnreachable")))] == 1.0
        assert samples[("peering_certificate_expiry_timestamp_seconds", (("certificate", "client"),
                                                                          ("peer", "down")))] == \
            pki.not_after(client).timestamp()
        assert samples[("peering_certificate_renewal_timestamp_seconds", (("certificate", "issued"),
                                                                           ("peer", "down")))] == \
            pki.renewal_time(issued).timestamp()
        assert samples[("peering_certificate_expiry_timestamp_seconds", (("certificate", "entrance"),
                                                                          ("peer", "")))] == \
            pki.not_after(entrance.cert_pem).timestamp()
        # Only the leader knows when a peer last answered.
        assert not any(name == "peering_peer_last_sync_timestamp_seconds" for name, _ in samples)
        leading[0] = True
        samples, text = _samples(collector)
        assert samples[("peering_leader", ())] == 1.0
        assert samples[("peering_peer_last_sync_timestamp_seconds", (("peer", "down"),))] == 1_700_000_000.0
        # Nothing of the Secrets' contents, only times.
        for secret_text in (mine.key_pem, entrance.key_pem, client, "d8peer1"):
            assert secret_text.splitlines()[1 if "\n" in secret_text else 0] not in text
        # A ClusterPeer deleted: its series are gone at the next scrape, those of its Secret too.
        server.delete("peering.deckhouse.io", "clusterpeers", "down")
        await eventually(lambda: informers.get(CLUSTERPEERS).get("down") is None, what="the deletion seen")
        samples, _ = _samples(collector)
        assert not any(dict(labels).get("peer") == "down" for _, labels in samples)
    finally:
        await informers.stop()
