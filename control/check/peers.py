"""The verdicts of `peering check` on one peering (pure): its phase and Ready reason, the age of its last sync,
what the peer's entrance answers now (an offer pull made by the check, `probes.peer_offer`) and whether the status
is older than that, the certificates it holds and has issued, TokenExchangeReady, the effective capabilities and
the paired projects.
"""

from __future__ import annotations

from contract import reasons
from contract.peer_secret import CLIENT_CERT, ISSUED_CERT, PeerCredentials
from control import pki
from control.check import fixes
from control.check.cluster import FORBIDDEN, MISSING, Facts, Read
from control.check.judge import ago, certificate_text
from control.check.report import Line, fail, ok, warn
from control.rules import conditions as cond
from control.rules import renewal
from control.rules.events import PROGRESS, duration
from control.rules.invite import parse_time


def _ready(cp: dict) -> dict:
    return cond.get_condition((cp.get("status") or {}).get("conditions"), cond.READY) or {}


def established(cp: dict) -> bool:
    status = cp.get("status") or {}
    return status.get("phase") == cond.ACTIVE and isinstance(status.get("peer"), dict)


def state_line(f: Facts, cp: dict) -> Line:
    name = cp["metadata"]["name"]
    status = cp.get("status") or {}
    phase, ready = status.get("phase") or "Pending", _ready(cp)
    reason, message = ready.get("reason") or "NoStatus", ready.get("message") or "the module has not written a status"
    peer = status.get("peer") if isinstance(status.get("peer"), dict) else {}
    who = f" with cluster {peer.get('clusterUUID')} (named {peer.get('alias')} there)" if peer.get("clusterUUID") else ""
    check = f"clusterpeer {name}"
    if phase == cond.ACTIVE and ready.get("status") == "True":
        return ok(check, f"Active, Ready{who}: {message}", peer=name)
    text = f"{phase}, Ready {ready.get('status', 'Unknown')}{who}: {message}"
    if reason in PROGRESS or reason == "NoStatus":
        return warn(check, text, fixes.ready_fix(reason), reason=reason, peer=name)
    return fail(check, text, _fix(reason, message), reason=reason, peer=name)


def _fix(reason: str, message: str) -> str:
    if reason == cond.PEER_REFUSED_CERTIFICATE:
        for said, fix in ((renewal.PEER_HAS_ANOTHER_CA, fixes.PEER_HAS_ANOTHER_CA),
                          (renewal.PEER_CHECKS_DATES, fixes.PEER_CHECKS_DATES)):
            if message.startswith(said):
                return fix
    return fixes.ready_fix(reason)


def sync_line(f: Facts, cp: dict) -> Line:
    name = cp["metadata"]["name"]
    peer = (cp.get("status") or {}).get("peer") or {}
    last = parse_time(peer.get("lastSyncTime"))
    ready = _ready(cp)
    if ready.get("reason") in cond.SYNC_REASONS:
        since = parse_time(ready.get("lastTransitionTime"))
        lasting = f"for {duration((f.now - since).total_seconds())}" if since is not None else "lately"
        return fail("sync", f"the pulls of the peer's offer have failed {lasting} ({ready.get('reason')}); the last "
                            f"offer, recorded {ago(f.now, last)}, stays in force",
                    _fix(ready.get("reason", ""), ready.get("message", "")), reason=ready.get("reason", ""), peer=name)
    return ok("sync", f"the last pull worked; the peer's offer last changed {ago(f.now, last)} (a pull every "
                      f"{duration(f.sync_interval())}; an unchanged offer is not written again)", peer=name)


def _status_of(f: Facts, cp: dict) -> str:
    """What the ClusterPeer's status says of the peer, for a line that finds the status older than a probe."""
    ready = _ready(cp)
    last = parse_time(((cp.get("status") or {}).get("peer") or {}).get("lastSyncTime"))
    return (f"Ready {ready.get('status', 'Unknown')} {ready.get('reason', '')}".rstrip()
            + f", the last offer recorded {ago(f.now, last)}")


