"""Invite rules: tokens, TTL, when a new string is issued, and every redemption outcome."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.rules import invite
from control.rules.invite import Redeemer

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def test_generated_tokens():
    tokens = {invite.generate_token() for _ in range(50)}
    assert len({t.token_id for t in tokens}) == 50
    for t in tokens:
        assert re.fullmatch(r"[a-z0-9]{8}", t.token_id)
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", t.secret)  # 256 bits, URL-safe
        assert t.secret not in repr(t)
        assert t.text == f"{t.token_id}.{t.secret}"


def test_token_hash():
    h = invite.token_hash("secret")
    assert h == "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
    assert len(h) == 64


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, timedelta(hours=24)),
        ("", timedelta(hours=24)),
        ("1h", timedelta(hours=1)),
        ("90m", timedelta(minutes=90)),
        ("1h30m", timedelta(minutes=90)),
        ("10m", timedelta(minutes=10)),
        ("24h", timedelta(hours=24)),
        ("600s", timedelta(minutes=10)),
        ("1.5h", timedelta(minutes=90)),
        ("23h59m59s", timedelta(hours=24, seconds=-1)),
    ],
)
def test_ttl_accepted(text, expected):
    assert invite.parse_ttl(text) == expected


@pytest.mark.parametrize(
    "text", ["9m", "9m59s", "24h1s", "25h", "0", "1d", "1 h", "h", "1h-", "-1h", "abc", "1H", 3600, "10m10"]
)
def test_ttl_refused(text):
    with pytest.raises(invite.InviteError) as err:
        invite.parse_ttl(text)
    assert err.value.reason == "InvalidTokenTTL"
    assert "10m" in err.value.message and "24h" in err.value.message or "string" in err.value.message


def _status(*, expires: datetime, used: bool = False, secret: str = "s" * 43) -> dict:
    return {
        "connectionString": "d8peer1.xxx",
        "expiresAt": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "tokenHash": invite.token_hash(secret),
        "tokenID": "abcd1234",
        "used": used,
    }


@pytest.mark.parametrize(
    ("current", "issue", "why"),
    [
        (None, True, "Missing"),
        ({}, True, "Missing"),
        ({"tokenID": "x"}, True, "Missing"),
        (_status(expires=NOW + timedelta(minutes=1)), False, "Valid"),
        (_status(expires=NOW), True, "Expired"),
        (_status(expires=NOW - timedelta(hours=1)), True, "Expired"),
        # Used before the redeemer was recorded and past its expiry with no Secret: stranded, so re-issued.
        (_status(expires=NOW - timedelta(hours=1), used=True), True, "JoinAbandoned"),
        (_status(expires=NOW + timedelta(hours=1), used=True), False, "Used"),
        ({**_status(expires=NOW), "expiresAt": "garbage"}, True, "Unreadable"),
        ({**_status(expires=NOW + timedelta(hours=1)), "connectionString": "<omitted>"}, False, "Valid"),
        ({**_status(expires=NOW + timedelta(hours=1)), "connectionString": ""}, True, "Missing"),
    ],
)
def test_decide_invite(current, issue, why):
    d = invite.decide_invite(current, ttl=timedelta(hours=1), now=NOW)
    assert (d.issue, d.why) == (issue, why)
    assert d.expires_at == (NOW + timedelta(hours=1) if issue else None)


def test_invite_status_keeps_only_the_hash():
    token = invite.Token("abcd1234", "q" * 43)
    st_ = invite.invite_status(token, "d8peer1.zzz", NOW + timedelta(hours=2))
    assert st_ == {
        "connectionString": "d8peer1.zzz",
        "expiresAt": "2026-11-30T14:00:00Z",
        "tokenHash": invite.token_hash("q" * 43),
        "tokenID": "abcd1234",
        "used": False,
    }
    assert "q" * 43 not in str(st_)
    assert invite.mark_used(st_, invite.Redeemer("b", "f" * 64), NOW)["used"] is True and st_["used"] is False


SECRET = "s" * 43
GOOD = f"abcd1234.{SECRET}"
LIVE = _status(expires=NOW + timedelta(hours=1))
USED = _status(expires=NOW + timedelta(hours=1), used=True)
B = Redeemer("b-uuid", "f" * 64)


@pytest.mark.parametrize(
    ("stored", "token", "joiner", "expected", "key", "by", "outcome", "reason"),
    [
        (LIVE, GOOD, "b-uuid", None, "f" * 64, None, "accept", "Accepted"),
        (LIVE, GOOD, "b-uuid", "b-uuid", "f" * 64, None, "accept", "Accepted"),
        (None, GOOD, "b-uuid", None, "", None, "refuse", "TokenInvalid"),
        (LIVE, f"abcd1234.{'t' * 43}", "b-uuid", None, "", None, "refuse", "TokenInvalid"),
        (LIVE, f"zzzz1234.{SECRET}", "b-uuid", None, "", None, "refuse", "TokenInvalid"),
        (LIVE, SECRET, "b-uuid", None, "", None, "refuse", "TokenInvalid"),
        (LIVE, "", "b-uuid", None, "", None, "refuse", "TokenInvalid"),
        (LIVE, "abcd1234.", "b-uuid", None, "", None, "refuse", "TokenInvalid"),
        ({**LIVE, "tokenHash": ""}, "abcd1234.", "b-uuid", None, "", None, "refuse", "TokenInvalid"),
        (_status(expires=NOW), GOOD, "b-uuid", None, "", None, "refuse", "TokenExpired"),
        ({**LIVE, "expiresAt": None}, GOOD, "b-uuid", None, "", None, "refuse", "TokenExpired"),
        (LIVE, GOOD, "c-uuid", "b-uuid", "", None, "refuse", "ClusterNotExpected"),
        (USED, GOOD, "b-uuid", None, "f" * 64, B, "reanswer", "Redeemed"),
        # Used and expired: the winner still gets its answer again after a crash.
        (_status(expires=NOW, used=True), GOOD, "b-uuid", None, "f" * 64, B, "reanswer", "Redeemed"),
        (USED, GOOD, "b-uuid", None, "e" * 64, B, "refuse", "TokenUsed"),  # same cluster, other key
        (USED, GOOD, "c-uuid", None, "f" * 64, B, "refuse", "TokenUsed"),  # other cluster, same key
        (USED, GOOD, "b-uuid", None, "", B, "refuse", "TokenUsed"),
        (USED, GOOD, "b-uuid", None, "f" * 64, None, "refuse", "TokenUsed"),  # winner unknown yet
        # The Secret was created but the crash came before `used` was written: still taken.
        (LIVE, GOOD, "b-uuid", None, "f" * 64, B, "reanswer", "Redeemed"),
        (LIVE, GOOD, "c-uuid", None, "e" * 64, B, "refuse", "TokenUsed"),
        # A used token with the wrong secret says nothing about use.
        (USED, f"abcd1234.{'t' * 43}", "b-uuid", None, "f" * 64, B, "refuse", "TokenInvalid"),
    ],
)
def test_redeem(stored, token, joiner, expected, key, by, outcome, reason):
    r = invite.redeem(stored, token, joiner, expected, NOW, joiner_key_fingerprint=key, redeemed_by=by)
    assert (r.outcome, r.reason) == (outcome, reason)
    assert r.ok is (outcome != "refuse")
    assert SECRET not in r.message


def test_unknown_and_wrong_answer_alike():
    unknown = invite.redeem(None, GOOD, "b", None, NOW)
    wrong = invite.redeem(LIVE, f"abcd1234.{'x' * 43}", "b", None, NOW)
    assert unknown == wrong


@settings(deadline=None)
@given(st.text(max_size=80))
def test_redeem_any_token_text(token):
    r = invite.redeem(LIVE, token, "b", None, NOW)
    assert r.outcome in {"accept", "refuse"}
    assert (r.outcome == "accept") == (token == GOOD)
