"""Our client certificate toward the peer as the ClusterPeer tells of it (pure): why a call to the peer's entrance
failed, what a refused renewal means and what to do, how a certificate that expired while the peer was away reads
in Ready, and the note of the Event once it is renewed after the outage.

The renewal (`POST /peering/v1/certificate`, docs/protocol.md §3.1) is the one call the peer's entrance answers
for a certificate outside its validity period: its TLS handshake proves possession of the key the peering was
made with, so an outage of any length ends with a renewal, as long as the peer still has the peering.
"""

from __future__ import annotations

from datetime import datetime, timezone

from contract import reasons
from contract.names import peer_secret_name
from control.connstring import format_time
from control.rules import conditions as cond
from control.rules.events import duration
from control.rules.invite import parse_time

REVOKED = ("the peer refused to renew our client certificate: it knows no peering with this certificate any more "
           "(it has probably deleted its ClusterPeer: the peering is revoked). If so, delete this ClusterPeer too; "
           "access stays until then")
PEER_HAS_ANOTHER_CA = ("the peer's entrance does not know the CA of our client certificate: its module was disabled "
                       "and enabled again with a new peering CA (its ClusterPeer shows CredentialsFromOtherCA), so "
                       "this peering cannot resume; delete this ClusterPeer and establish the peering anew on both "
                       "clusters")
PEER_CHECKS_DATES = ("the peer's entrance refused our expired client certificate in the handshake: its module is of "
                     "a version that does not renew an expired certificate; update the module there and the peering "
                     "resumes by itself, or establish it anew on both clusters")
FOREIGN_ENTRANCE = ("the peer's entrance presents a certificate that the CA this peering was made with did not "
                    "issue: if the other cluster's module was disabled and enabled again (its ClusterPeer shows "
                    "CredentialsFromOtherCA there), delete this ClusterPeer and establish the peering anew on both "
                    "clusters; if something in front of that entrance terminates TLS, pass its connections through. "
                    "Retried meanwhile")
EXPIRED_ENTRANCE = ("the peer's entrance presents a certificate outside its validity period: its module renews it "
                    "at its start after an outage longer than that certificate's lifetime, or the clocks differ; "
                    "retried")


def call_failure(status: int | None, body, *, refused_certificate: bool = False, tls_alert: str = "",
                 untrusted_server: str = "") -> tuple[str, str]:
    """(reason, message) of a failed call to the peer's entrance (conditions.sync_failure), with what the TLS layer
    told: who refused whose certificate, and why."""
    reason, message = cond.sync_failure(status, body, refused_certificate=refused_certificate)
    if reason == cond.PEER_REFUSED_CERTIFICATE:
        if tls_alert == "unknown_ca":
            return reason, PEER_HAS_ANOTHER_CA
        if tls_alert == "certificate_expired":
            return reason, PEER_CHECKS_DATES
        return reason, message
    if status is None and untrusted_server == "foreign":
        return cond.PEER_UNREACHABLE, f"{FOREIGN_ENTRANCE} ({body})"
    if status is None and untrusted_server == "expired":
        return cond.PEER_UNREACHABLE, f"{EXPIRED_ENTRANCE} ({body})"
    return reason, message


def renewal_failure(clusterpeer: str, status: int | None, body, **tls: str | bool) -> tuple[str, str]:
    """(reason, message) of a refused or failed renewal: KeyMismatch (our key is not the peering's), the peer no
    longer knowing the peering (revoked), its CA changed, or whatever `call_failure` says (retried)."""
    answer = body if isinstance(body, dict) else {}
    if status == 403 and answer.get("reason") == reasons.KEY_MISMATCH:
        return reasons.KEY_MISMATCH, (
            "the peer refused to renew our client certificate for the key this cluster holds: the key in the Secret "
            f"d8-peering/{peer_secret_name(clusterpeer)} is not the one the peering was made with (the Secret was "
            "replaced, or restored from another copy). Restore the Secret with the key it had, or delete the "
            "ClusterPeer on both clusters and establish the peering anew")
    reason, message = call_failure(status, body, **tls)  # type: ignore[arg-type]
    if reason == cond.PEER_REFUSED_CERTIFICATE and not message:
        return reason, REVOKED
    return reason, message


def expired_meanwhile(message: str, expired_at: str) -> str:
    """Ready's message while the peer is unreachable and our client certificate toward it has expired."""
    return (f"{message.rstrip('.')}. Our client certificate toward the peer expired meanwhile, at {expired_at}: it is "
            "renewed over the peering as soon as the peer answers again (its entrance accepts the expired "
            "certificate for that alone), so the peering resumes by itself; nothing to do")


def last_contact(remembered: float, status: dict, issue_times: list[datetime]) -> tuple[datetime, str] | None:
    """When this cluster last heard from the peer, and what that time is: the last successful sync of this process
    (`remembered`, Unix seconds; 0 after a restart), else the latest of what the API keeps: status.peer.lastSyncTime,
    when Ready last became True, and `issue_times`, when the certificates of either direction were issued (each a
    renewal the peer answered or asked for)."""
    if remembered:
        return datetime.fromtimestamp(remembered, timezone.utc), "the last successful sync"
    ready = cond.get_condition(status.get("conditions"), cond.READY) or {}
    peer = status.get("peer") if isinstance(status.get("peer"), dict) else {}
    seen = [parse_time(peer.get("lastSyncTime")), *issue_times,
            parse_time(ready.get("lastTransitionTime")) if ready.get("status") == "True" else None]
    known = [t for t in seen if t is not None]
    return (max(known), "the last contact this cluster recorded before its own restart") if known else None


def outage_note(contact: tuple[datetime, str] | None, now: datetime, expired_at: datetime,
                valid_until: datetime) -> str:
    """The note of the one Event that tells of a renewal after an outage, with how long the peer was away."""
    if contact is not None:
        since, what = contact
        away = f"the peer was away for {duration((now - since).total_seconds())} (since {format_time(since)}, {what})"
    else:
        away = "the peer was away for longer than that"
    return (f"our client certificate toward the peer was renewed after an outage: it had expired at "
            f"{format_time(expired_at)} while the peer was unreachable, and {away}; the peering resumed by itself, "
            f"the new certificate is valid until {format_time(valid_until)}")
