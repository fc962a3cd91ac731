"""Observe: what one pass of the ClusterPeer reconciler reads before it acts, as one frozen value.

Everything here comes from the caches and the cluster's facts (its UUID, CA, ServiceAccount issuer), never from
the peer. `observe` is pure: it builds our offer to the peer (status.offer), reads the peer Secret, says how far the
credentials exchange got and whether the peering was made with another CA, and checks the spec.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from contract.peer_secret import PeerCredentials
from control import pki
from control.rules import credentials as creds
from control.rules import offer as offer_rules
from control.rules.capabilities import ValidatedCapability
from control.rules.effective import offered_capabilities
from control.rules.spec import SpecCheck, check_spec

NAME = "clusterpeer"
#: The longest a healthy peering waits between passes (self-check, renewal, invite expiry are all re-checked).
MAX_REQUEUE = 300.0


@dataclass(frozen=True)
class Observed:
    cp: dict
    now: datetime.datetime
    own_uuid: str
    ca: pki.CertAndKey
    spec: SpecCheck
    #: Our offer to the peer (status.offer), from the opened and Accepted capabilities and our projects.
    offer: dict
    local_capabilities: dict[str, ValidatedCapability]
    local_projects: dict[str, list[str]]
    #: The peer Secret `peer-<name>` as the cache holds it, and its values.
    secret: dict | None
    values: PeerCredentials
    credentials: creds.CredentialsState
    #: The peering was made with a peering CA other than the current one (the module was re-enabled).
    other_ca: bool
    #: Why projects cannot pair here (the Project API is not served), or None.
    projects_absent: str | None

    @property
    def key(self) -> str:
        return self.cp["metadata"]["name"]

    @property
    def status(self) -> dict:
        """The stored status."""
        return self.cp.get("status") or {}

    @property
    def generation(self) -> int | None:
        return (self.cp.get("metadata") or {}).get("generation")

    @property
    def stored_peer(self) -> dict | None:
        peer = self.status.get("peer")
        return peer if isinstance(peer, dict) else None

    @property
    def stored_invite(self) -> dict | None:
        invite = self.status.get("invite")
        return invite if isinstance(invite, dict) else None


def observe(cp: dict, *, now: datetime.datetime, own_uuid: str, ca: pki.CertAndKey, issuer: tuple[str, str],
            peer_secret: dict | None, local_capabilities: dict[str, ValidatedCapability],
            local_projects: dict[str, list[str]], projects_absent: str | None, peering_version: str) -> Observed:
    spec = cp.get("spec") or {}
    opened = [c for c in spec.get("capabilities") or [] if isinstance(c, str)]
    issuer_url, jwks = issuer
    offer = offer_rules.build_offer(issuer_url=issuer_url, jwks=jwks, projects=local_projects,
                                    capabilities=offered_capabilities(opened, local_capabilities),
                                    peering_version=peering_version)
    values = PeerCredentials.from_secret(peer_secret)
    credentials = creds.credentials_state(values, ca.cert_pem, now)
    # A re-enabled module has a new CA and, its namespace having been removed, maybe no peer Secret either.
    other_ca = credentials.from_other_ca or creds.made_with_other_ca(cp.get("status") or {}, ca.cert_pem)
    return Observed(cp=cp, now=now, own_uuid=own_uuid, ca=ca, spec=check_spec(spec, now=now), offer=offer,
                    local_capabilities=local_capabilities, local_projects=local_projects, secret=peer_secret,
                    values=values, credentials=credentials, other_ca=other_ca, projects_absent=projects_absent)
