"""Which status changes are worth an Event, and what the Event says (control/rules/events.py), as tables."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from contract.peer_secret import PeerCredentials
from control import pki
from control.rules import events as ev

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
T0 = "2026-12-01T11:55:00Z"


def ready(status: str, reason: str, message: str = "msg", at: str = T0) -> dict:
    return {"type": "Ready", "status": status, "reason": reason, "message": message, "lastTransitionTime": at}


def cp(phase: str, *conditions: dict, **fields) -> dict:
    return {"phase": phase, "conditions": list(conditions), **fields}


def reasons(events) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in events]


def test_a_new_invite_is_one_event_with_its_id_and_expiry_never_the_string():
    new = cp("Pending", ready("False", "InvitePending"),
             invite={"tokenID": "abc123", "tokenHash": "h" * 64, "expiresAt": "2026-12-02T12:00:00Z",
                     "connectionString": "d8peer1.secret-part"})
    events = ev.clusterpeer_events(None, new, now=NOW)
    assert reasons(events) == [("Normal", "InvitePending")]
    assert "abc123" in events[0].note and "2026-12-02T12:00:00Z" in events[0].note
    assert "d8peer1" not in events[0].note and "h" * 64 not in events[0].note
    # A string issued again after the first expired says so.
    again = ev.clusterpeer_events(new, {**new, "invite": {**new["invite"], "tokenID": "def456"}}, now=NOW)
    assert reasons(again) == [("Normal", "InvitePending")] and "expired unused" in again[0].note
    # Nothing changed: nothing to say.
    assert ev.clusterpeer_events(new, new, now=NOW) == []


def test_joined_names_the_other_cluster_and_its_alias():
    old = cp("Pending", ready("False", "CredentialsPending"))
    new = cp("Active", ready("True", "PeeringReady", "the peering works"),
             peer={"clusterUUID": "uuid-b", "alias": "cluster-a"})
    [event] = ev.clusterpeer_events(old, new, now=NOW)
    assert (event.type, event.reason, event.action) == ("Normal", "PeeringReady", "Join")
    assert event.note == "the peering with cluster uuid-b (cluster-a) is established: the peering works"


@pytest.mark.parametrize(("old", "new", "expected"), [
    (ready("True", "PeeringReady"), ready("False", "PeerUnreachable", "did not answer"),
     ("Warning", "PeerUnreachable", "did not answer")),
    (ready("False", "PeerUnreachable", at="2026-12-01T11:58:30Z"), ready("True", "PeeringReady", "the peering works"),
     ("Normal", "PeeringReady", "the peering works again, after PeerUnreachable for 1m30s")),
    (ready("True", "PeeringReady"), ready("False", "PeerRefusedCertificate", "probably revoked"),
     ("Warning", "PeerRefusedCertificate", "probably revoked")),
    (ready("True", "PeeringReady"), ready("False", "AwaitingOffer", "waiting"), ("Normal", "AwaitingOffer", "waiting")),
    (ready("False", "PeerUnreachable", "a"), ready("False", "PeerUnreachable", "b"), None),
])
def test_ready_transitions_of_an_active_peering(old, new, expected):
    events = ev.clusterpeer_events(cp("Active", old), cp("Active", new), now=NOW)
    if expected is None:
        assert events == []  # the same reason with another message is not a transition
    else:
        assert [(e.type, e.reason, e.note) for e in events] == [expected]


def test_conditions_of_the_self_check_and_the_provider():
    first = cp("Active", ready("True", "PeeringReady"),
               {"type": "ClientCertEnforced", "status": "True", "reason": "ClientCertRequired", "message": "ok"},
               {"type": "TokenExchangeReady", "status": "False", "reason": "ProviderPending", "message": "wait"})
    # A first ClientCertRequired or ProviderPending is not news.
    assert ev.clusterpeer_events(cp("Active", ready("True", "PeeringReady")), first, now=NOW) == []
    later = cp("Active", ready("True", "PeeringReady"),
               {"type": "ClientCertEnforced", "status": "False", "reason": "ClientCertNotRequired",
                "message": "something terminates TLS"},
               {"type": "TokenExchangeReady", "status": "True", "reason": "ProviderReady", "message": "exchanges"})
    events = ev.clusterpeer_events(first, later, now=NOW)
    assert reasons(events) == [("Normal", "ProviderReady"), ("Warning", "ClientCertNotRequired")]
    assert events[1].note == "ClientCertEnforced: something terminates TLS"
    # A problem on the first look is news.
    terminated = cp("Active", ready("True", "PeeringReady"),
                    {"type": "ServerCertOurs", "status": "False", "reason": "ForeignCert", "message": "foreign"})
    assert reasons(ev.clusterpeer_events(cp("Active", ready("True", "PeeringReady")), terminated, now=NOW)) == [
        ("Warning", "ForeignCert")]


def test_effective_capabilities_and_paired_projects():
    old = cp("Active", ready("True", "PeeringReady"), effectiveCapabilities=[], pairedProjectsCount=0)
    new = cp("Active", ready("True", "PeeringReady"), effectiveCapabilities=["mirror"], pairedProjectsCount=1)
    events = ev.clusterpeer_events(old, new, now=NOW)
    assert reasons(events) == [("Normal", "EffectiveCapabilities"), ("Normal", "Paired")]
    assert "mirror (before: none)" in events[0].note and "paired projects: 1 (before: 0)" in events[1].note


def test_certificate_renewals_are_seen_in_the_secret_not_guessed_after_a_restart():
    ca = pki.create_ca("t", now=NOW)
    req = pki.make_key_and_csr("u")
    first = pki.issue_client_cert(ca, req.cert_pem, "u", now=NOW)
    events, seen = ev.certificate_events({}, PeerCredentials(client_cert=first))
    assert events == [] and set(seen) == {"client.crt"}  # nothing seen before: not a renewal
    assert ev.certificate_events(seen, PeerCredentials(client_cert=first))[0] == []
    second = pki.issue_client_cert(ca, req.cert_pem, "u", now=NOW + timedelta(hours=13))
    events, seen = ev.certificate_events(seen, PeerCredentials(client_cert=second, issued=first))
    assert reasons(events) == [("Normal", "CertificateRenewed")]
    assert "our client certificate toward the peer was renewed" in events[0].note
    assert "2026-12-03T01:00:00Z" in events[0].note  # issued 13 h later, valid 24 h
    events, _ = ev.certificate_events(seen, PeerCredentials(client_cert=second, issued=second + first))
    assert [e.note.split(" was")[0] for e in events] == ["the client certificate this cluster issued to the peer"]


def test_server_certificates_issued_and_renewed():
    ca = pki.create_ca("t", now=NOW)
    cert = pki.issue_entrance_cert(ca, "%s.x.lab", now=NOW).cert_pem
    assert ev.server_certificate_event("entrance", "missing", cert).reason == "CertificateIssued"
    renewed = ev.server_certificate_event("entrance", ev.DUE, cert)
    assert renewed.reason == "CertificateRenewed" and "2026-12-02T00:00:00Z" in renewed.note


def test_capability_verdicts():
    accepted = {"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": ""}]}
    refused = {"conditions": [{"type": "Accepted", "status": "False", "reason": "Wildcard", "message": "rule 1"}]}
    assert reasons(ev.capability_events(None, accepted)) == [("Normal", "Accepted")]
    assert reasons(ev.capability_events(accepted, refused)) == [("Warning", "Wildcard")]
    assert ev.capability_events(refused, refused) == []


def test_project_peers_paired_unreachable_and_back():
    paired = {"state": "Paired", "reason": "Paired", "message": "paired with project shop"}
    gone = {"state": "PeerUnreachable", "reason": "PeerUnreachable", "message": "did not answer"}
    assert reasons(ev.projectpeer_events(None, paired)) == [("Normal", "Paired")]
    assert reasons(ev.projectpeer_events(paired, gone)) == [("Warning", "PeerUnreachable")]
    [back] = ev.projectpeer_events(gone, paired)
    assert back.note == "paired with project shop again, after PeerUnreachable"
    assert ev.projectpeer_events(paired, paired) == []


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59, "59s"), (60, "1m"), (90, "1m30s"), (3600, "1h"),
                                               (3725, "1h2m"), (86400, "1d"), (3 * 86400 + 7300, "3d2h")])
def test_durations(seconds, text):
    assert ev.duration(seconds) == text


def test_a_removed_copy_of_the_connection_string_names_the_annotation_and_what_to_use():
    spec = ev.connection_string_copy_removed(["kubectl.kubernetes.io/last-applied-configuration"])
    assert (spec.type, spec.reason) == ("Warning", "ConnectionStringCopyRemoved")
    assert "kubectl.kubernetes.io/last-applied-configuration" in spec.note
    assert "d8 k create -f" in spec.note and "d8 k apply --server-side -f" in spec.note
    assert "d8peer" not in spec.note
