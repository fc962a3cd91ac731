"""The whole status of a ClusterPeer, and of a PeeringCapability, computed in one place from what a reconcile
observed.

The reconcilers write it only when it differs from the stored status; unchanged conditions keep their
lastTransitionTime, so an unchanged world yields a status equal to the stored one and no write. One field has a
second writer: the join handler sets a redemption's `status.invite` alone (`rules.invite.mark_used`,
`mark_abandoned`); both writes go through `control/clusterpeer_status.py`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from control.rules.conditions import (
    ACCEPTED,
    CLIENT_CERT_ENFORCED,
    READY,
    SERVER_CERT_OURS,
    TOKEN_EXCHANGE_READY,
    Cond,
    Readiness,
    set_condition,
)


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP: Any = _Keep()
"""A field or condition given as KEEP stays as stored (the status of a peering made with another CA keeps its
invite and access as the evidence); None leaves it out."""

#: status fields besides phase, conditions and observedGeneration.
FIELDS = ("invite", "offer", "peer", "effectiveCapabilities", "grants", "access", "pairedProjectsCount")


def clusterpeer_status(
    current: dict | None,
    *,
    generation: int | None,
    now: datetime,
    readiness: Readiness,
    token_exchange: Cond | None = KEEP,
    client_cert: Cond | None = KEEP,
    server_cert: Cond | None = KEEP,
    invite: dict | None = KEEP,
    offer: dict | None = KEEP,
    peer: dict | None = KEEP,
    effectiveCapabilities: list[str] | None = KEEP,  # noqa: N803 - named as the status field
    grants: list[dict] | None = KEEP,
    access: dict | None = KEEP,
    pairedProjectsCount: int | None = KEEP,  # noqa: N803
) -> dict:
    """A new status: phase and Ready from `readiness`, the other conditions, observedGeneration, and the fields.

    Each field and condition is a value to write, None to leave it out, or KEEP (the default) for the stored one.
    """
    current = current or {}
    given = {"invite": invite, "offer": offer, "peer": peer, "effectiveCapabilities": effectiveCapabilities,
             "grants": grants, "access": access, "pairedProjectsCount": pairedProjectsCount}
    out: dict = {}
    for key in FIELDS:
        value = current.get(key) if given[key] is KEEP else given[key]
        if value is not None:
            out[key] = value
    conditions = set_condition(current.get("conditions"), READY, readiness.ready, generation=generation, now=now)
    for type_, value in ((TOKEN_EXCHANGE_READY, token_exchange), (CLIENT_CERT_ENFORCED, client_cert),
                         (SERVER_CERT_OURS, server_cert)):
        if value is None:
            conditions = [c for c in conditions if c.get("type") != type_]
        elif value is not KEEP:
            conditions = set_condition(conditions, type_, value, generation=generation, now=now)
    out["conditions"] = conditions
    out["phase"] = readiness.phase
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def capability_status(current: dict | None, *, generation: int | None, now: datetime, accepted: Cond) -> dict:
    """The PeeringCapability status: its Accepted condition and observedGeneration."""
    out = dict(current or {})
    out["conditions"] = set_condition(out.get("conditions"), ACCEPTED, accepted, generation=generation, now=now)
    if generation is not None:
        out["observedGeneration"] = generation
    return out
