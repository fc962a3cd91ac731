"""Valid inputs to start the control loop's harnesses from: a connection string, a join body, an offer message,
a CSR and a CA, made the way the module makes them."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
A_UUID = "9d1e5c3a-7b2f-4e6d-8a0c-5f3b1d7e9a2c"
B_UUID = "3f0c2f4e-1d5b-4c9a-9b7e-2a6f0e1c3d4b"


def material():
    from control import connstring, pki
    from control.rules import join as join_rules
    from control.rules import offer as offer_rules

    ca = pki.create_ca("fuzz", now=NOW)
    csr = pki.make_key_and_csr(B_UUID).cert_pem
    inv = connstring.Invitation(cluster_uuid=A_UUID, join_url="https://peering.a.example",
                                entrance_host="peering-gateway.a.example:443", ca_pin=pki.spki_pin(ca.cert_pem),
                                token_id="abc123", token_secret="s3cr3t-s3cr3t-s3cr3t-s3cr3t",
                                expires_at=NOW + timedelta(days=3650))
    offer = offer_rules.build_offer(issuer_url="https://kubernetes.default.svc.cluster.local",
                                    jwks='{"keys": [{"kty": "EC", "crv": "P-256", '
                                         '"x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", '
                                         '"y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}',
                                    projects={"shop": ["shop", "shop-db"]},
                                    capabilities=[{"name": "cm", "version": "v1", "scope": ["project"]}],
                                    peering_version="0.1.0")
    body = join_rules.join_request(inv, cluster_uuid=B_UUID, alias="b", entrance="peering-gateway.b.example:443",
                                   ca_pem=ca.cert_pem, csr_pem=csr, offer=offer)
    return {"ca": ca, "csr": csr, "invitation": inv, "connstring": connstring.encode(inv), "offer": offer,
            "join_body": json.dumps(body).encode(), "offer_message": json.dumps({"alias": "a", "offer": offer}).encode()}