def peer_entrance_line(f: Facts, cp: dict, secret: Read, answer) -> Line:
    """The peer's entrance now: `answer` is the check's own offer pull (a peerclient Answer; None when it could not
    be made); the line says when the ClusterPeer's status, written by the module's last pull, is older than it."""
    name = cp["metadata"]["name"]
    check = "peer entrance"
    if secret.state == FORBIDDEN:
        return warn(check, f"the peer's entrance cannot be probed: the Secret {f.namespace}/peer-{name} with this "
                           "cluster's client certificate cannot be read with this role; the status above is the "
                           "module's last pull", "run the check as an administrator who may read Secrets in "
                           "d8-peering to probe the peer now", reason="Forbidden", peer=name)
    values = PeerCredentials.from_secret(secret.obj if secret.ok else None)
    entrance = values.peer_entrance or "the peer's entrance"
    if answer is None:
        return warn(check, f"{entrance} was not probed: the peering's Secret holds no credentials to pull with",
                    "see the certificates line", reason="NoCredentials", peer=name)
    ready = _ready(cp)
    says_fine = ready.get("status") == "True"
    if answer.ok:
        if ready.get("reason") in (cond.PEER_UNREACHABLE, cond.PEER_REFUSED_CERTIFICATE):
            return warn(check, f"{entrance} answered an offer pull just now, but the status says "
                               f"{_status_of(f, cp)}: the status is older than this probe",
                        f"nothing: the module's next pull (every {duration(f.sync_interval())}) clears it",
                        reason="StatusBehind", peer=name)
        return ok(check, f"{entrance} answered an offer pull over mTLS just now (HTTP {answer.status})", peer=name)
    behind = f"; the status ({_status_of(f, cp)}) is older than this probe" if says_fine else ""
    if answer.refused_certificate:
        return fail(check, f"{entrance} refused this cluster's client certificate just now: {answer.body}{behind}",
                    _fix(cond.PEER_REFUSED_CERTIFICATE, ""), reason=cond.PEER_REFUSED_CERTIFICATE, peer=name)
    if answer.status is None:
        return fail(check, f"{entrance} does not answer from here: {answer.body}{behind}",
                    _fix(cond.PEER_UNREACHABLE, ""), reason=cond.PEER_UNREACHABLE, peer=name)
    reason = answer.body.get("reason") if isinstance(answer.body, dict) else ""
    return fail(check, f"{entrance} answered the offer pull HTTP {answer.status}"
                + (f" ({reason})" if reason else "") + behind,
                _fix(cond.PEER_UNREACHABLE, ""), reason=cond.PEER_UNREACHABLE, peer=name)


def certificates_line(f: Facts, cp: dict, secret: Read) -> Line:
    name = cp["metadata"]["name"]
    if secret.state == FORBIDDEN:
        return warn("certificates", f"the Secret {f.namespace}/peer-{name} with this peering's certificates cannot be "
                                    "read with this role", "run the check as an administrator who may read Secrets "
                                    "in d8-peering to see their expiry; the alert D8PeeringCertificateExpiresSoon "
                                    "watches them meanwhile", reason="Forbidden", peer=name)
    if secret.state == MISSING:
        return fail("certificates", f"the peering is established but its Secret {f.namespace}/peer-{name} is gone",
                    fixes.ready_fix(cond.CREDENTIALS_FROM_OTHER_CA), reason="CredentialsMissing", peer=name)
    if not secret.ok:
        return warn("certificates", f"the Secret could not be read: {secret.detail}", "run the check again",
                    reason="ReadFailed", peer=name)
    values = PeerCredentials.from_secret(secret.obj)
    parts, states = [], []
    for key, pem, whose in ((CLIENT_CERT, values.client_cert, "ours toward the peer"),
                            (ISSUED_CERT, values.issued, "the one issued to the peer")):
        if not pem:
            continue
        try:
            state, text = certificate_text(pem, f.now)
        except pki.PKIError:
            state, text = "expired", "unreadable"
        parts.append(f"{whose} {text}")
        states.append((state, key))
    message = "; ".join(parts) or "no certificate yet"
    ready = _ready(cp)
    if ("expired", CLIENT_CERT) in states:
        if ready.get("reason") == cond.PEER_UNREACHABLE:
            # The outage outlasted it: renewed over the peering once the peer answers again (rules/renewal.py).
            return warn("certificates", message, fixes.EXPIRED_WHILE_AWAY, reason=reasons.CERTIFICATE_EXPIRED,
                        peer=name)
        return fail("certificates", message, _fix(ready.get("reason", ""), ready.get("message", "")),
                    reason=reasons.CERTIFICATE_EXPIRED, peer=name)
    if ("expired", ISSUED_CERT) in states:
        return warn("certificates", message, "the other cluster has not renewed the certificate this cluster issued "
                                             "to it: it is renewed once that cluster's module reaches this one "
                                             "again; if that cluster is up, run `d8 k peering check` there",
                    reason=reasons.CERTIFICATE_EXPIRED, peer=name)
    if any(state == "overdue" for state, _ in states):
        return warn("certificates", message, "a renewal keeps failing: see the sync line; renewals go over the "
                                             "peering and need the peer reachable", reason="RenewalOverdue", peer=name)
    return ok("certificates", message, peer=name)


