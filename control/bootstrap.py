"""The cluster's own certificates, kept by the leader: the peering CA and the entrance and egress server certs.

A reconciler like any other (one key, "certificates"): it reads the three Secrets from the cache, decides with
`plan` (pure) what is missing or due, and writes only that. The CA is created once and never replaced while it
is readable, because every peering depends on it; a server certificate is issued again when it is missing, was
issued by another CA, names other hosts, or has reached its renewal time (`control.pki.needs_renewal`). The
reconcile asks to run again at the earliest renewal time, so renewals happen without any event.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import logging
from typing import Callable

from contract.names import (CA_SECRET, EGRESS_TLS_SECRET, ENTRANCE_TLS_SECRET, MANAGED_BY, MANAGED_BY_SELECTOR,
                            MANAGED_BY_VALUE)
from control import pki
from control.apply import create_or_update
from control.clock import SYSTEM, Clock
from control.events import EventRecorder
from control.kube import SECRETS, KubeSession
from control.rules import events as event_rules
from control.workqueue import Result, Watch

log = logging.getLogger("peering.control.bootstrap")

KEY = "certificates"
MAX_RECHECK = 3600.0
"""Even with nothing due, look again hourly: cheap, and it repairs anything the cache missed."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to write: each field is the new material for that Secret, or None to leave it alone."""

    ca: pki.CertAndKey | None = None
    entrance: pki.CertAndKey | None = None
    egress: pki.CertAndKey | None = None
    recheck_at: datetime.datetime | None = None
    why: tuple[str, ...] = ()


def _pem(secret: dict | None, key: str) -> str:
    value = ((secret or {}).get("data") or {}).get(key)
    if not isinstance(value, str):
        return ""
    try:
        return base64.b64decode(value, validate=True).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        return ""


def _server_due(secret: dict | None, ca_pem: str, hosts: list[str], now: datetime.datetime) -> str | None:
    """Why a server certificate must be issued again, or None when it is fine."""
    cert, key = _pem(secret, "tls.crt"), _pem(secret, "tls.key")
    if not cert or not key:
        return "missing"
    try:
        if not pki.issued_by(cert, ca_pem):
            return "issued by another CA"
        if sorted(pki.dns_names(cert)) != sorted(hosts):
            return "issued for other host names"
        if pki.needs_renewal(cert, now):
            return "due for renewal"
    except pki.PKIError:
        return "unreadable"
    return None


def plan(*, ca_secret: dict | None, entrance_secret: dict | None, egress_secret: dict | None,
         public_domain_template: str, cluster_name: str, now: datetime.datetime,
         lifetime: datetime.timedelta = pki.SERVER_CERT_LIFETIME) -> Plan:
    """Decide what to (re)issue (pure apart from key generation)."""
    why: list[str] = []
    ca = pki.CertAndKey(_pem(ca_secret, "tls.crt"), _pem(ca_secret, "tls.key"))
    new_ca = None
    try:
        usable = bool(ca.cert_pem and ca.key_pem) and pki.valid_at(ca.cert_pem, now)
    except pki.PKIError:
        usable = False
    if not usable:
        # Without a usable CA nothing works; a new one means every peering must be established again,
        # which is what the guide says happens when the module's namespace is lost.
        new_ca = ca = pki.create_ca(cluster_name, now=now)
        why.append(f"{CA_SECRET}: {'missing' if ca_secret is None else 'unusable'}")
    issued: dict[str, pki.CertAndKey | None] = {}
    recheck: list[datetime.datetime] = []
    targets = {"entrance": (entrance_secret, [pki.entrance_host(public_domain_template)],
                            lambda: pki.issue_entrance_cert(ca, public_domain_template, now=now, lifetime=lifetime)),
               "egress": (egress_secret, list(pki.EGRESS_HOSTS),
                          lambda: pki.issue_egress_cert(ca, now=now, lifetime=lifetime))}
    for name, (secret, hosts, issue) in targets.items():
        reason = _server_due(secret, ca.cert_pem, hosts, now)
        if reason is None:
            issued[name] = None
            recheck.append(pki.renewal_time(_pem(secret, "tls.crt")))
            continue
        material = issue()
        issued[name] = material
        recheck.append(pki.renewal_time(material.cert_pem))
        why.append(f"{name}: {reason}")
    return Plan(ca=new_ca, entrance=issued["entrance"], egress=issued["egress"],
                recheck_at=min(recheck) if recheck else None, why=tuple(why))


