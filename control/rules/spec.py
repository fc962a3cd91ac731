"""A ClusterPeer's spec read as the reconciler needs it, with every check that needs no network.

`check_spec` gives the type, the token lifetime of an Invite, the decoded connection string of a Join, or the first
problem as (reason, message). A Join's string is decoded with its expiry and spec.join.expectedClusterUUID, so a
bad string never leads to a network call. Whether a problem still matters is the reconciler's to say: a TTL once
the invite was used, or the string of a join that completed, no longer does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from control import connstring
from control.rules.conditions import INVALID_SPEC
from control.rules.invite import InviteError, parse_ttl

INVITE, JOIN = "Invite", "Join"


@dataclass(frozen=True)
class SpecCheck:
    type: str
    #: spec.invite.tokenTTL of an Invite (its default when unset).
    ttl: timedelta | None = None
    #: The decoded spec.join.connectionString of a Join.
    invitation: connstring.Invitation | None = None
    #: The first problem, (reason, message); the message never carries the token.
    problem: tuple[str, str] | None = None


def check_spec(spec: dict | None, *, now: datetime) -> SpecCheck:
    spec = spec if isinstance(spec, dict) else {}
    kind = spec.get("type")
    if kind == INVITE:
        try:
            return SpecCheck(INVITE, ttl=parse_ttl((spec.get("invite") or {}).get("tokenTTL")))
        except InviteError as exc:
            return SpecCheck(INVITE, problem=(exc.reason, exc.message))
    if kind == JOIN:
        join = spec.get("join") or {}
        text = join.get("connectionString")
        if not isinstance(text, str) or not text.strip():
            return SpecCheck(JOIN, problem=(INVALID_SPEC, "spec.join.connectionString is empty; paste the inviting "
                                                          "cluster's connection string"))
        try:
            inv = connstring.decode(text, now=now, expected_cluster_uuid=join.get("expectedClusterUUID") or None)
        except connstring.ConnectionStringError as exc:
            return SpecCheck(JOIN, problem=(exc.reason, exc.message))
        return SpecCheck(JOIN, invitation=inv)
    return SpecCheck(str(kind or ""), problem=(INVALID_SPEC, f"spec.type must be Invite or Join, not {kind!r}"))


def spec_problem(spec: dict | None, *, now: datetime) -> tuple[str, str] | None:
    """(reason, message) of the first spec problem, or None."""
    return check_spec(spec, now=now).problem
