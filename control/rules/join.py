"""The messages of the join handshake and of the peer protocol, as plain dicts, with their checks.

B (the joiner) sends `join_request` to `POST /v1/join` of A; A checks it with `parse_join_request`, decides with
`invite.redeem`, and answers `join_answer`; B checks the answer with `check_join_answer` (the CA pin above all)
before it trusts anything in it. Then B delivers the certificate for A's key with `POST /peering/v1/credentials`
over mTLS. docs/protocol.md describes the same messages for people.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract import reasons
from contract.errors import InputError
from control import pki
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


def parse_join_request(body) -> JoinRequest:
    """Check the shape of a join request; token checks are `invite.redeem`'s, after this."""
    if not isinstance(body, dict):
        raise JoinError(reasons.MALFORMED, "the join request is not a JSON object")
    token = _str(body, "token", 300)
    uuid = _str(body, "clusterUUID", 36)
    alias = _str(body, "alias", MAX_ALIAS)
    entrance = _str(body, "entrance", 260)
    ca_pem = _str(body, "caBundle", MAX_PEM)
    csr_pem = _str(body, "csr", MAX_PEM)
    try:
        pki.load_certs(ca_pem)
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


def check_join_answer(body, inv: Invitation, *, own_uuid: str, own_key_fingerprint: str) -> JoinAnswer:
    """Trust the answer only if its CA matches the pin of the connection string, and the certificate is the one
    A's CA issued for our key and our UUID. PinMismatch means the endpoint is not the cluster that invited."""
    if not isinstance(body, dict):
        raise JoinError(INVALID_ANSWER, "the join answer is not a JSON object; the join endpoint is not a peering module")
    try:
        fields = {k: _str(body, k, MAX_PEM if k in ("caBundle", "certificate", "csr") else 260) for k in (
            "clusterUUID", "entrance", "caBundle", "certificate", "csr")}
        alias = _str(body, "alias", MAX_ALIAS)
    except JoinError as exc:
        raise JoinError(INVALID_ANSWER, exc.message.replace("join request", "join answer")) from None
    if not pki.verify_pin(fields["caBundle"], inv.ca_pin):
        raise JoinError(
            PIN_MISMATCH,
            "the CA in the join answer does not match the pin of the connection string: the endpoint is not the "
            "cluster that issued it, or the string was altered; get a new connection string over a secure channel",
        )
    if fields["clusterUUID"] != inv.cluster_uuid:
        raise JoinError(
            INVALID_ANSWER,
            f"the join answer comes from cluster {fields['clusterUUID']}, the connection string names "
            f"{inv.cluster_uuid}; get a new connection string",
        )
    cert = fields["certificate"]
    try:
        ok = (
            pki.issued_by(cert, fields["caBundle"])
            and pki.public_key_fingerprint(cert) == own_key_fingerprint
            and pki.common_name(cert) == own_uuid[:64]
        )
        pki.load_csr(fields["csr"])
    except pki.PKIError as exc:
        raise JoinError(INVALID_ANSWER, f"the join answer carries an unusable certificate or CSR: {exc.message}") from None
    if not ok:
        raise JoinError(
            INVALID_ANSWER,
            "the client certificate in the join answer was not issued by the pinned CA for this cluster's key",
        )
    check = validate_offer(body.get("offer"))
    if not check.ok:
        raise JoinError(check.reason, check.message)
    return JoinAnswer(
        fields["clusterUUID"], alias, fields["entrance"], fields["caBundle"], cert, fields["csr"], body["offer"]
    )


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


def check_credentials(body, *, own_key_fingerprint: str, own_uuid: str, peer_ca_pem: str) -> str:
    """The delivered client certificate, checked to be the peer CA's certificate for our key and UUID."""
    cert = body.get("certificate") if isinstance(body, dict) else None
    if not isinstance(cert, str) or len(cert) > MAX_PEM:
        raise JoinError(reasons.MALFORMED, "the credentials message has no certificate")
    try:
        ok = (
            pki.issued_by(cert, peer_ca_pem)
            and pki.public_key_fingerprint(cert) == own_key_fingerprint
            and pki.common_name(cert) == own_uuid[:64]
        )
    except pki.PKIError as exc:
        raise JoinError(reasons.MALFORMED, f"the delivered certificate cannot be read: {exc.message}") from None
    if not ok:
        raise JoinError(reasons.MALFORMED, "the delivered certificate was not issued by the peer's CA for this cluster's key")
    return cert


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