def tls_secret(name: str, namespace: str, material: pki.CertAndKey, ca_pem: str | None) -> dict:
    data = {"tls.crt": material.cert_pem, "tls.key": material.key_pem}
    if ca_pem is not None:
        data["ca.crt"] = ca_pem
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY: MANAGED_BY_VALUE}},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


class CertificatesReconciler:
    """Keeps peering-ca, peering-gateway-tls and peering-egress-tls in the module namespace."""

    name = "certificates"

    def __init__(self, kube: KubeSession, *, namespace: str, public_domain_template: str,
                 cluster_name: Callable[[], str], clock: Clock = SYSTEM,
                 lifetime: datetime.timedelta = pki.SERVER_CERT_LIFETIME, events: EventRecorder | None = None) -> None:
        self.kube = kube
        self.events = events
        self.lifetime = lifetime
        self.namespace = namespace
        self.template = public_domain_template
        self.cluster_name = cluster_name
        self.clock = clock
        names = {CA_SECRET, ENTRANCE_TLS_SECRET, EGRESS_TLS_SECRET}
        self.watches = (Watch(SECRETS, namespace=namespace, label_selector=MANAGED_BY_SELECTOR,
                              keys=lambda _t, o: [KEY] if (o.get("metadata") or {}).get("name") in names else []),)

    def initial_keys(self) -> list[str]:
        # Nothing may exist yet to make an event: the first pass of every new leader creates what is missing.
        return [KEY]

    async def reconcile(self, key: str) -> Result:
        # Read from the API, not the cache: a Secret someone else created without our label is invisible to the
        # cache, and the CA must never be replaced because of a stale or filtered view.
        current = {name: await self.kube.get_or_none(SECRETS, name, self.namespace)
                   for name in (CA_SECRET, ENTRANCE_TLS_SECRET, EGRESS_TLS_SECRET)}
        now = self.clock.now()
        ca_secret = current[CA_SECRET]
        p = plan(ca_secret=ca_secret, entrance_secret=current[ENTRANCE_TLS_SECRET],
                 egress_secret=current[EGRESS_TLS_SECRET], public_domain_template=self.template,
                 cluster_name=self.cluster_name() or pki.entrance_host(self.template), now=now,
                 lifetime=self.lifetime)
        ca_pem = p.ca.cert_pem if p.ca else _pem(ca_secret, "tls.crt")
        if p.why:
            log.info("writing certificates", extra={"why": list(p.why)})
        if p.ca is not None:
            # The CA first: if writing a server cert fails afterwards, the next pass issues it from this CA.
            await self._write(CA_SECRET, tls_secret(CA_SECRET, self.namespace, p.ca, None), ca_secret)
        for (name, what), material in (((ENTRANCE_TLS_SECRET, "entrance"), p.entrance),
                                       ((EGRESS_TLS_SECRET, "egress"), p.egress)):
            if material is not None:
                written = await self._write(name, tls_secret(name, self.namespace, material, ca_pem), current[name])
                if self.events is not None:
                    why = next((w.split(": ", 1)[1] for w in p.why if w.startswith(f"{what}: ")), "due")
                    await self.events.emit(written, event_rules.server_certificate_event(what, why,
                                                                                         material.cert_pem))
        delay = MAX_RECHECK
        if p.recheck_at is not None:
            delay = min(delay, max(1.0, (p.recheck_at - now).total_seconds()))
        return Result(requeue_after=delay)

    async def _write(self, name: str, desired: dict, current: dict | None) -> dict:
        # The type of a Secret someone else created stays (the API refuses to change it); a concurrent writer
        # makes this a 409 (AlreadyExists for a create) and the key is retried after reading again.
        return (await create_or_update(self.kube, SECRETS, desired, current=current)).obj
