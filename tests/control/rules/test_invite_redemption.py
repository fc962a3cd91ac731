"""A redemption that a crash cut short: status.invite records the redeemer in the write that marks the
token used, the same joiner is answered again, and a redemption that can no longer complete is re-issued with a
reason instead of hanging."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from control.rules import conditions as c
from control.rules import invite

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
TTL = timedelta(hours=1)
B_UUID = "b0000000-0000-4000-8000-00000000000b"
KEY = "f" * 64
TOKEN = invite.Token("abcd1234", "s" * 43)


def _fresh(expires=NOW + TTL) -> dict:
    return invite.invite_status(TOKEN, "d8peer1.xxx", expires)


def _used(redeemed_at=NOW) -> dict:
    return invite.mark_used(_fresh(), invite.Redeemer(B_UUID, KEY), redeemed_at)


def test_marking_used_records_who_and_when_in_the_same_write():
    used = _used()
    assert used["used"] is True
    assert used["redeemer"] == {"clusterUUID": B_UUID, "keyFingerprint": KEY, "redeemedAt": "2026-11-30T12:00:00Z"}
    assert invite.recorded_redeemer(used) == invite.Redeemer(B_UUID, KEY)
    assert invite.recorded_redeemer(_fresh()) is None
    assert invite.recorded_redeemer({**used, "redeemer": {"clusterUUID": B_UUID}}) is None
    # A re-issued string's note goes once its successor is redeemed.
    noted = {**_fresh(), "reissue": {"reason": "JoinAbandoned", "message": "m"}, "abandoned": {"reason": "x"}}
    assert "reissue" not in invite.mark_used(noted, invite.Redeemer(B_UUID, KEY), NOW)
    assert "abandoned" not in invite.mark_used(noted, invite.Redeemer(B_UUID, KEY), NOW)


@pytest.mark.parametrize(("presented_uuid", "key", "outcome", "reason"), [
    (B_UUID, KEY, "reanswer", "Redeemed"),       # the redeemer retrying: answered again, whatever is missing rebuilt
    (B_UUID, "e" * 64, "refuse", "TokenUsed"),   # another key
    ("c0000000-0000-4000-8000-00000000000c", KEY, "refuse", "TokenUsed"),  # another cluster
])
def test_the_recorded_redeemer_is_answered_again_without_any_secret(presented_uuid, key, outcome, reason):
    got = invite.redeem(_used(), TOKEN.text, presented_uuid, None, NOW + timedelta(minutes=5),
                        joiner_key_fingerprint=key, redeemed_by=invite.recorded_redeemer(_used()))
    assert (got.outcome, got.reason) == (outcome, reason)


@pytest.mark.parametrize(("current", "now", "issue", "why"), [
    # Redeemed, the exchange not started on this side: kept while the redeemer may still come back ...
    (_used(), NOW + TTL - timedelta(seconds=1), False, "Used"),
    # ... and re-issued once the TTL after the redemption passed: the joiner gave up.
    (_used(), NOW + TTL, True, "JoinAbandoned"),
    # A join with another key found it stranded: at once.
    ({**_used(), "abandoned": {"reason": "RedeemedWithAnotherKey"}}, NOW, True, "RedeemedWithAnotherKey"),
    # Used before the redeemer was recorded: its expiry bounds it.
    ({**_fresh(NOW + TTL), "used": True}, NOW + TTL - timedelta(seconds=1), False, "Used"),
    ({**_fresh(NOW + TTL), "used": True}, NOW + TTL, True, "JoinAbandoned"),
])
def test_a_used_string_is_reissued_only_when_its_redemption_can_no_longer_complete(current, now, issue, why):
    got = invite.decide_invite(current, ttl=TTL, now=now)
    assert (got.issue, got.why) == (issue, why)
    if issue:
        assert got.expires_at == now + TTL


def test_a_reissued_string_says_why_and_names_the_previous_redeemer():
    fresh = invite.invite_status(invite.Token("newid123", "n" * 43), "d8peer1.yyy", NOW + 2 * TTL,
                                 previous=_used(), why="JoinAbandoned", now=NOW + TTL)
    assert fresh["used"] is False and "redeemer" not in fresh and fresh["tokenID"] == "newid123"
    assert fresh["reissue"]["reason"] == "JoinAbandoned" and fresh["reissue"]["at"] == "2026-11-30T13:00:00Z"
    assert B_UUID in fresh["reissue"]["message"] and "new connection string" in fresh["reissue"]["message"]
    other = invite.invite_status(TOKEN, "d8peer1.z", NOW + TTL, previous=_used(), why="RedeemedWithAnotherKey")
    assert "another key" in other["reissue"]["message"]
    # An ordinary renewal (expired unused) carries no such note.
    assert "reissue" not in invite.invite_status(TOKEN, "d8peer1.z", NOW + TTL, previous=_fresh(), why="Expired")


def test_ready_shows_the_reissue_reason_until_the_new_string_is_used():
    fresh = invite.invite_status(TOKEN, "d8peer1.z", NOW + TTL, previous=_used(), why="RedeemedWithAnotherKey")
    got = c.readiness(c.PeeringState("Invite", invite=fresh), NOW)
    assert (got.phase, got.ready.status, got.ready.reason) == ("Pending", "False", "RedeemedWithAnotherKey")
    assert "valid until" in got.ready.message
    used = c.readiness(c.PeeringState("Invite", invite=_used()), NOW)
    assert (used.phase, used.ready.reason) == ("Pending", "CredentialsPending") and B_UUID in used.ready.message
    expired = c.readiness(c.PeeringState("Invite", invite={**fresh, "expiresAt": "2026-11-30T11:00:00Z"}), NOW)
    assert expired.ready.reason == "InviteExpired"


@pytest.mark.parametrize(("current", "now", "stranded"), [
    (_used(), NOW + timedelta(seconds=29), False),   # still under way on another replica
    (_used(), NOW + timedelta(seconds=30), True),
    ({**_fresh(), "used": True}, NOW, True),         # used before the redeemer was recorded
    ({**_used(), "abandoned": {"reason": "RedeemedWithAnotherKey"}}, NOW + TTL, False),  # marked already
    (_fresh(), NOW + TTL, False),                    # not used at all
    (None, NOW, False),
])
def test_a_redemption_without_its_secret_is_stranded_once_older_than_the_grace(current, now, stranded):
    assert invite.stranded(current, now, timedelta(seconds=30)) is stranded


def test_marking_abandoned_keeps_the_record():
    marked = invite.mark_abandoned(_used(), NOW)
    assert marked["abandoned"] == {"reason": "RedeemedWithAnotherKey", "at": "2026-11-30T12:00:00Z"}
    assert marked["redeemer"] == _used()["redeemer"] and marked["used"] is True
