"""Which Kubernetes Events a change is worth: the transitions an administrator cares about, from the status a pass
found and the status it wrote (pure).

An Event's reason is the reason word of the condition that changed (`PeerUnreachable`, `PeeringReady`,
`Wildcard`, `Paired`, ...), so that `kubectl describe` and `status.conditions` speak the same words; the few
changes that no condition carries have reasons of their own: `CertificateRenewed`, `CertificateIssued`,
`EffectiveCapabilities`.
The note is the condition's message with what the change adds (how long the peer was unreachable, which cluster
joined). Nothing here sees a connection string, a token or a key: the notes are built from conditions, names,
UUIDs and times only. docs/operations.md lists every Event with what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from contract.peer_secret import CLIENT_CERT, ISSUED_CERT, PeerCredentials
from control import pki
from control.connstring import format_time
from control.rules import conditions as cond
from control.rules.invite import parse_time

NORMAL, WARNING = "Normal", "Warning"
CERTIFICATE_RENEWED = "CertificateRenewed"
CERTIFICATE_ISSUED = "CertificateIssued"
#: What `control.bootstrap.plan` says of a server certificate that reached its renewal time.
DUE = "due for renewal"
EFFECTIVE_CAPABILITIES = "EffectiveCapabilities"
PAIRED = "Paired"
PEER_UNREACHABLE = "PeerUnreachable"
CONNECTION_STRING_COPY_REMOVED = "ConnectionStringCopyRemoved"

#: Reasons of a condition that is not True yet but on its way there: an Event of these is Normal.
PROGRESS = frozenset({cond.INVITE_PENDING, cond.INVITE_EXPIRED, cond.JOINING, cond.CREDENTIALS_PENDING,
                      cond.AWAITING_OFFER, cond.PROVIDER_PENDING, cond.PROVIDER_DELETING, cond.AWAITING_ISSUER})
#: Conditions whose first value is worth an Event only when it is a problem (they are set on every ClusterPeer).
QUIET_FIRST = (cond.CLIENT_CERT_ENFORCED, cond.SERVER_CERT_OURS)


@dataclass(frozen=True)
class EventSpec:
    """One Event to record about an object: events.k8s.io/v1 `type`, `reason`, `action` and `note`."""

    type: str
    reason: str
    action: str
    note: str


def event_type(status: str, reason: str) -> str:
    return NORMAL if status == "True" or reason in PROGRESS else WARNING


def duration(seconds: float) -> str:
    """`42s`, `5m10s`, `3h2m`, `3d4h`: how long something lasted, for a note."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s" if s % 60 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60}m" if s % 3600 >= 60 else f"{s // 3600}h"
    return f"{s // 86400}d{(s % 86400) // 3600}h" if s % 86400 >= 3600 else f"{s // 86400}d"


def _action(reason: str) -> str:
    if reason in cond.SYNC_REASONS or reason == cond.PEERING_READY:
        return "Sync"
    if reason in (cond.INVITE_PENDING, cond.INVITE_EXPIRED):
        return "Invite"
    if reason in (cond.JOINING, cond.CREDENTIALS_PENDING) or reason in cond.PERMANENT_JOIN_REASONS:
        return "Join"
    return "Reconcile"


def _cond(status: dict | None, type_: str) -> dict | None:
    return cond.get_condition((status or {}).get("conditions"), type_)


def _since(old: dict | None, now: datetime) -> str:
    start = parse_time((old or {}).get("lastTransitionTime"))
    return f" for {duration((now - start).total_seconds())}" if start is not None else ""


def _ready_event(old: dict, new: dict, now: datetime) -> EventSpec | None:
    before, after = _cond(old, cond.READY), _cond(new, cond.READY)
    if after is None:
        return None
    status, reason, message = after.get("status", ""), after.get("reason", ""), after.get("message", "")
    if before is not None and (before.get("status"), before.get("reason")) == (status, reason):
        return None
    note = message
    peer = new.get("peer") if isinstance(new.get("peer"), dict) else {}
    if old.get("phase") != cond.ACTIVE and new.get("phase") == cond.ACTIVE:
        who = peer.get("clusterUUID") or "the other cluster"
        alias = f" ({peer['alias']})" if peer.get("alias") else ""
        note = f"the peering with cluster {who}{alias} is established: {message}"
        return EventSpec(event_type(status, reason), reason, "Join", note)
    if before is not None and status == "True" and before.get("reason") in cond.SYNC_REASONS:
        note = f"{message} again, after {before.get('reason')}{_since(before, now)}"
    return EventSpec(event_type(status, reason), reason, _action(reason), note)


def _condition_event(old: dict, new: dict, type_: str, action: str) -> EventSpec | None:
    before, after = _cond(old, type_), _cond(new, type_)
    if after is None:
        return None
    status, reason = after.get("status", ""), after.get("reason", "")
    kind = event_type(status, reason)
    if before is None:
        if reason in PROGRESS or (type_ in QUIET_FIRST and kind == NORMAL):
            return None
    elif (before.get("status"), before.get("reason")) == (status, reason):
        return None
    return EventSpec(kind, reason, action, f"{type_}: {after.get('message', '')}")


def _names(value) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def clusterpeer_events(old: dict | None, new: dict, *, now: datetime) -> list[EventSpec]:
    """The Events of a ClusterPeer whose status went from `old` to `new` (both as stored)."""
    old = old or {}
    out: list[EventSpec] = []
    invite, previous = new.get("invite") or {}, old.get("invite") or {}
    issued = bool(invite.get("tokenID")) and invite.get("tokenID") != previous.get("tokenID")
    if issued:
        replaced = " (the previous one expired unused)" if previous.get("tokenID") else ""
        out.append(EventSpec(NORMAL, cond.INVITE_PENDING, "Invite",
                             f"a connection string was issued{replaced}: token ID {invite['tokenID']}, valid until "
                             f"{invite.get('expiresAt', '?')}; pass it to the other cluster's administrator over a "
                             "secure channel"))
    ready = _ready_event(old, new, now)
    if ready is not None and not (issued and ready.reason == cond.INVITE_PENDING):
        out.append(ready)
    for type_, action in ((cond.TOKEN_EXCHANGE_READY, "TokenExchange"), (cond.CLIENT_CERT_ENFORCED, "SelfCheck"),
                          (cond.SERVER_CERT_OURS, "SelfCheck")):
        event = _condition_event(old, new, type_, action)
        if event is not None:
            out.append(event)
    if "effectiveCapabilities" in new or "effectiveCapabilities" in old:
        was, now_names = _names(old.get("effectiveCapabilities")), _names(new.get("effectiveCapabilities"))
        if was != now_names:
            out.append(EventSpec(NORMAL, EFFECTIVE_CAPABILITIES, "Sync",
                                 f"effective capabilities: {', '.join(now_names) or 'none'} (before: "
                                 f"{', '.join(was) or 'none'}); a capability works once both clusters opened it"))
    was_count, count = old.get("pairedProjectsCount"), new.get("pairedProjectsCount")
    if isinstance(count, int) and count != (was_count if isinstance(was_count, int) else 0):
        out.append(EventSpec(NORMAL, PAIRED, "Pair",
                             f"paired projects: {count} (before: {was_count or 0}); "
                             "`d8 k -n <project> get projectpeers` shows each pair"))
    return out


def certificate_events(seen: dict[str, str], values: PeerCredentials, *, outage: str = ""
                       ) -> tuple[list[EventSpec], dict[str, str]]:
    """Renewals of the certificates of one peering, seen in its Secret's values: our client certificate toward
    the peer (`client.crt`) and the one this cluster issued to the peer (the newest of `issued.crt`). `seen` is
    what the previous look found ({} after a restart: nothing is taken for a renewal then); `outage` the note of a
    renewal of our client certificate after it had expired (control/rules/renewal.py), its one Event even right
    after a restart. Returns the Events and what to remember."""
    now_seen: dict[str, str] = {}
    out: list[EventSpec] = []
    for key, text, whose in ((CLIENT_CERT, values.client_cert, "our client certificate toward the peer"),
                             (ISSUED_CERT, values.issued, "the client certificate this cluster issued to the peer")):
        try:
            fp, until = (pki.fingerprint(text), format_time(pki.not_after(text))) if text else ("", "")
        except pki.PKIError:
            fp, until = "", ""
        if fp:
            now_seen[key] = fp
        if fp and key == CLIENT_CERT and outage:
            out.append(EventSpec(NORMAL, CERTIFICATE_RENEWED, "Renew", outage))
        elif fp and seen.get(key) and seen[key] != fp:
            out.append(EventSpec(NORMAL, CERTIFICATE_RENEWED, "Renew",
                                 f"{whose} was renewed; it is valid until {until}"))
    return out, now_seen


def server_certificate_event(name: str, why: str, cert_pem: str) -> EventSpec:
    """The Event of an entrance or egress certificate the control loop issued (`why`: missing, due for renewal,
    issued by another CA...)."""
    try:
        until = format_time(pki.not_after(cert_pem))
    except pki.PKIError:
        until = "?"
    reason = CERTIFICATE_RENEWED if why == DUE else CERTIFICATE_ISSUED
    return EventSpec(NORMAL, reason, "Renew",
                     f"the {name} certificate was issued ({why}); it is valid until {until} and renewed at half "
                     "of its lifetime")


def capability_events(old: dict | None, new: dict) -> list[EventSpec]:
    """Accepted of a PeeringCapability: its first verdict and every change of it."""
    before, after = _cond(old, cond.ACCEPTED), _cond(new, cond.ACCEPTED)
    if after is None or (before is not None and
                         (before.get("status"), before.get("reason")) == (after.get("status"), after.get("reason"))):
        return []
    status, reason = after.get("status", ""), after.get("reason", "")
    note = after.get("message", "")
    if status == "True":
        note = f"{note}; it can be opened in spec.capabilities of a ClusterPeer" if note else (
            "it can be opened in spec.capabilities of a ClusterPeer")
    return [EventSpec(event_type(status, reason), reason, "Validate", note)]


def projectpeer_events(old: dict | None, new: dict) -> list[EventSpec]:
    """The status of a ProjectPeer created (`old` None) or whose state or reason changed."""
    state, reason = new.get("state", ""), new.get("reason") or new.get("state", "")
    if old is not None and old.get("state") == state and old.get("reason") == new.get("reason"):
        return []
    message = new.get("message", "")
    if state == PAIRED:
        if old is not None and old.get("state") == PEER_UNREACHABLE:
            message = f"{message} again, after {old.get('reason') or PEER_UNREACHABLE}"
        return [EventSpec(NORMAL, PAIRED, "Pair", message)]
    return [EventSpec(WARNING, reason or PEER_UNREACHABLE, "Pair", message)]


def connection_string_copy_removed(keys: list[str]) -> EventSpec:
    """The module removed annotations of a ClusterPeer that held its connection string (their keys, never a
    value): what to use instead, and what to do if others may have read it meanwhile."""
    return EventSpec(WARNING, CONNECTION_STRING_COPY_REMOVED, "Sanitize", (
        f"the annotation {', '.join(keys)} held a copy of the connection string, which anyone who may read "
        "ClusterPeers can read; it was removed. Create a Join ClusterPeer with `d8 k create -f` or `d8 k apply "
        "--server-side -f`, which keep no copy. If the string was not used yet and others may have read it, "
        "ask the inviting cluster for a new one"))
