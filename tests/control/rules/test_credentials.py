"""The peer Secret: its shape, how far the credentials exchange got, a foreign CA, and renewal."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from contract.peer_secret import PeerCredentials
from control import pki
from control.rules import credentials as cr

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
CA = pki.create_ca("a", now=NOW)
PEER_CA = pki.create_ca("b", now=NOW)
CP = {"metadata": {"name": "cluster-b", "uid": "u1"}}


def _values(*, ours=True, issued=True, issued_by=CA) -> PeerCredentials:
    key = pki.make_key_and_csr("a")
    peer_key = pki.make_key_and_csr("b")
    v = {"peer-uuid": "b", "peer-entrance": "peering-gateway.b.lab"}
    if ours:
        v.update({"peer-ca.crt": PEER_CA.cert_pem, "client.key": key.key_pem,
                  "client.crt": pki.issue_client_cert(PEER_CA, key.cert_pem, "a", now=NOW)})
    if issued:
        v["issued.crt"] = pki.issue_client_cert(issued_by, peer_key.cert_pem, "b", now=NOW)
    return PeerCredentials.from_values(v)


def test_secret_round_trip():
    values = _values()
    secret = cr.peer_secret(CP, "d8-peering", values)
    assert secret["metadata"]["name"] == "peer-cluster-b" and secret["type"] == "Opaque"
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "ClusterPeer"
    assert secret["metadata"]["labels"]["peering.deckhouse.io/clusterpeer"] == "cluster-b"
    assert PeerCredentials.from_secret(secret) == values
    assert cr.secret_values(secret) == values.values() and len(values.values()) == 6
    assert cr.secret_values(None) == {}
    assert cr.secret_values({"data": {"x": "!!!"}}) == {}


@pytest.mark.parametrize(
    ("values", "progress", "other"),
    [
        (PeerCredentials(), "none", False),
        (_values(issued=False), "partial", False),
        (_values(ours=False), "partial", False),
        (_values(), "complete", False),
        (_values(issued_by=pki.create_ca("old", now=NOW)), "complete", True),
    ],
)
def test_credentials_state(values, progress, other):
    got = cr.credentials_state(values, CA.cert_pem, NOW)
    assert (got.progress, got.from_other_ca, got.renew_client_cert) == (progress, other, False)


def test_renewal_is_due_after_two_thirds():
    assert cr.credentials_state(_values(), CA.cert_pem, NOW + timedelta(days=21)).renew_client_cert


def test_redeemer_from_the_secret():
    key = pki.make_key_and_csr("b")
    issued = pki.issue_client_cert(CA, key.cert_pem, "b", now=NOW)
    r = cr.redeemer(PeerCredentials(peer_uuid="b", issued=issued))
    assert r.cluster_uuid == "b" and r.key_fingerprint == pki.public_key_fingerprint(key.cert_pem)
    assert cr.redeemer(PeerCredentials(peer_uuid="b")) is None
    assert cr.redeemer(PeerCredentials(peer_uuid="b", issued="junk")) is None
