"""Spec checks before any network call."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from control import connstring, pki
from control.rules.spec import check_spec, spec_problem

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
CA = pki.create_ca("a", now=NOW)
SECRET = "x" * 43
STRING = connstring.encode(
    connstring.Invitation("a-uuid", "https://peering.a.lab", "peering-gateway.a.lab", pki.spki_pin(CA.cert_pem),
                          "abc", SECRET, NOW + timedelta(hours=1))
)


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"type": "Invite"}, None),
        ({"type": "Invite", "invite": {"tokenTTL": "1h"}}, None),
        ({"type": "Invite", "invite": {"tokenTTL": "5m"}}, "InvalidTokenTTL"),
        ({"type": "Join", "join": {"connectionString": STRING}}, None),
        ({"type": "Join", "join": {"connectionString": STRING, "expectedClusterUUID": "a-uuid"}}, None),
        ({"type": "Join", "join": {"connectionString": STRING, "expectedClusterUUID": "other"}}, "ClusterNotExpected"),
        ({"type": "Join", "join": {"connectionString": STRING[:-5]}}, "Malformed"),
        ({"type": "Join", "join": {}}, "InvalidSpec"),
        ({"type": "Join"}, "InvalidSpec"),
        ({"type": "Peer"}, "InvalidSpec"),
        (None, "InvalidSpec"),
    ],
)
def test_spec_problem(spec, reason):
    got = spec_problem(spec, now=NOW)
    assert (got[0] if got else None) == reason
    if got:
        assert SECRET not in got[1]


def test_expired_string():
    got = spec_problem({"type": "Join", "join": {"connectionString": STRING}}, now=NOW + timedelta(hours=2))
    assert got[0] == "Expired"


def test_check_spec_gives_what_the_phases_need():
    invite = check_spec({"type": "Invite", "invite": {"tokenTTL": "90m"}}, now=NOW)
    assert (invite.type, invite.ttl, invite.problem) == ("Invite", timedelta(minutes=90), None)
    assert check_spec({"type": "Invite"}, now=NOW).ttl == timedelta(hours=24)
    join = check_spec({"type": "Join", "join": {"connectionString": STRING}}, now=NOW)
    assert join.type == "Join" and join.problem is None
    assert (join.invitation.cluster_uuid, join.invitation.token_secret) == ("a-uuid", SECRET)
    bad = check_spec({"type": "Join", "join": {"connectionString": STRING}}, now=NOW + timedelta(hours=2))
    assert bad.invitation is None and bad.problem[0] == "Expired"
