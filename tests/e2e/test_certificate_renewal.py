"""Short-lived certificates renewed before they expire, each renewal an Event: two lab clusters whose peering
processes issue certificates for 24 seconds (`--client-cert-lifetime`, `--server-cert-lifetime`; production: 24 and
12 hours), so that within a minute every certificate is renewed at half of its lifetime, several times, over the
peer protocol for the client certificates, and the peering stays Ready throughout. `peering check` shows the next
expiry and renewal."""

from __future__ import annotations

import base64
import datetime

import pytest

from control import pki
from lab.testing import apiserver_backends, lab_clusters
from check_helpers import check, line
from peering_lab import (clusterpeer, connection_string, create_invite, create_join, fast_peering_command, ready,
                         until, until_equal)

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.timeout(180)]

LIFETIME = "24"


def short_lived(cluster) -> list[str] | None:
    cmd = fast_peering_command(cluster)
    return None if cmd is None else cmd + ["--client-cert-lifetime", LIFETIME, "--server-cert-lifetime", LIFETIME]


def _cert(cluster, secret: str, key: str) -> str:
    data = (cluster.api.get("", "secrets", secret, "d8-peering") or {}).get("data") or {}
    return base64.b64decode(data.get(key, "")).decode()


def _renewals(cluster, kind: str, name: str) -> list[str]:
    return [e.get("message", "") for e in cluster.api.list("", "events")
            if (e.get("involvedObject") or {}).get("kind") == kind and e["involvedObject"].get("name") == name
            and e.get("reason") == "CertificateRenewed"]


@pytest.mark.parametrize("apiserver", apiserver_backends())
async def test_certificates_of_seconds_are_renewed_at_half_over_the_peering(tmp_path, apiserver):
    async with lab_clusters(tmp_path, ["a", "b"], peering_command=short_lived, apiserver=apiserver) as lab:
        a, b = lab["a"], lab["b"]
        create_invite(a, "to-b")
        create_join(b, "to-a", await connection_string(a, "to-b"))
        for cluster, name in ((a, "to-b"), (b, "to-a")):
            await until_equal(lambda: ready(clusterpeer(cluster, name)), ("Active", "True", "PeeringReady"),
                              timeout=30)
        first = {"b client": _cert(b, "peer-to-a", "client.crt"), "a entrance": _cert(a, "peering-gateway-tls",
                                                                                       "tls.crt")}
        start = pki.load_cert(first["b client"]).not_valid_before_utc
        assert pki.not_after(first["b client"]) - start < datetime.timedelta(seconds=30)
        # Each side renews its client certificate toward the other, and a its entrance certificate, more than
        # once; every renewal is an Event on the ClusterPeer (ours, and the one the peer renewed) or the Secret.
        await until(lambda: len(_renewals(b, "ClusterPeer", "to-a")) >= 3, timeout=60,
                    what="b's renewals as Events")
        await until(lambda: len(_renewals(a, "Secret", "peering-gateway-tls")) >= 2, timeout=60,
                    what="a's entrance renewals as Events")
        notes = _renewals(b, "ClusterPeer", "to-a")
        assert any(n.startswith("our client certificate toward the peer was renewed; it is valid until") for n in notes)
        assert any(n.startswith("the client certificate this cluster issued to the peer was renewed") for n in notes)
        assert _renewals(a, "Secret", "peering-gateway-tls")[0].startswith("the entrance certificate was issued "
                                                                            "(due for renewal)")
        renewed = _cert(b, "peer-to-a", "client.crt")
        assert renewed != first["b client"]
        assert pki.public_key_fingerprint(renewed) == pki.public_key_fingerprint(first["b client"])
        assert _cert(a, "peering-gateway-tls", "tls.crt") != first["a entrance"]
        # The peering never stopped working: Ready stayed True (a failed renewal would have shown).
        for cluster, name in ((a, "to-b"), (b, "to-a")):
            assert ready(clusterpeer(cluster, name)) == ("Active", "True", "PeeringReady")
        # The check shows the next expiry and renewal.
        code, text = await check(b, "--peer", "to-a")
        assert code == 0
        ours = line(text, "certificates", "✓")[0]
        assert "ours toward the peer valid until" in ours and "(renewal at " in ours
