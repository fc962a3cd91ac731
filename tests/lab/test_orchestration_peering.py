"""Lab clusters with the real peering process: it gets ready, and its listeners answer under the lab's names."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl

import aiohttp
import pytest
from cryptography import x509

from lab import certs
from lab.cluster import default_peering_command, peering_executable
from lab.testing import lab_clusters

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(peering_executable() is None, reason="control/cli.py (`peering run`) is not in the tree"),
]


def _grant_cluster_uuid_watch(cluster) -> None:
    """The process lists and watches ConfigMap kube-system/d8-cluster-uuid with a `metadata.name` field selector;
    the chart grants only `get` on it by name, and the emulator does not take the field selector as the request's
    name (kube-apiserver does). Until the chart and the emulator agree, this test grants list and watch."""
    rbac = "rbac.authorization.k8s.io/v1"
    meta = {"name": "lab-test:cluster-uuid-watch", "namespace": "kube-system"}
    cluster.api.create({"apiVersion": rbac, "kind": "Role", "metadata": meta,
                        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}]})
    cluster.api.create({"apiVersion": rbac, "kind": "RoleBinding", "metadata": meta,
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": meta["name"]},
                        "subjects": [{"kind": "ServiceAccount", "name": "peering", "namespace": "d8-peering"}]})


def _command(cluster) -> list[str] | None:
    _grant_cluster_uuid_watch(cluster)
    return default_peering_command(cluster)


async def _entrance_certificate(port: int, ca_pem: bytes, host: str) -> x509.Certificate:
    """Handshake with the entrance by name through its passthrough, trusting only the cluster's peering CA."""
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=host)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der)
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ssl.SSLError, ConnectionError):
            pass  # the entrance may refuse a client without a certificate while we close


async def test_real_peering_processes_start_serve_and_stop(tmp_path):
    async with lab_clusters(tmp_path, ["a", "b"], peering_command=_command, ready_timeout=60) as lab:
        procs = []
        for name in ("a", "b"):
            c = lab[name]
            assert c.peering_state == "running", c.peering_state
            procs.append(c.process)
            info = json.loads((tmp_path / "lab.json").read_text())["clusters"][name]
            assert info["peering"]["ports"] == c.ports

            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{c.ports['ops']}/readyz") as r:
                    assert r.status == 200
                # peering.<c>.lab: the ingress reaches the real join listener, which refuses a malformed join.
                ctx = certs.client_ssl_context(c.pki.public_ca.cert_pem)
                async with http.post(f"https://127.0.0.1:{c.ingress.port}/v1/join", data=b"not json", ssl=ctx,
                                     server_hostname=f"peering.{name}.lab",
                                     headers={"Content-Type": "application/json"}) as r:
                    assert 400 <= r.status < 500, r.status

            # peering-gateway.<c>.lab: TLS passes through to the entrance, whose certificate the peering CA issued.
            ca_secret = c.api.get("", "secrets", "peering-ca", "d8-peering")
            ca_pem = base64.b64decode(ca_secret["data"]["tls.crt"])
            cert = await _entrance_certificate(c.entrance_lb.port, ca_pem, f"peering-gateway.{name}.lab")
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert f"peering-gateway.{name}.lab" in sans.get_values_for_type(x509.DNSName)
    # Stopped with SIGTERM; each process shut down cleanly.
    assert [p.returncode for p in procs] == [0, 0]
