"""Conditions: transition times, TokenExchangeReady from the provider, self-check conditions, Ready and phase."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from control import pki
from control.rules import conditions as c
from control.rules.conditions import Cond, PeeringState, ProviderObservation

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
LATER = NOW + timedelta(minutes=5)


def test_set_condition_keeps_transition_time_unless_status_changes():
    conds = c.set_condition(None, "Ready", Cond("False", "InvitePending", "wait"), generation=1, now=NOW)
    assert conds == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "InvitePending",
            "message": "wait",
            "observedGeneration": 1,
            "lastTransitionTime": "2026-11-30T12:00:00Z",
        }
    ]
    same = c.set_condition(conds, "Ready", Cond("False", "InvitePending", "wait"), generation=1, now=LATER)
    assert same == conds  # nothing to write
    other_reason = c.set_condition(conds, "Ready", Cond("False", "Joining", "x"), generation=2, now=LATER)
    assert other_reason[0]["lastTransitionTime"] == "2026-11-30T12:00:00Z"
    assert other_reason[0]["observedGeneration"] == 2 and other_reason[0]["reason"] == "Joining"
    flipped = c.set_condition(conds, "Ready", Cond("True", "PeeringReady", "ok"), generation=1, now=LATER)
    assert flipped[0]["lastTransitionTime"] == "2026-11-30T12:05:00Z"
    assert conds[0]["status"] == "False"  # the input is not changed


def test_set_condition_keeps_other_types_in_place():
    conds = c.set_condition(None, "A", Cond("True", "a", ""), generation=None, now=NOW)
    conds = c.set_condition(conds, "B", Cond("True", "b", ""), generation=None, now=NOW)
    conds = c.set_condition(conds, "A", Cond("False", "a2", ""), generation=None, now=NOW)
    assert [x["type"] for x in conds] == ["A", "B"] and "observedGeneration" not in conds[0]
    assert c.get_condition(conds, "B")["reason"] == "b" and c.get_condition(conds, "C") is None


def provider(status=None, *, generation=1, deleting=False) -> dict:
    meta = {"name": "peering-cluster-b", "generation": generation}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T11:00:00Z"
    obj = {"metadata": meta}
    if status is not None:
        obj["status"] = status
    return obj


def ready(status, reason, message="m", observed=1):
    return {"observedGeneration": observed, "conditions": [{"type": "Ready", "status": status, "reason": reason, "message": message}]}


@pytest.mark.parametrize(
    ("obs", "status", "reason"),
    [
        (ProviderObservation(obj=provider(ready("True", "ProviderReady"))), "True", "ProviderReady"),
        (ProviderObservation(obj=provider()), "False", "ProviderPending"),
        (ProviderObservation(obj=None), "False", "ProviderPending"),
        (ProviderObservation(obj=provider(ready("True", "ProviderReady", observed=1), generation=2)), "False", "ProviderPending"),
        (ProviderObservation(obj=provider({"conditions": []})), "False", "ProviderPending"),
        (ProviderObservation(obj=provider(ready("True", "x"), deleting=True)), "False", "ProviderDeleting"),
        (ProviderObservation(obj=provider(ready("False", "PrefixConflict", "prefix taken"))), "False", "PrefixConflict"),
        (ProviderObservation(obj=provider(ready("False", "InvalidSpec"))), "False", "InvalidSpec"),
        (ProviderObservation(obj=provider(ready("False", "DiscoveryFailed"))), "False", "DiscoveryFailed"),
        (ProviderObservation(obj=provider(ready("Unknown", "ApplyError"))), "False", "ApplyError"),
        (ProviderObservation(obj=provider(ready("False", "SomethingNew"))), "False", "ProviderNotReady"),
        (ProviderObservation(obj=provider(ready("False", None))), "False", "ProviderNotReady"),
        (ProviderObservation(obj=provider("garbage")), "False", "ProviderNotReady"),
        (ProviderObservation(obj=provider({"conditions": "x"})), "False", "ProviderNotReady"),
        (ProviderObservation(api_error="403 forbidden"), "False", "ProviderRejected"),
        (ProviderObservation(jwks_problem="the JWKS is not JSON"), "False", "ProviderRejected"),
        (ProviderObservation(obj=provider(ready("True", "ProviderReady")), ours=False), "False", "ForeignProvider"),
        (ProviderObservation(issuer_published=False), "False", "AwaitingIssuer"),
        # An API refusal outranks everything: nothing else can be known.
        (ProviderObservation(api_error="403", issuer_published=False, ours=False), "False", "ProviderRejected"),
        # No TokenExchangeProvider API at all (user-authn without the feature).
        (ProviderObservation(api_absent="the API server does not serve tokenexchangeproviders.deckhouse.io"),
         "False", "ProviderRejected"),
        # Ready per user-authn, but the gateway saw Dex fail the last exchange: still ProviderReady, with why.
        (ProviderObservation(obj=provider(ready("True", "ProviderReady")),
                             exchange_failure=("TokenExchangeMisconfigured", "trustedPeers")), "True", "ProviderReady"),
    ],
)
def test_token_exchange_condition(obs, status, reason):
    got = c.token_exchange_condition(obs)
    assert (got.status, got.reason) == (status, reason)
    assert got.message


def test_an_absent_api_and_a_failed_exchange_say_what_is_wrong():
    absent = c.token_exchange_condition(ProviderObservation(api_absent="the API server does not serve "
                                                                       "tokenexchangeproviders.deckhouse.io"))
    assert "tokenexchangeproviders.deckhouse.io" in absent.message and "invites, joins" in absent.message
    failed = c.token_exchange_condition(ProviderObservation(
        obj=provider(ready("True", "ProviderReady")), exchange_failure=("TokenExchangeMisconfigured", "no trust")))
    assert "TokenExchangeMisconfigured" in failed.message and "no trust" in failed.message


def test_a_dex_server_error_names_the_missing_kubernetes_client_first():
    """The gateway's own refusal of Dex's 500 (gateway/exchange.py) is what the condition shows; the condition adds
    that a missing `kubernetes` client (user-authn's publishAPI off) is what that answer means too."""
    from gateway.exchange import dex_refusal

    refusal = dex_refusal(500, {"error": "server_error"}, client_id="dex-client-peering@d8-peering",
                          connector_id="peering-b", audience="kubernetes")
    got = c.token_exchange_condition(ProviderObservation(obj=provider(ready("True", "ProviderReady")),
                                                         exchange_failure=(refusal.reason, refusal.message)))
    assert (got.status, got.reason) == ("True", "ProviderReady")
    assert refusal.message in got.message and "publishAPI is enabled" in got.message
    other = dex_refusal(401, {"error": "invalid_client"}, client_id="dex-client-peering@d8-peering",
                        connector_id="peering-b", audience="kubernetes")
    assert c.exchange_failure_hint(other.reason, other.message) == ""


def test_without_the_project_api_ready_says_projects_cannot_pair_whatever_else_it_says():
    note = "the API server does not serve projects.deckhouse.io"
    works = c.readiness(PeeringState("Join", credentials="complete", has_peer_offer=True, projects_absent=note), NOW)
    assert (works.ready.status, works.ready.reason) == ("True", "PeeringReady")
    assert works.ready.message == f"the peering works; projects cannot pair: {note}"
    rejected = c.readiness(PeeringState("Join", credentials="complete", has_peer_offer=True, projects_absent=note,
                                        token_exchange=Cond("False", "ProviderRejected", "no provider API")), NOW)
    assert rejected.ready.reason == "ProviderRejected" and note in rejected.ready.message
    pending = c.readiness(PeeringState("Join", projects_absent=note), NOW)
    assert note not in pending.ready.message  # only an established peering pairs projects


def test_user_authn_message_is_passed_as_is():
    got = c.token_exchange_condition(ProviderObservation(obj=provider(ready("False", "PrefixConflict", "prefix taken"))))
    assert got.message == "prefix taken"


@pytest.mark.parametrize(
    ("probe", "status", "reason"),
    [
        ("refused", "True", "ClientCertRequired"),
        ("served", "False", "ClientCertNotRequired"),
        ("unreachable", "Unknown", "EntranceUnreachable"),
    ],
)
def test_client_cert_condition(probe, status, reason):
    got = c.client_cert_condition(probe, "connection refused")
    assert (got.status, got.reason) == (status, reason)


CA = pki.create_ca("a", now=NOW)
OTHER = pki.create_ca("lb", now=NOW)
HOST = "peering-gateway.a.lab"


@pytest.mark.parametrize(
    ("cert", "at", "status", "reason"),
    [
        (pki.issue_server_cert(CA, [HOST], now=NOW).cert_pem, NOW, "True", "PeeringRootCert"),
        (pki.issue_server_cert(CA, ["other.a.lab"], now=NOW).cert_pem, NOW, "False", "ForeignCert"),
        (pki.issue_server_cert(OTHER, [HOST], now=NOW).cert_pem, NOW, "False", "ForeignCert"),
        (pki.issue_server_cert(CA, [HOST], now=NOW).cert_pem, NOW + timedelta(days=40), "False", "ForeignCert"),
        ("not a cert", NOW, "False", "ForeignCert"),
        (None, NOW, "Unknown", "EntranceUnreachable"),
    ],
)
def test_server_cert_condition(cert, at, status, reason):
    got = c.server_cert_condition(cert, CA.cert_pem, HOST, at)
    assert (got.status, got.reason) == (status, reason)


def test_expired_own_cert_says_so():
    cert = pki.issue_server_cert(CA, [HOST], now=NOW).cert_pem
    assert "expired" in c.server_cert_condition(cert, CA.cert_pem, HOST, NOW + timedelta(days=40)).message


INVITE = {"tokenHash": "h", "tokenID": "t", "expiresAt": "2026-11-30T13:00:00Z", "used": False}
TE_OK = Cond("True", "ProviderReady", "")


@pytest.mark.parametrize(
    ("state", "phase", "status", "reason"),
    [
        (PeeringState("Invite"), "Pending", "False", "InvitePending"),
        (PeeringState("Invite", invite=INVITE), "Pending", "False", "InvitePending"),
        (PeeringState("Invite", invite={**INVITE, "expiresAt": "2026-11-30T11:00:00Z"}), "Pending", "False", "InviteExpired"),
        (PeeringState("Invite", invite={**INVITE, "used": True}, credentials="partial"), "Pending", "False", "CredentialsPending"),
        (PeeringState("Invite", invite={**INVITE, "used": True}), "Pending", "False", "CredentialsPending"),
        (PeeringState("Invite", spec_error=("InvalidTokenTTL", "bad ttl")), "Error", "False", "InvalidTokenTTL"),
        (PeeringState("Join"), "Pending", "False", "Joining"),
        (PeeringState("Join", spec_error=("Malformed", "x")), "Error", "False", "Malformed"),
        (PeeringState("Join", spec_error=("ClusterNotExpected", "x")), "Error", "False", "ClusterNotExpected"),
        (PeeringState("Join", join_error=("TokenUsed", "x")), "Error", "False", "TokenUsed"),
        (PeeringState("Join", join_error=("TokenInvalid", "x")), "Error", "False", "TokenInvalid"),
        (PeeringState("Join", join_error=("TokenExpired", "x")), "Error", "False", "TokenExpired"),
        (PeeringState("Join", join_error=("PinMismatch", "x")), "Error", "False", "PinMismatch"),
        (PeeringState("Join", join_error=("InvalidAnswer", "x")), "Error", "False", "InvalidAnswer"),
        (PeeringState("Join", join_error=("OfferTooLarge", "x")), "Pending", "False", "OfferTooLarge"),
        (PeeringState("Join", join_error=("TooManyAttempts", "x")), "Pending", "False", "TooManyAttempts"),
        (PeeringState("Join", join_error=("JoinEndpointUnreachable", "x")), "Pending", "False", "JoinEndpointUnreachable"),
        (PeeringState("Join", credentials="partial"), "Pending", "False", "CredentialsPending"),
        (PeeringState("Join", credentials="complete", has_peer_offer=True, token_exchange=TE_OK), "Active", "True", "PeeringReady"),
        (PeeringState("Invite", credentials="complete", has_peer_offer=True), "Active", "True", "PeeringReady"),
        (PeeringState("Join", credentials="complete"), "Active", "False", "AwaitingOffer"),
        (PeeringState("Join", credentials="complete", has_peer_offer=True, sync_error=("PeerUnreachable", "timeout")), "Active", "False", "PeerUnreachable"),
        # A joiner whose certificate for the inviter's key has not arrived there; a failed sync says more.
        (PeeringState("Join", credentials="complete", has_peer_offer=True, credentials_undelivered=True), "Active", "False", "CredentialsPending"),
        (PeeringState("Join", credentials="complete", has_peer_offer=True, credentials_undelivered=True, sync_error=("PeerUnreachable", "x")), "Active", "False", "PeerUnreachable"),
        (PeeringState("Join", credentials="complete", has_peer_offer=True, sync_error=("PeerRefusedCertificate", "")), "Active", "False", "PeerRefusedCertificate"),
        (PeeringState("Join", credentials="complete", has_peer_offer=True, sync_error=("OfferInvalid", "x")), "Active", "False", "OfferInvalid"),
        (PeeringState("Join", credentials="complete", has_peer_offer=True, sync_error=("OfferTooLarge", "x")), "Active", "False", "OfferTooLarge"),
        (PeeringState("Join", credentials="complete", has_peer_offer=True, token_exchange=Cond("False", "ProviderRejected", "m")), "Active", "False", "ProviderRejected"),
        (PeeringState("Join", credentials="complete", has_peer_offer=True, token_exchange=Cond("False", "ForeignProvider", "m")), "Active", "False", "ForeignProvider"),
        # PrefixConflict: the consumers' usernames could be another peering's, so the peering does not work.
        (PeeringState("Join", credentials="complete", has_peer_offer=True, token_exchange=Cond("False", "PrefixConflict", "m")), "Active", "False", "PrefixConflict"),
        # Other TokenExchangeReady reasons do not touch Ready.
        (PeeringState("Join", credentials="complete", has_peer_offer=True, token_exchange=Cond("False", "AwaitingIssuer", "m")), "Active", "True", "PeeringReady"),
        # A re-enabled module with a new CA: Error whatever else holds.
        (PeeringState("Join", credentials="complete", has_peer_offer=True, credentials_from_other_ca=True), "Error", "False", "CredentialsFromOtherCA"),
        # Once established, a later spec problem does not undo the peering.
        (PeeringState("Invite", credentials="complete", has_peer_offer=True, spec_error=("InvalidTokenTTL", "x")), "Active", "True", "PeeringReady"),
    ],
)
def test_readiness(state, phase, status, reason):
    got = c.readiness(state, NOW)
    assert (got.phase, got.ready.status, got.ready.reason) == (phase, status, reason)
    assert got.ready.message


def test_refused_certificate_says_revoked():
    st = PeeringState("Join", credentials="complete", has_peer_offer=True, sync_error=("PeerRefusedCertificate", ""))
    assert "revoked" in c.readiness(st, NOW).ready.message


def test_other_ca_says_to_recreate():
    st = PeeringState("Invite", credentials_from_other_ca=True)
    msg = c.readiness(st, NOW).ready.message
    assert "delete this ClusterPeer" in msg and "both clusters" in msg


def test_every_reason_is_documented():
    """docs/protocol.md lists every reason the rules can choose."""
    from pathlib import Path

    from control.rules import capabilities, join

    doc = Path(__file__).resolve().parents[3].joinpath("docs", "protocol.md").read_text()
    reasons = set(c.PERMANENT_JOIN_REASONS) | set(c.SYNC_REASONS) | set(c.USER_AUTHN_REASONS) | set(join.KNOWN_JOIN_REASONS)
    reasons |= {
        getattr(mod, name)
        for mod in (c, capabilities, join)
        for name in dir(mod)
        if name.isupper() and isinstance(getattr(mod, name), str) and getattr(mod, name)[:1].isupper()
        and " " not in getattr(mod, name) and "." not in getattr(mod, name)
    }
    reasons -= {c.PENDING, c.ACTIVE, c.ERROR, c.READY, c.TOKEN_EXCHANGE_READY, c.CLIENT_CERT_ENFORCED,
                c.SERVER_CERT_OURS}
    missing = sorted(r for r in reasons if f"`{r}`" not in doc)
    assert missing == []
