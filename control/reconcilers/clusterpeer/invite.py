"""Invite: the inviting side's status.invite, a connection string issued when there is none, the unused one
expired, or the used one's redemption can no longer complete (`rules.invite.decide_invite`). The string is
redeemed elsewhere: by the joining cluster's `POST /v1/join`, answered in `control/handlers/join.py`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from control import connstring, pki
from control.reconcilers.clusterpeer.observe import MAX_REQUEUE, Observed
from control.rules import invite as invite_rules
from control.rules.conditions import INVALID_SPEC

log = logging.getLogger("peering.control.clusterpeer")


@dataclass(frozen=True)
class InviteOutcome:
    #: status.invite to write (the stored one when nothing is due).
    invite: dict | None
    #: A spec problem (reason, message): an unusable spec.invite.tokenTTL, or a string that cannot be encoded.
    problem: tuple[str, str] | None = None
    #: When to look again: the expiry of an unused string.
    wait: float = MAX_REQUEUE
    #: The joiner was answered but never delivered its half within the string's TTL: the peer Secret of that
    #: exchange goes (the certificate it holds for the joiner with it), and the next pass issues a fresh string.
    drop_secret: bool = False


def invite(obs: Observed, *, join_host: str, entrance_host: str, join_ca: Callable[[], str | None]) -> InviteOutcome:
    """`join_ca()` is the CA of the join endpoint when it is private (it travels in the string), else None."""
    current = obs.stored_invite
    if obs.credentials.progress == "partial" and current and current.get("used") and obs.spec.ttl is not None \
            and not obs.values.client_cert:
        # Answered, and waiting for the joiner's certificate for our key: the exchange completes when it arrives.
        deadline = invite_rules.completion_deadline(current, obs.spec.ttl)
        if deadline is not None and obs.now >= deadline:
            log.info("join abandoned", extra={"clusterpeer": obs.key})
            return InviteOutcome(current, drop_secret=True, wait=0.5)
        return InviteOutcome(current, wait=max(0.5, (deadline - obs.now).total_seconds() + 0.5) if deadline
                             else MAX_REQUEUE)
    if obs.credentials.progress != "none":
        return InviteOutcome(current)  # a joiner redeemed it: the peering exists, the invite is history
    if obs.spec.problem is not None or obs.spec.ttl is None:
        return InviteOutcome(current, obs.spec.problem)
    decision = invite_rules.decide_invite(current, ttl=obs.spec.ttl, now=obs.now)
    if decision.issue:
        token = invite_rules.generate_token()
        inv = connstring.Invitation(
            cluster_uuid=obs.own_uuid, join_url=f"https://{join_host}", entrance_host=entrance_host,
            ca_pin=pki.spki_pin(obs.ca.cert_pem), token_id=token.token_id, token_secret=token.secret,
            expires_at=decision.expires_at, join_ca_pem=join_ca())
        try:
            text = connstring.encode(inv)
        except ValueError as exc:
            return InviteOutcome(current, (INVALID_SPEC, str(exc)))
        current = invite_rules.invite_status(token, text, decision.expires_at, previous=current, why=decision.why,
                                             now=obs.now)
        log.info("connection string issued", extra={"clusterpeer": obs.key, "why": decision.why,
                                                    "tokenID": token.token_id})
    expires = invite_rules.parse_time(current.get("expiresAt")) if current else None
    if current and current.get("used"):
        # A used string is looked at again when its redemption's time to complete runs out.
        expires = invite_rules.completion_deadline(current, obs.spec.ttl)
    wait = (expires - obs.now).total_seconds() + 0.5 if expires else MAX_REQUEUE
    return InviteOutcome(current, None, max(0.5, wait))
