"""What this cluster trusts of a peer's certificates: its one peering CA, and the client certificates that CA
issues to this cluster, as pure functions over PEM text.

A peer sends its CA once, in the join (the joiner's in the request, the inviter's in the answer, where it must be
the CA the connection string pins). What is kept is exactly one certificate: self-signed, a CA by its basic
constraints and key usage, ECDSA P-256, valid now. Any more would be trusted by this cluster's egress and by every
later check, and a certificate that merely carries a pinned public key is anyone's to make (the key is public). Every
certificate the peer issues to this cluster (in the join answer, the credentials delivery, a renewal) is checked
against that one CA by cryptography's X.509 path validation.
"""

from __future__ import annotations

from datetime import datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.verification import Criticality, ExtensionPolicy, PolicyBuilder, Store, VerificationError

# The PEM writer and the check of `now` are pki's own, shared so both modules judge time and text alike.
from control.pki import PKIError, as_utc, load_certs, pem_of, verify_pin

#: Why a peer's CA bundle is refused: it is not exactly one self-signed peering CA certificate, valid now.
NOT_A_PEERING_CA = "NotAPeeringCA"
#: Why a join answer's CA bundle is refused: its one certificate is not the CA the connection string pins.
PIN_MISMATCH = "PinMismatch"
#: Why a certificate of the peer is refused: it does not chain to the peer's one CA, or is not valid now.
NOT_ISSUED_BY_PEER_CA = "NotIssuedByPeerCA"


def _ca_problem(cert: x509.Certificate, now: datetime) -> str | None:
    """Why `cert` is not a peering CA certificate at `now` (self-signed, a CA by its basic constraints and key
    usage, ECDSA P-256, within its validity), or None."""
    try:
        key = cert.public_key()
    except (ValueError, UnsupportedAlgorithm):
        return "its public key cannot be read"
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        return "its key is not ECDSA P-256, as every peering CA's is"
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    except x509.ExtensionNotFound:
        return "it has no basic constraints, so it is no CA"
    except ValueError as exc:  # a duplicate or unparsable extension
        return f"its extensions cannot be read ({exc})"
    if not constraints.value.ca or not constraints.critical:
        return "its basic constraints do not make it a CA (cA true, critical)"
    try:
        usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return "it has no key usage, so it may not sign certificates"
    if not usage.key_cert_sign:
        return "its key usage does not allow signing certificates (keyCertSign)"
    if cert.issuer != cert.subject:
        return "it is not self-signed (its issuer is not its subject)"
    try:
        cert.verify_directly_issued_by(cert)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return "it is not self-signed (its signature does not verify with its own key)"
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        return (f"it is not valid now (valid from {cert.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ} to "
                f"{cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ})")
    return None


def _one_certificate(bundle_pem: str) -> x509.Certificate:
    certs = load_certs(bundle_pem)
    if len(certs) != 1:
        raise PKIError(NOT_A_PEERING_CA, f"the CA bundle holds {len(certs)} certificates; a peering module sends "
                                         "exactly one, its self-signed peering CA")
    return certs[0]


def peer_ca(bundle_pem: str, *, now: datetime) -> str:
    """The peer's peering CA from the CA bundle it sent, as the PEM of that one certificate (what is stored, and
    nothing else of the text): exactly one certificate, self-signed, a CA by its basic constraints and key usage,
    ECDSA P-256, valid at `now`. PKIError NotAPeeringCA (or NotACertificate) naming what is wrong."""
    cert = _one_certificate(bundle_pem)
    problem = _ca_problem(cert, as_utc(now))
    if problem is not None:
        raise PKIError(NOT_A_PEERING_CA, f"the CA bundle's certificate is not a peering CA: {problem}")
    return pem_of(cert)


def pinned_ca(bundle_pem: str, pin: str, *, now: datetime) -> str:
    """`peer_ca` of a bundle that must also be the CA the pin names: PKIError PinMismatch when the one certificate
    carries another key, NotAPeeringCA when it carries the pinned key but is not that CA's own certificate (a
    certificate anyone can make around a public key the pin names)."""
    _one_certificate(bundle_pem)
    if not verify_pin(bundle_pem, pin):
        raise PKIError(PIN_MISMATCH, "the CA bundle's certificate does not carry the key the pin names")
    return peer_ca(bundle_pem, now=now)


#: The end-entity certificates a peering CA issues carry no subjectAltName (a client is named by its common name
#: and known by its fingerprint); everything else is the Web PKI profile's.
_CLIENT_EE_POLICY = ExtensionPolicy.webpki_defaults_ee().may_be_present(
    x509.SubjectAlternativeName, Criticality.AGNOSTIC, None)


def verify_client_cert(cert_pem: str, ca_pem: str, *, now: datetime) -> str:
    """The PEM of the one client certificate of `cert_pem`, checked to be issued by `ca_pem` (one peering CA, as
    `peer_ca` returns it) and valid at `now` by cryptography's X.509 path validation (signature, validity, the
    CA's constraints, clientAuth). PKIError NotIssuedByPeerCA naming what failed."""
    certs = load_certs(cert_pem)
    if len(certs) != 1:
        raise PKIError(NOT_ISSUED_BY_PEER_CA, f"expected one client certificate, got {len(certs)}")
    cert, ca = certs[0], _one_certificate(ca_pem)
    verifier = (PolicyBuilder().store(Store([ca])).time(as_utc(now))
                .extension_policies(ca_policy=ExtensionPolicy.webpki_defaults_ca(), ee_policy=_CLIENT_EE_POLICY)
                .build_client_verifier())
    try:
        verifier.verify(cert, [])
    except VerificationError as exc:
        raise PKIError(NOT_ISSUED_BY_PEER_CA, f"the certificate does not chain to the peer's CA: {exc}") from None
    return pem_of(cert)
