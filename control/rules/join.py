"""The messages of the join handshake and of the peer protocol, as plain dicts, with their checks.

B (the joiner) sends `join_request` to `POST /v1/join` of A; A checks it with `parse_join_request`, decides with
`invite.redeem`, and answers `join_answer`; B checks the answer with `check_join_answer` (the CA pin above all)
before it trusts anything in it. Then B delivers the certificate for A's key with `POST /peering/v1/credentials`
over mTLS. docs/protocol.md describes the same messages for people.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from contract import reasons
from contract.errors import InputError
from contract.peer_secret import PeerCredentials
from control import peertrust, pki
from control.connstring import Invitation
from control.rules.offer import validate_offer

MAX_ALIAS = 253
MAX_PEM = 16 * 1024

#: HTTP status for each refusal of /v1/join; 4xx answers count towards the endpoint's rate limit.
JOIN_REFUSAL_CODES = reasons.JOIN_CODES
#: Reasons a joiner shows as they are when the inviter answers with them.
KNOWN_JOIN_REASONS = frozenset(JOIN_REFUSAL_CODES) | {reasons.TOO_MANY_ATTEMPTS}
JOIN_ENDPOINT_UNREACHABLE = "JoinEndpointUnreachable"
JOIN_REFUSED = "JoinRefused"
PIN_MISMATCH = "PinMismatch"
INVALID_ANSWER = "InvalidAnswer"


class JoinError(InputError):
    """A join message that cannot be used; `reason` is machine-readable, the message never carries the token."""

    codes = JOIN_REFUSAL_CODES


# --- who the other side says it is, and where it says it is --------------------------------------------------------

#: RFC 4122 text form, the same pattern as the CRD's expectedClusterUUID.
UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_LABEL_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?$")
MAX_HOST = 253


def uuid_problem(value: str, what: str) -> str | None:
    """Why `value` is not a cluster UUID in RFC 4122 text form (`what` names the field), or None."""
    if UUID_RE.match(value):
        return None
    return (f"{what} {value[:40]!r} is not a cluster UUID (RFC 4122 text form, 8-4-4-4-12 hexadecimal digits as in "
            "ConfigMap kube-system/d8-cluster-uuid); the other side is not a peering module of a Deckhouse cluster")


def host_problem(value: str, what: str) -> str | None:
    """Why `value` is not a host name or IP address with an optional port, or None.

    A path, a query, userinfo, a scheme or whitespace is refused: the control loop sends the peering protocol to
    `https://<value>` and nothing of the value may change what that URL names (docs/design-changes.md, SSRF)."""
    bad = (f"{what} {value[:80]!r} is not a host name or IP address with an optional port (such as "
           "peering-gateway.example.com or peering-gateway.example.com:8443)")
    if not value or any(c.isspace() for c in value) or any(c in value for c in "/?#@\\%"):
        return bad + ": it may not carry a scheme, path, query, userinfo or whitespace"
    host, port = value, None
    if value.startswith("["):
        end = value.find("]")
        host, rest = value[1:end], value[end + 1:]
        if end < 0 or (rest and not rest.startswith(":")):
            return bad
        port = rest[1:] if rest else None
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return bad + ": the address in brackets is not an IPv6 address"
    else:
        if value.count(":") > 1:
            return bad + ": write an IPv6 address in brackets, [2001:db8::1]:443"
        if ":" in value:
            host, port = value.split(":")
        if len(host) > MAX_HOST:
            return bad + f": the host is longer than {MAX_HOST} characters"
        labels = host.removesuffix(".").split(".")
        if not all(_LABEL_RE.match(label) for label in labels):
            return bad + ": each label of a host name is 1 to 63 letters, digits and inner hyphens"
        if labels[-1].isdigit():
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                return bad + ": it is neither a host name (whose last label is not all digits) nor an IPv4 address"
    if port is not None and not (port.isdigit() and port.isascii() and 0 < int(port) < 65536 and port[0] != "0"):
        return bad + ": the port is not a number from 1 to 65535"
    return None


def uuids_in_use(peers: Iterable[tuple[str, dict, PeerCredentials]], *, exclude: str) -> dict[str, str]:
    """The cluster UUIDs the live ClusterPeers of this cluster other than `exclude` stand for, lower-cased, each
    with the name of its ClusterPeer: from `(name, clusterpeer, values of its peer Secret)`.

    A ClusterPeer holds a UUID from the moment it redeemed or was redeemed (status.invite.redeemer, the peer
    Secret's peer-uuid) until it is deleted (a deletionTimestamp frees it)."""
    out: dict[str, str] = {}
    for name, cp, values in peers:
        if name == exclude or ((cp or {}).get("metadata") or {}).get("deletionTimestamp"):
            continue
        status = (cp or {}).get("status") or {}
        found = (((status.get("peer") or {}).get("clusterUUID")),
                 ((status.get("invite") or {}).get("redeemer") or {}).get("clusterUUID"),
                 values.peer_uuid)
        for uuid in found:
            if isinstance(uuid, str) and uuid:
                out.setdefault(uuid.lower(), name)
    return out


def claimed_uuid_problem(claimed: str, *, own_uuid: str, in_use: dict[str, str], side: str) -> str | None:
    """Why the other side may not claim `claimed` (the message of ClusterUUIDInUse), or None.

    `side` names who claims it ("the joining cluster", "the inviting cluster"). The claim is still only shown:
    the peer's identity here is our ClusterPeer's uid (contract.names.peering_identity)."""
    key = claimed.lower()
    if own_uuid and key == own_uuid.lower():
        return (f"{side} claims cluster UUID {claimed}, which is this cluster's own; a cluster cannot peer with "
                "itself, and a copied UUID is refused: check that the connection string went to the right cluster")
    if key in in_use:
        return (f"{side} claims cluster UUID {claimed}, which the live ClusterPeer {in_use[key]} of this cluster "
                "already stands for; two peerings never share a cluster UUID. If that cluster is joining again, "
                f"delete ClusterPeer {in_use[key]} there first and then the joining ClusterPeer, and join anew; "
                "otherwise the claim is false: do not trust the string's holder")
    return None


def join_request(
    inv: Invitation, *, cluster_uuid: str, alias: str, entrance: str, ca_pem: str, csr_pem: str, offer: dict
) -> dict:
    """The body of `POST /v1/join`. Build it only after `connstring.decode` passed (expiry, expected UUID)."""
    return {
        "token": inv.token,
        "clusterUUID": cluster_uuid,
        "alias": alias,
        "entrance": entrance,
        "caBundle": ca_pem,
        "csr": csr_pem,
        "offer": offer,
    }


@dataclass(frozen=True)
class JoinRequest:
    token: str = field(repr=False)
    cluster_uuid: str
    alias: str
    entrance: str
    ca_pem: str
    csr_pem: str
    offer: dict
    #: SHA-256 of the CSR's public key: recognises a repeated join by the same cluster with the same key.
    key_fingerprint: str


def _str(body: dict, key: str, limit: int) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value or len(value) > limit:
        raise JoinError(reasons.MALFORMED, f"the join request has no valid {key} (a non-empty string of at most {limit})")
    return value


def parse_join_request(body, *, now: datetime) -> JoinRequest:
    """Check the shape of a join request; token checks are `invite.redeem`'s, after this. The joiner's CA bundle
    must be exactly its one peering CA (`peertrust.peer_ca`), and only that certificate is kept."""
    if not isinstance(body, dict):
        raise JoinError(reasons.MALFORMED, "the join request is not a JSON object")
    token = _str(body, "token", 300)
    uuid = _str(body, "clusterUUID", 36)
    alias = _str(body, "alias", MAX_ALIAS)
    entrance = _str(body, "entrance", 260)
    for problem in (uuid_problem(uuid, "clusterUUID"), host_problem(entrance, "entrance")):
        if problem is not None:
            raise JoinError(reasons.MALFORMED, f"the join request's {problem}")
    ca_pem = _str(body, "caBundle", MAX_PEM)
    csr_pem = _str(body, "csr", MAX_PEM)
    try:
        ca_pem = peertrust.peer_ca(ca_pem, now=now)
        pki.load_csr(csr_pem)
        key_fp = pki.public_key_fingerprint(csr_pem)
    except pki.PKIError as exc:
        raise JoinError(exc.reason if exc.reason in JOIN_REFUSAL_CODES else reasons.MALFORMED, exc.message) from None
    offer = body.get("offer")
    check = validate_offer(offer)
    if not check.ok:
        raise JoinError(check.reason, check.message)
    return JoinRequest(token, uuid, alias, entrance, ca_pem, csr_pem, offer, key_fp)


def join_answer(
    *, cluster_uuid: str, alias: str, entrance: str, ca_pem: str, certificate_pem: str, csr_pem: str, offer: dict
) -> dict:
    """A's answer: who A is, B's client certificate, a CSR for A's client key, and A's offer."""
    return {
        "clusterUUID": cluster_uuid,
        "alias": alias,
        "entrance": entrance,
        "caBundle": ca_pem,
        "certificate": certificate_pem,
        "csr": csr_pem,
        "offer": offer,
    }


@dataclass(frozen=True)
class JoinAnswer:
    cluster_uuid: str
    alias: str
    entrance: str
    ca_pem: str
    certificate_pem: str
    csr_pem: str
    offer: dict


def check_join_answer(body, inv: Invitation, *, own_uuid: str, own_key_fingerprint: str,
                      now: datetime) -> JoinAnswer:
    """Trust the answer only if its CA bundle is exactly the one CA the connection string pins (self-signed, a CA,
    valid at `now`: `peertrust.pinned_ca`), and the certificate is the one that CA issued for our key and our UUID,
    by X.509 path validation. PinMismatch means the endpoint is not the cluster that invited. The answer keeps
    only that CA certificate and that client certificate: nothing else of the bundle is ever trusted."""
    if not isinstance(body, dict):
        raise JoinError(INVALID_ANSWER, "the join answer is not a JSON object; the join endpoint is not a peering module")
    try:
        fields = {k: _str(body, k, MAX_PEM if k in ("caBundle", "certificate", "csr") else 260) for k in (
            "clusterUUID", "entrance", "caBundle", "certificate", "csr")}
        alias = _str(body, "alias", MAX_ALIAS)
    except JoinError as exc:
        raise JoinError(INVALID_ANSWER, exc.message.replace("join request", "join answer")) from None
    try:
        ca_pem = peertrust.pinned_ca(fields["caBundle"], inv.ca_pin, now=now)
    except pki.PKIError as exc:
        raise JoinError(
            PIN_MISMATCH,
            f"the CA in the join answer is not the one the connection string pins ({exc.message}): the endpoint is "
            "not the cluster that issued it, or the string was altered; get a new connection string over a secure "
            "channel",
        ) from None
    if fields["clusterUUID"] != inv.cluster_uuid:
        raise JoinError(
            INVALID_ANSWER,
            f"the join answer comes from cluster {fields['clusterUUID']}, the connection string names "
            f"{inv.cluster_uuid}; get a new connection string",
        )
    entrance = host_problem(fields["entrance"], "entrance")
    if entrance is not None:
        raise JoinError(INVALID_ANSWER, f"the join answer's {entrance}")
    try:
        pki.load_csr(fields["csr"])
    except pki.PKIError as exc:
        raise JoinError(INVALID_ANSWER, f"the join answer carries an unusable CSR: {exc.message}") from None
    try:
        cert = _our_certificate(fields["certificate"], ca_pem, own_key_fingerprint, own_uuid, now)
    except JoinError as exc:
        raise JoinError(INVALID_ANSWER, f"the client certificate in the join answer {exc.message}") from None
    check = validate_offer(body.get("offer"))
    if not check.ok:
        raise JoinError(check.reason, check.message)
    return JoinAnswer(fields["clusterUUID"], alias, fields["entrance"], ca_pem, cert, fields["csr"], body["offer"])


def _our_certificate(cert_pem: str, ca_pem: str, own_key_fingerprint: str, own_uuid: str, now: datetime) -> str:
    """The one certificate of `cert_pem`, checked to chain to the peer's one CA (`peertrust.verify_client_cert`: X.509
    path validation at `now`) and to be for our key and our UUID; JoinError whose message completes "the
    certificate ...". `ca_pem` that is not exactly one peering CA (a Secret written before the bundle was checked)
    is refused too."""
    try:
        peertrust.peer_ca(ca_pem, now=now)
        cert = peertrust.verify_client_cert(cert_pem, ca_pem, now=now)
        ours = pki.public_key_fingerprint(cert) == own_key_fingerprint and pki.common_name(cert) == own_uuid[:64]
    except pki.PKIError as exc:
        raise JoinError(reasons.MALFORMED, f"was not issued by the peer's CA: {exc.message}") from None
    if not ours:
        raise JoinError(reasons.MALFORMED, "was issued by the peer's CA for another key or cluster UUID than this "
                                           "cluster's")
    return cert


def join_failure(status_code: int | None, body) -> tuple[str, str]:
    """(reason, message) for the joiner's Ready condition from a failed `POST /v1/join`.

    status_code None means no HTTP answer (DNS, TCP or TLS failure): JoinEndpointUnreachable, retried.
    A Kubernetes Status body with a known reason is shown as it is; anything else is JoinRefused.
    """
    if status_code is None:
        detail = body if isinstance(body, str) else ""
        return (
            JOIN_ENDPOINT_UNREACHABLE,
            "the join endpoint of the inviting cluster did not answer"
            + (f" ({detail})" if detail else "")
            + "; check that peering.<domain> of that cluster is reachable from here. Retrying",
        )
    reason = body.get("reason") if isinstance(body, dict) else None
    message = body.get("message") if isinstance(body, dict) else None
    if reason in KNOWN_JOIN_REASONS and isinstance(message, str):
        return reason, message[:1024]
    return (
        JOIN_REFUSED,
        f"the join endpoint answered HTTP {status_code} without a known reason; check that the join URL points to "
        "the peering module of the inviting cluster. Retrying",
    )


# --- the peer protocol over mTLS (/peering/v1/*) -----------------------------------------------------------------


def offer_message(alias: str, offer: dict) -> dict:
    """Body of `GET /peering/v1/offer`: the answering side's offer and its name for the peering."""
    return {"alias": alias, "offer": offer}


def parse_offer_message(body) -> tuple[str, dict]:
    """(alias, offer) of a fetched offer message; the offer is checked by validate_offer separately."""
    if not isinstance(body, dict) or not isinstance(body.get("offer"), dict):
        raise JoinError(reasons.OFFER_INVALID, "the peer's offer message has no offer object")
    alias = body.get("alias")
    if not isinstance(alias, str) or len(alias) > MAX_ALIAS:
        raise JoinError(reasons.OFFER_INVALID, "the peer's offer message has no valid alias")
    return alias, body["offer"]


def credentials_message(certificate_pem: str) -> dict:
    """Body of `POST /peering/v1/credentials`: the certificate the joiner's CA issued to the inviter's key."""
    return {"certificate": certificate_pem}


def check_credentials(body, *, own_key_fingerprint: str, own_uuid: str, peer_ca_pem: str, now: datetime,
                      expired_ok: bool = False) -> str:
    """The delivered (or renewed) client certificate, checked to be the peer's one CA's certificate for our key
    and UUID, valid at `now`; only that one certificate is returned to be stored. With `expired_ok` (a delivery: a
    joiner delivers again after its restart, and the certificate may have expired while the peers were apart) one
    that expired before `now` is checked as of its issue instead: it still admits its own renewal (§3.1 of
    docs/protocol.md), which the holder asks for at once."""
    cert = body.get("certificate") if isinstance(body, dict) else None
    if not isinstance(cert, str) or len(cert) > MAX_PEM:
        raise JoinError(reasons.MALFORMED, "the credentials message has no certificate")
    at = now
    if expired_ok:
        try:
            if pki.not_after(cert) < now:
                at = pki.issued_at(cert)
        except pki.PKIError:
            pass  # refused below, with what is wrong
    try:
        return _our_certificate(cert, peer_ca_pem, own_key_fingerprint, own_uuid, at)
    except JoinError as exc:
        raise JoinError(reasons.MALFORMED, f"the delivered certificate {exc.message}") from None


def certificate_request(csr_pem: str) -> dict:
    """Body of `POST /peering/v1/certificate` (renewal): a CSR for the same client key."""
    return {"csr": csr_pem}


def parse_certificate_request(body) -> str:
    """The CSR of a renewal request, checked (P-256, valid signature)."""
    csr = body.get("csr") if isinstance(body, dict) else None
    if not isinstance(csr, str) or len(csr) > MAX_PEM:
        raise JoinError(reasons.MALFORMED, "the certificate request has no csr")
    try:
        pki.load_csr(csr)
    except pki.PKIError as exc:
        raise JoinError(exc.reason, exc.message) from None
    return csr


def certificate_answer(certificate_pem: str) -> dict:
    return {"certificate": certificate_pem}
