"""Checks of a ClusterPeer's spec that need no network: the first thing a reconcile does."""

from __future__ import annotations

from datetime import datetime

from control import connstring
from control.rules.conditions import INVALID_SPEC
from control.rules.invite import InviteError, parse_ttl


def spec_problem(spec: dict | None, *, now: datetime) -> tuple[str, str] | None:
    """(reason, message) of the first spec problem, or None. For a Join, the connection string is decoded with
    its expiry and spec.join.expectedClusterUUID, so a bad string never leads to a network call."""
    spec = spec if isinstance(spec, dict) else {}
    kind = spec.get("type")
    if kind == "Invite":
        try:
            parse_ttl((spec.get("invite") or {}).get("tokenTTL"))
        except InviteError as exc:
            return exc.reason, exc.message
        return None
    if kind == "Join":
        join = spec.get("join") or {}
        text = join.get("connectionString")
        if not isinstance(text, str) or not text.strip():
            return INVALID_SPEC, "spec.join.connectionString is empty; paste the inviting cluster's connection string"
        try:
            connstring.decode(text, now=now, expected_cluster_uuid=join.get("expectedClusterUUID") or None)
        except connstring.ConnectionStringError as exc:
            return exc.reason, exc.message
        return None
    return INVALID_SPEC, f"spec.type must be Invite or Join, not {kind!r}"