def token_exchange_line(f: Facts, cp: dict) -> Line:
    name = cp["metadata"]["name"]
    c = cond.get_condition((cp.get("status") or {}).get("conditions"), cond.TOKEN_EXCHANGE_READY)
    if c is None:
        return warn("token exchange", "TokenExchangeReady is not set yet", "wait for the module's next pass",
                    reason="NoCondition", peer=name)
    reason, message = c.get("reason", ""), c.get("message", "")
    if c.get("status") == "True":
        if "failed" in message:
            return warn("token exchange", f"{reason}: {message}", "see the dex and dex client lines; "
                        "docs/user-authn-contract.md lists each of Dex's answers", reason=reason, peer=name)
        return ok("token exchange", f"{reason}: {message}", peer=name)
    line = warn if reason in PROGRESS else fail
    return line("token exchange", message, fixes.token_exchange_fix(reason), reason=reason, peer=name)


def capabilities_line(f: Facts, cp: dict) -> Line:
    name = cp["metadata"]["name"]
    spec, status = cp.get("spec") or {}, cp.get("status") or {}
    opened = sorted({c for c in spec.get("capabilities") or [] if isinstance(c, str)})
    effective = [c for c in status.get("effectiveCapabilities") or [] if isinstance(c, str)]
    if not opened:
        return ok("capabilities", "none opened in spec.capabilities", peer=name)
    local = {c["metadata"]["name"]: c for c in f.capabilities.items}
    offered = (status.get("peer") or {}).get("capabilities")
    theirs = {c.get("name"): c for c in offered or [] if isinstance(c, dict)}
    why = {}
    for cap in opened:
        if cap in effective:
            continue
        mine = local.get(cap)
        accepted = cond.get_condition(((mine or {}).get("status") or {}).get("conditions"), cond.ACCEPTED) or {}
        if mine is None and f.capabilities.ok:
            why[cap] = "no PeeringCapability of this name here"
        elif mine is not None and accepted.get("status") != "True":
            why[cap] = f"not Accepted here ({accepted.get('reason', 'not validated yet')})"
        elif offered is None:
            why[cap] = "the peer's offer has not arrived"
        elif cap not in theirs:
            why[cap] = "the peer has not opened it"
        elif mine is not None and str(theirs[cap].get("version")) != str((mine.get("spec") or {}).get("version")):
            why[cap] = (f"versions differ: {(mine.get('spec') or {}).get('version')} here, "
                        f"{theirs[cap].get('version')} at the peer")
        else:
            why[cap] = "not effective"
    text = f"effective: {', '.join(effective) or 'none'}"
    if not why:
        return ok("capabilities", text, peer=name)
    return warn("capabilities", text + "; not effective: " + "; ".join(f"{c} ({w})" for c, w in sorted(why.items())),
                "a capability works once it is opened in spec.capabilities on both clusters, Accepted on both, of "
                "the same version", reason="NotEffective", peer=name)


def projects_line(f: Facts, cp: dict) -> Line:
    name = cp["metadata"]["name"]
    if not f.projectpeers.ok:
        return warn("projects", f"ProjectPeers cannot be read: {f.projectpeers.detail or f.projectpeers.state}",
                    "run the check with a role that reads projectpeers", reason="ReadFailed", peer=name)
    pairs = sorted((p for p in f.projectpeers.items if p["metadata"]["name"] == name),
                   key=lambda p: p["metadata"].get("namespace", ""))
    if not pairs:
        count = (cp.get("status") or {}).get("pairedProjectsCount") or 0
        return ok("projects", f"no paired project (pairedProjectsCount {count}): same-named projects of both "
                              "clusters pair by themselves", peer=name)
    down = [p for p in pairs if (p.get("status") or {}).get("state") != "Paired"]
    listed = ", ".join(p["metadata"]["namespace"] for p in pairs)
    if down:
        first = down[0].get("status") or {}
        return fail("projects", f"{len(pairs) - len(down)} of {len(pairs)} paired ({listed}); "
                                f"{down[0]['metadata']['namespace']}: {first.get('state')} {first.get('message', '')}",
                    _fix(first.get("reason") or "PeerUnreachable", first.get("message", "")),
                    reason=first.get("reason", ""),
                    peer=name)
    return ok("projects", f"{len(pairs)} paired: {listed}", peer=name)


def peer_lines(f: Facts, cp: dict, answer=None) -> list[Line]:
    """One peering's lines; `answer` is the check's offer pull from the peer (None: not made)."""
    name = cp["metadata"]["name"]
    out = [state_line(f, cp)]
    if established(cp):
        secret = f.peer_secrets.get(name, Read(MISSING))
        out += [sync_line(f, cp), peer_entrance_line(f, cp, secret, answer), certificates_line(f, cp, secret),
                token_exchange_line(f, cp), capabilities_line(f, cp), projects_line(f, cp)]
    return out
