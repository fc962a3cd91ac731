"""The peer Secret: its shape, how far the credentials exchange got, a foreign CA, and renewal."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from control import pki
from control.rules import credentials as cr

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
CA = pki.create_ca("a", now=NOW)
PEER_CA = pki.create_ca("b", now=NOW)
CP = {"metadata": {"name": "cluster-b", "uid": "u1"}}


def _values(*, ours=True, issued=True, issued_by=CA) -> dict[str, str]:
    key = pki.make_key_and_csr("a")
    peer_key = pki.make_key_and_csr("b")
    v = {"peer-uuid": "b", "peer-entrance": "peering-gateway.b.lab"}
    if ours:
        v.update({"peer-ca.crt": PEER_CA.cert_pem, "client.key": key.key_pem,
                  "client.crt": pki.issue_client_cert(PEER_CA, key.cert_pem, "a", now=NOW)})
    if issued:
        v["issued.crt"] = pki.issue_client_cert(issued_by, peer_key.cert_pem, "b", now=NOW)
    return v


def test_secret_round_trip():
    values = _values()
    secret = cr.peer_secret(CP, "d8-peering", values)
    assert secret["metadata"]["name"] == "peer-cluster-b" and secret["type"] == "Opaque"
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "ClusterPeer"
    assert secret["metadata"]["labels"]["peering.deckhouse.io/clusterpeer"] == "cluster-b"
    assert cr.secret_values(secret) == values
    assert cr.secret_values(None) == {}
    assert cr.secret_values({"data": {"x": "!!!"}}) == {}
    with pytest.raises(ValueError, match="unknown keys"):
        cr.peer_secret(CP, "d8-peering", {"token": "x"})


@pytest.mark.parametrize(
    ("values", "progress", "other"),
    [
        ({}, "none", False),
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
    r = cr.redeemer({"peer-uuid": "b", "issued.crt": issued})
    assert r.cluster_uuid == "b" and r.key_fingerprint == pki.public_key_fingerprint(key.cert_pem)
    assert cr.redeemer({"peer-uuid": "b"}) is None
    assert cr.redeemer({"peer-uuid": "b", "issued.crt": "junk"}) is None
