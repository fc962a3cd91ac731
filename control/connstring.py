"""The connection string an inviting cluster hands to a joining one (DESIGN.md §4).

Format: `d8peer1.` followed by the unpadded base64url of a compact JSON object:

    {"u": inviter cluster UUID, "j": join URL, "e": entrance host[:port], "p": "sha256:<hex>" CA pin,
     "t": "<tokenID>.<secret>", "x": expiry (Unix seconds), "c": [base64 DER, ...] (optional: CA of the join
     endpoint when it is not publicly trusted), "k": first 8 hex of SHA-256 over the other fields}

The whole string is at most 4096 characters (the CRD limit of spec.join.connectionString).

Tampering: the string carries no signature (the joiner holds no key to check one). The checksum `k` turns an
accidental change or a truncation into `Malformed` when decoding. A deliberate change that recomputes `k` is
caught at join time: the join answer must carry a CA whose SubjectPublicKeyInfo matches the pin `p`
(PinMismatch), and the join endpoint itself must pass TLS verification against the public roots or `c`.
Whoever can rewrite the string already holds its token, so the pin protects the joiner, not the token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import urlsplit

from contract import reasons
from contract.errors import InputError

PREFIX = "d8peer"
VERSION = 1
MAX_LENGTH = 4096

_PREFIX_RE = re.compile(r"^d8peer(\d+)\.")
#: Where a connection string of any version starts, inside any text. The chart's admission policies
#: (templates/admission-policy-connection-string.yaml) match annotations with the same RE2 pattern.
COPY_PATTERN = "d8peer[0-9]+[.]"
_COPY_RE = re.compile(COPY_PATTERN)
_TOKEN_ID_RE = re.compile(r"^[a-z0-9]{1,16}$")
#: base64url alphabet; 22 characters carry 128 bits.
_SECRET_RE = re.compile(r"^[A-Za-z0-9_-]{22,128}$")
_UUID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,35}$")
_PIN_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_HOST_RE = re.compile(r"^[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?$")

_DO_GET_A_NEW_ONE = "ask the administrator of the inviting cluster for a new connection string"


class ConnectionStringError(InputError):
    """A connection string that cannot be used. `reason` is machine-readable; the message never has the token."""


@dataclass(frozen=True)
class Invitation:
    """What a connection string carries."""

    cluster_uuid: str
    join_url: str
    entrance_host: str
    ca_pin: str
    token_id: str
    token_secret: str = field(repr=False)
    expires_at: datetime
    #: PEM bundle of the join endpoint's CA when it is not publicly trusted, else None.
    join_ca_pem: str | None = None
    version: int = VERSION

    @property
    def token(self) -> str:
        return f"{self.token_id}.{self.token_secret}"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64url(text: str) -> bytes:
    if not re.fullmatch(r"[A-Za-z0-9_-]*", text):
        raise binascii.Error("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _checksum(payload: dict) -> str:
    body = json.dumps({k: v for k, v in payload.items() if k != "k"}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:8]


def _pem_to_der_list(pem: str) -> list[str]:
    # DER in standard base64 is about a quarter shorter than PEM inside the outer base64.
    from control.pki import PKIError, load_certs  # late import keeps decoding free of the crypto backend

    try:
        certs = load_certs(pem)
    except PKIError as exc:
        raise ValueError(f"join CA bundle is not PEM certificates: {exc.message}") from None
    from cryptography.hazmat.primitives import serialization

    return [base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode() for c in certs]


def _der_list_to_pem(items: list[str]) -> str:
    out = []
    for item in items:
        der = base64.b64decode(item, validate=True)
        body = base64.encodebytes(der).decode().replace("\n", "")
        lines = [body[i : i + 64] for i in range(0, len(body), 64)]
        out.append("-----BEGIN CERTIFICATE-----\n" + "\n".join(lines) + "\n-----END CERTIFICATE-----\n")
    return "".join(out)


def _check_fields(inv: Invitation) -> None:
    """Raise ValueError naming the first field that cannot travel in a connection string."""
    if not _UUID_RE.match(inv.cluster_uuid):
        raise ValueError("cluster UUID must be 1-36 letters, digits, '.', '_' or '-'")
    url = urlsplit(inv.join_url)
    if url.scheme != "https" or not url.hostname or url.path not in ("", "/") or url.query or url.fragment:
        raise ValueError("join URL must be https://<host>[:port] with no path")
    if not _HOST_RE.match(inv.entrance_host):
        raise ValueError("entrance host must be host[:port]")
    if not _PIN_RE.match(inv.ca_pin):
        raise ValueError("CA pin must be sha256:<64 lower-case hex>")
    if not _TOKEN_ID_RE.match(inv.token_id):
        raise ValueError("token ID must be 1-16 lower-case letters or digits")
    if not _SECRET_RE.match(inv.token_secret):
        raise ValueError("token secret must be at least 22 base64url characters (128 bits)")
    if inv.expires_at.tzinfo is None:
        raise ValueError("expiry must be timezone-aware")


def encode(inv: Invitation) -> str:
    """The connection string for an invitation; ValueError when a field is invalid or the result is too long."""
    _check_fields(inv)
    payload: dict = {
        "u": inv.cluster_uuid,
        "j": inv.join_url.rstrip("/"),
        "e": inv.entrance_host,
        "p": inv.ca_pin,
        "t": inv.token,
        "x": int(inv.expires_at.timestamp()),
    }
    if inv.join_ca_pem:
        payload["c"] = _pem_to_der_list(inv.join_ca_pem)
    payload["k"] = _checksum(payload)
    text = f"{PREFIX}{VERSION}." + _b64url(json.dumps(payload, separators=(",", ":")).encode())
    if len(text) > MAX_LENGTH:
        raise ValueError(
            f"connection string would be {len(text)} characters, over the limit of {MAX_LENGTH}; "
            "the join endpoint's CA bundle is too large, use a publicly trusted certificate or a smaller CA"
        )
    return text


def _malformed(what: str) -> ConnectionStringError:
    return ConnectionStringError(
        reasons.MALFORMED,
        f"the connection string is malformed ({what}); copy it again in full from "
        f"status.invite.connectionString of the inviting cluster, or {_DO_GET_A_NEW_ONE}",
    )


def decode(text: str, *, now: datetime, expected_cluster_uuid: str | None = None) -> Invitation:
    """Decode and check a connection string, in the order that keeps the token safe.

    Checks: length, version, encoding, fields and checksum, expiry, then the expected cluster UUID, all before the
    caller sends the token anywhere. The CA pin is checked later against the CA the join answer carries.
    """
    text = text.strip() if isinstance(text, str) else ""
    if len(text) > MAX_LENGTH:
        raise ConnectionStringError(
            "TooLong",
            f"the connection string is {len(text)} characters, longer than {MAX_LENGTH}; "
            f"it is not one this module issued, {_DO_GET_A_NEW_ONE}",
        )
    if text == "<omitted>":
        raise ConnectionStringError(
            reasons.MALFORMED,
            "the connection string was written as <omitted>; set spec.join.connectionString with an account "
            "that has the clusterpeers/sensitive permission",
        )
    m = _PREFIX_RE.match(text)
    if not m:
        raise _malformed(f"it does not start with {PREFIX}{VERSION}.")
    if int(m.group(1)) != VERSION:
        raise ConnectionStringError(
            "UnsupportedVersion",
            f"the connection string has format version {m.group(1)}, this module reads version {VERSION}; "
            "update the peering module so both clusters run the same version, or ask for a string of version "
            f"{VERSION}",
        )
    try:
        raw = _unb64url(text[m.end() :])
    except (binascii.Error, ValueError):
        raise _malformed("bad base64") from None
    try:
        payload = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise _malformed("bad JSON, probably truncated") from None
    if not isinstance(payload, dict):
        raise _malformed("not an object")
    missing = [k for k in ("u", "j", "e", "p", "t", "x", "k") if k not in payload]
    if missing:
        raise _malformed(f"missing fields {', '.join(missing)}")
    if not isinstance(payload["k"], str) or payload["k"] != _checksum(payload):
        raise _malformed("checksum mismatch: it was changed or cut")
    try:
        strings = {k: payload[k] for k in ("u", "j", "e", "p", "t")}
        if not all(isinstance(v, str) for v in strings.values()):
            raise ValueError("fields must be strings")
        if not isinstance(payload["x"], int) or isinstance(payload["x"], bool):
            raise ValueError("expiry must be an integer")
        token_id, sep, secret = strings["t"].partition(".")
        if not sep:
            raise ValueError("token must be <tokenID>.<secret>")
        join_ca = None
        if "c" in payload:
            if not isinstance(payload["c"], list) or not all(isinstance(i, str) for i in payload["c"]):
                raise ValueError("join CA must be a list of base64 strings")
            join_ca = _der_list_to_pem(payload["c"]) if payload["c"] else None
        inv = Invitation(
            cluster_uuid=strings["u"],
            join_url=strings["j"],
            entrance_host=strings["e"],
            ca_pin=strings["p"],
            token_id=token_id,
            token_secret=secret,
            expires_at=datetime.fromtimestamp(payload["x"], tz=timezone.utc),
            join_ca_pem=join_ca,
        )
        _check_fields(inv)
    except (ValueError, OverflowError, OSError, binascii.Error) as exc:
        # Field checks never quote the token, so the message stays free of the secret.
        raise _malformed(str(exc).split(":")[0]) from None
    if now >= inv.expires_at:
        raise ConnectionStringError(
            "Expired",
            f"the connection string expired at {format_time(inv.expires_at)}; {_DO_GET_A_NEW_ONE} "
            "(the inviting cluster issues one as soon as the old one expires unused)",
        )
    if expected_cluster_uuid and expected_cluster_uuid != inv.cluster_uuid:
        raise ConnectionStringError(
            reasons.CLUSTER_NOT_EXPECTED,
            f"the connection string was issued by cluster {inv.cluster_uuid}, but spec.join.expectedClusterUUID "
            f"is {expected_cluster_uuid}; the token was not sent anywhere. Check that the string comes from the "
            "cluster you meant, or correct spec.join.expectedClusterUUID",
        )
    return inv


def copies_in(annotations: object) -> list[str]:
    """The keys of the annotations (metadata.annotations of a ClusterPeer) whose value holds a connection string:
    kubectl's client-side apply copies the whole object, spec.join.connectionString included, into
    `kubectl.kubernetes.io/last-applied-configuration`, which the API server never masks. Sorted; never the values."""
    if not isinstance(annotations, dict):
        return []
    return sorted(k for k, v in annotations.items() if isinstance(k, str) and isinstance(v, str) and _COPY_RE.search(v))


def format_time(t: datetime) -> str:
    """RFC 3339 in UTC with a Z, as Kubernetes writes times."""
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
