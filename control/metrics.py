"""The metrics an administrator alerts on, computed when Prometheus scrapes, from what this replica holds.

Every replica has the same caches (ClusterPeers, the module's Secrets), so each exports the same peering state
and certificate expiries, and an alert or a panel reads them with `max by`/`min by`; what only the Lease holder
knows (when the peer last answered a pull) is exported by the leader alone, and `peering_leader` says which one
that is. Computed at scrape time, a series cannot go stale: a ClusterPeer deleted, or leadership lost, and its
series are gone with the next scrape. Labels are bounded: `peer` is a ClusterPeer's name, `reason` and `phase`
words of the module's own conditions, `certificate` one of five names.

| metric | labels | what |
|---|---|---|
| `peering_leader` | | 1 on the replica that holds the Lease and runs the reconcilers, else 0 |
| `peering_peer_ready` | peer | 1 while the ClusterPeer's Ready is True, else 0 |
| `peering_peer_ready_info` | peer, phase, reason | 1, with the phase and the Ready reason as labels |
| `peering_peer_last_sync_timestamp_seconds` | peer | when the peer last answered a pull with a valid offer (leader only) |
| `peering_certificate_expiry_timestamp_seconds` | peer, certificate | when a certificate expires |
| `peering_certificate_renewal_timestamp_seconds` | peer, certificate | when its renewal is due (half of its lifetime) |

`certificate` is `client` (ours toward the peer) or `issued` (the one this cluster issued to the peer, renewed by
the peer) with `peer` set, or `ca`, `entrance`, `egress` with `peer=""`.
"""

from __future__ import annotations

import functools
from typing import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily

from contract.names import CA_SECRET, EGRESS_TLS_SECRET, ENTRANCE_TLS_SECRET, MANAGED_BY_SELECTOR
from contract.peer_secret import PeerCredentials
from control import pki
from control.events import reason_label
from control.informers import Informers
from control.kube import CLUSTERPEERS, SECRETS
from control.reconcilers.memory import Memory
from control.rules import conditions as cond
from control.rules import credentials as creds
from control.rules.ownership import owner_names

MODULE_CERTIFICATES = {CA_SECRET: "ca", ENTRANCE_TLS_SECRET: "entrance", EGRESS_TLS_SECRET: "egress"}
#: The peer Secret's certificates by their label: ours toward the peer and the one this cluster issued to it.
PEER_CERTIFICATES = {"client": lambda values: values.client_cert, "issued": lambda values: values.issued}

#: (name, help, labels) of every family, as `describe` announces them.
FAMILIES = (
    ("peering_leader", "1 on the replica that holds the Lease and runs the reconcilers", ()),
    ("peering_peer_ready", "1 while the ClusterPeer's Ready condition is True", ("peer",)),
    ("peering_peer_ready_info", "The ClusterPeer's phase and Ready reason (always 1)", ("peer", "phase", "reason")),
    ("peering_peer_last_sync_timestamp_seconds", "When the peer last answered a pull with a valid offer (leader "
     "only)", ("peer",)),
    ("peering_certificate_expiry_timestamp_seconds", "When the certificate expires", ("peer", "certificate")),
    ("peering_certificate_renewal_timestamp_seconds", "When the certificate's renewal is due", ("peer", "certificate")),
)


@functools.lru_cache(maxsize=4096)
def _times(pem: str) -> tuple[float, float] | None:
    """(expiry, renewal) of the first certificate of a PEM text as Unix seconds; None when it cannot be read."""
    try:
        return pki.not_after(pem).timestamp(), pki.renewal_time(pem).timestamp()
    except (pki.PKIError, ValueError):
        return None


def _families() -> dict[str, GaugeMetricFamily]:
    return {name: GaugeMetricFamily(name, text, labels=list(labels)) for name, text, labels in FAMILIES}


class ControlCollector:
    """A prometheus_client collector over a replica's caches; register it on the registry /metrics serves."""

    def __init__(self, informers: Informers, namespace: str, *, leading: Callable[[], bool],
                 memory: Memory | None = None) -> None:
        self.informers = informers
        self.namespace = namespace
        self.leading = leading
        self.memory = memory

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return list(_families().values())

    def collect(self) -> Iterable[GaugeMetricFamily]:
        out = _families()
        leading = bool(self.leading())
        out["peering_leader"].add_metric([], 1.0 if leading else 0.0)
        clusterpeers = self.informers.get(CLUSTERPEERS)
        names = set()
        for cp in clusterpeers.items():
            name = (cp.get("metadata") or {}).get("name") or ""
            names.add(name)
            status = cp.get("status") or {}
            ready = cond.get_condition(status.get("conditions"), cond.READY) or {}
            out["peering_peer_ready"].add_metric([name], 1.0 if ready.get("status") == "True" else 0.0)
            out["peering_peer_ready_info"].add_metric(
                [name, reason_label(str(status.get("phase") or "Unknown")),
                 reason_label(str(ready.get("reason") or "Unknown"))], 1.0)
        memory = self.memory if leading else None
        if memory is not None:
            for name in sorted(names):
                last = memory.get(name).last_sync if memory.known(name) else 0.0
                if last:
                    out["peering_peer_last_sync_timestamp_seconds"].add_metric([name], last)
        secrets = self.informers.get(SECRETS, namespace=self.namespace, label_selector=MANAGED_BY_SELECTOR)
        for secret in secrets.items():
            secret_name = (secret.get("metadata") or {}).get("name", "")
            if secret_name in MODULE_CERTIFICATES:
                self._certificate(out, "", MODULE_CERTIFICATES[secret_name],
                                  creds.secret_values(secret).get("tls.crt"))
                continue
            owners = [o for o in owner_names(secret) if o in names]
            if not owners:
                continue
            values = PeerCredentials.from_secret(secret)
            for certificate, held in PEER_CERTIFICATES.items():
                self._certificate(out, owners[0], certificate, held(values))
        return list(out.values())

    @staticmethod
    def _certificate(out: dict[str, GaugeMetricFamily], peer: str, certificate: str, pem: str | None) -> None:
        times = _times(pem) if pem else None
        if times is None:
            return
        out["peering_certificate_expiry_timestamp_seconds"].add_metric([peer, certificate], times[0])
        out["peering_certificate_renewal_timestamp_seconds"].add_metric([peer, certificate], times[1])


def exported_names() -> set[str]:
    """The metric names this collector exports (the chart's monitoring test reads them)."""
    return {name for name, _, _ in FAMILIES}
