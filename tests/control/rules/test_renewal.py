"""How our client certificate's renewal reads on the ClusterPeer (control/rules/renewal.py): each failure's reason
and fix, the message while the peer is away with the certificate expired, and the note of the Event after."""

from __future__ import annotations

import datetime

import pytest

from control.rules import conditions as cond
from control.rules import renewal

T0 = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.timezone.utc)


@pytest.mark.parametrize("status, body, tls, reason, says", [
    (None, "connection refused", {}, cond.PEER_UNREACHABLE, "did not answer (connection refused)"),
    (403, {"reason": "PeerUnknown"}, {}, cond.PEER_REFUSED_CERTIFICATE, "probably deleted its ClusterPeer"),
    (None, "TLS failed", {"refused_certificate": True}, cond.PEER_REFUSED_CERTIFICATE, "is revoked"),
    (None, "TLS failed", {"refused_certificate": True, "tls_alert": "unknown_ca"}, cond.PEER_REFUSED_CERTIFICATE,
     "CredentialsFromOtherCA"),
    (None, "TLS failed", {"refused_certificate": True, "tls_alert": "certificate_expired"},
     cond.PEER_REFUSED_CERTIFICATE, "update the module there"),
    (None, "not trusted", {"untrusted_server": "foreign"}, cond.PEER_UNREACHABLE, "disabled and enabled again"),
    (None, "not trusted", {"untrusted_server": "expired"}, cond.PEER_UNREACHABLE, "renews it at its start"),
    (403, {"reason": "KeyMismatch", "message": "x"}, {}, "KeyMismatch", "d8-peering/peer-to-b is not the one"),
    (503, {"reason": "NotReady", "message": "retry later"}, {}, cond.PEER_UNREACHABLE, "HTTP 503 (NotReady"),
])
def test_each_failed_renewal_has_its_reason_and_what_to_do(status, body, tls, reason, says):
    got, message = renewal.renewal_failure("to-b", status, body, **tls)
    assert got == reason and says in message
    if reason == "KeyMismatch":
        assert "Restore the Secret" in message and "establish the peering anew" in message


def test_every_reason_a_renewal_can_end_on_keeps_the_peering_active():
    for reason in (cond.PEER_UNREACHABLE, cond.PEER_REFUSED_CERTIFICATE, "KeyMismatch"):
        state = cond.PeeringState("Join", "complete", has_peer_offer=True, sync_error=(reason, "m"))
        assert cond.readiness(state).phase == cond.ACTIVE and reason in cond.SYNC_REASONS


def test_while_the_peer_is_away_the_expired_certificate_is_said_to_come_back_by_itself():
    message = renewal.expired_meanwhile("the peer's entrance did not answer (refused); the peering stays.",
                                        "2026-03-02T12:00:00Z")
    assert message.startswith("the peer's entrance did not answer (refused); the peering stays. Our client")
    assert "expired meanwhile, at 2026-03-02T12:00:00Z" in message and "nothing to do" in message
    assert "anew" not in message


def test_the_outage_starts_at_the_last_sync_this_process_saw_else_at_the_last_contact_the_api_keeps():
    remembered = (T0 - datetime.timedelta(days=3)).timestamp()
    assert renewal.last_contact(remembered, {}, []) == (T0 - datetime.timedelta(days=3), "the last successful sync")
    status = {"peer": {"lastSyncTime": "2026-02-01T00:00:00Z"},
              "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-02-10T00:00:00Z"}]}
    renewed = T0 - datetime.timedelta(days=4)
    since, what = renewal.last_contact(0.0, status, [renewed, T0 - datetime.timedelta(days=9)])
    assert since == renewed and "before its own restart" in what
    # A Ready that went False says when the peer stopped answering, not that it answered then.
    status["conditions"][0].update(status="False", lastTransitionTime=T0.isoformat())
    assert renewal.last_contact(0.0, status, [])[0] == datetime.datetime(2026, 2, 1, tzinfo=datetime.timezone.utc)
    assert renewal.last_contact(0.0, {}, []) is None


def test_the_event_after_the_outage_says_how_long_the_peer_was_away():
    since = (T0 - datetime.timedelta(days=30, hours=2), "the last successful sync")
    note = renewal.outage_note(since, T0, T0 - datetime.timedelta(days=29), T0 + datetime.timedelta(hours=24))
    assert note == ("our client certificate toward the peer was renewed after an outage: it had expired at "
                    "2026-01-31T12:00:00Z while the peer was unreachable, and the peer was away for 30d2h (since "
                    "2026-01-30T10:00:00Z, the last successful sync); the peering resumed by itself, the new "
                    "certificate is valid until 2026-03-02T12:00:00Z")
    assert "away for longer than that" in renewal.outage_note(None, T0, T0, T0)
