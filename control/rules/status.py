"""The whole ClusterPeer status computed in one place from what a reconcile observed.

The reconciler writes it only when it differs from the stored status, so a steady state makes no write.
"""

from __future__ import annotations

from datetime import datetime

from control.rules.conditions import (
    CLIENT_CERT_ENFORCED,
    READY,
    SERVER_CERT_OURS,
    TOKEN_EXCHANGE_READY,
    Cond,
    Readiness,
    set_condition,
)

#: status fields the rules compute; a None value leaves the stored one as it is (e.g. the previous status.peer
#: after a refused offer), an empty value ({} or []) is written.
FIELDS = ("invite", "offer", "peer", "effectiveCapabilities", "grants", "access", "pairedProjectsCount")


def clusterpeer_status(
    current: dict | None,
    *,
    generation: int | None,
    now: datetime,
    readiness: Readiness,
    token_exchange: Cond | None = None,
    client_cert: Cond | None = None,
    server_cert: Cond | None = None,
    **fields,
) -> dict:
    """A new status: phase, observedGeneration, the conditions (transition times kept), and the given fields."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise TypeError(f"unknown ClusterPeer status fields: {', '.join(sorted(unknown))}")
    out = dict(current or {})
    for key, value in fields.items():
        if value is not None:
            out[key] = value
    conds = out.get("conditions") or []
    conds = set_condition(conds, READY, readiness.ready, generation=generation, now=now)
    for type_, value in ((TOKEN_EXCHANGE_READY, token_exchange), (CLIENT_CERT_ENFORCED, client_cert),
                         (SERVER_CERT_OURS, server_cert)):
        if value is not None:
            conds = set_condition(conds, type_, value, generation=generation, now=now)
    out["conditions"] = conds
    out["phase"] = readiness.phase
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def capability_status(current: dict | None, *, generation: int | None, now: datetime, accepted: Cond) -> dict:
    """The PeeringCapability status: its Accepted condition and observedGeneration."""
    out = dict(current or {})
    out["conditions"] = set_condition(out.get("conditions"), "Accepted", accepted, generation=generation, now=now)
    if generation is not None:
        out["observedGeneration"] = generation
    return out
