"""The per-peer credentials Secret `peer-<clusterpeer>` (docs/internals.md): its desired shape, how far the
exchange got, whether the current peering CA issued it, and when our client certificate needs renewal."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime

from contract.names import peer_secret_name
from contract.peer_secret import PeerCredentials
from control import pki
from control.rules import ownership


def peer_secret(clusterpeer: dict, namespace: str, values: PeerCredentials) -> dict:
    """The Secret object with the given values (empty ones are left out), labelled and owned."""
    cp_name = clusterpeer["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": peer_secret_name(cp_name),
            "namespace": namespace,
            "labels": ownership.labels(cp_name),
            "ownerReferences": [ownership.owner_reference(clusterpeer)],
        },
        "data": values.to_data(),
    }


def secret_values(secret: dict | None) -> dict[str, str]:
    """The text values of one of the module's TLS Secrets as the API returns it (base64 data); unreadable keys are
    left out. A peer Secret is read as `PeerCredentials.from_secret`."""
    out = {}
    for k, v in ((secret or {}).get("data") or {}).items():
        try:
            out[k] = base64.b64decode(v, validate=True).decode()
        except (ValueError, TypeError):
            continue
    return out


@dataclass(frozen=True)
class CredentialsState:
    #: "none", "partial" (one direction only) or "complete" (both certificates exist): conditions.PeeringState.
    progress: str
    #: The certificate we issued to the peer was not signed by the current peering CA (module re-enabled).
    from_other_ca: bool = False
    #: Our client certificate toward the peer is due for renewal over /peering/v1/certificate.
    renew_client_cert: bool = False


def credentials_state(values: PeerCredentials, ca_pem: str, now: datetime) -> CredentialsState:
    """How far the exchange got, read from the Secret's values."""
    have_ours = bool(values.client_cert and values.client_key and values.peer_ca)
    have_issued = bool(values.issued)
    if not (have_ours or have_issued):
        return CredentialsState("none")
    other_ca = have_issued and not pki.issued_by(values.issued, ca_pem)
    progress = "complete" if have_ours and have_issued else "partial"
    renew = have_ours and pki.needs_renewal(values.client_cert, now)
    return CredentialsState(progress, other_ca, renew)


def made_with_other_ca(status: dict, ca_pem: str) -> bool:
    """Whether the status of a ClusterPeer shows it was established with a peering CA other than `ca_pem`.

    A re-enabled module has a new CA and, its namespace having been removed, no peer Secret: the status of an
    established peering still names the CA it was made with (status.access.caBundle)."""
    access = status.get("access")
    old = access.get("caBundle") if isinstance(access, dict) else None
    if not isinstance(old, str) or not old.strip():
        return False
    try:
        return pki.fingerprint(old) != pki.fingerprint(ca_pem)
    except pki.PKIError:
        return True


def cluster_ca(ca_secret: dict | None) -> pki.CertAndKey | None:
    """The peering CA from its Secret, or None while the certificates reconciler has not created it."""
    values = secret_values(ca_secret)
    if not values.get("tls.crt") or not values.get("tls.key"):
        return None
    return pki.CertAndKey(values["tls.crt"], values["tls.key"])


def redeemer(values: PeerCredentials):
    """Who redeemed the invite, from the Secret (the peer's UUID and the key of the certificate issued to it), or
    None before a join."""
    from control.rules.invite import Redeemer  # the invite rules own the type

    uuid, issued = values.peer_uuid, values.issued
    if not uuid or not issued:
        return None
    try:
        return Redeemer(uuid, pki.public_key_fingerprint(issued))
    except pki.PKIError:
        return None
