"""The peering CA and every certificate it issues, as pure functions over PEM text.

One CA per cluster (ECDSA P-256, kept in the Secret `d8-peering/peering-ca`) signs the entrance and egress server
certificates and the client certificates of peers. Nothing here touches the network or the API: the caller passes
`now` in and stores what comes back.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from contract import reasons
from contract.errors import InputError

#: Organisation of every client certificate a peering CA issues; the gateway may check it.
CLIENT_ORGANIZATION = "peering.deckhouse.io"
CA_LIFETIME = timedelta(days=3650)
#: The entrance and egress server certificates: hours, renewed by this cluster's own leader (no peer involved), so
#: a leader that was down longer only means a new certificate at once when it is back.
SERVER_CERT_LIFETIME = timedelta(hours=12)
#: A peer's client certificate: hours, renewed by the peer over the mTLS channel once half of it passed. A peer that
#: cannot reach us for longer than the other half lets it expire; an expired one admits nothing but its own renewal,
#: for the same key, once the peer is back (docs/protocol.md §3.1 weighs this).
CLIENT_CERT_LIFETIME = timedelta(hours=24)
#: Backdating tolerates clocks of peers that run a little behind ours (at most a tenth of a short lifetime).
BACKDATE = timedelta(minutes=5)
#: A certificate is renewed once this share of its lifetime has passed: half, so that a renewal that keeps failing
#: leaves as long again to notice (the certificate alert fires at three quarters).
RENEW_AFTER_SHARE = 1 / 2
#: The egress Service of the module, reached by local consumers under any of these names.
EGRESS_HOSTS = (
    "peering-gateway",
    "peering-gateway.d8-peering",
    "peering-gateway.d8-peering.svc",
    "peering-gateway.d8-peering.svc.cluster.local",
)


class PKIError(InputError):
    """Input a certificate operation cannot use; `reason` is machine-readable, the message says what to do."""


@dataclass(frozen=True)
class CertAndKey:
    """A certificate and its private key, both PEM text (the key unencrypted, PKCS#8)."""

    cert_pem: str
    key_pem: str = ""

    def __repr__(self) -> str:  # the key never reaches a log through repr
        return f"CertAndKey(cert_pem=<{len(self.cert_pem)} chars>, key_pem=<hidden>)"


def entrance_host(public_domain_template: str) -> str:
    """`peering-gateway.<domain>` from Deckhouse's `global.modules.publicDomainTemplate` (`%s.example.com`)."""
    if public_domain_template.count("%s") != 1:
        raise PKIError(
            "InvalidDomainTemplate",
            f"public domain template {public_domain_template!r} must contain %s exactly once, "
            "set global.modules.publicDomainTemplate like %s.example.com",
        )
    return public_domain_template % "peering-gateway"


def join_host(public_domain_template: str) -> str:
    """`peering.<domain>`: the host of the join endpoint behind the Ingress."""
    entrance_host(public_domain_template)  # same validation
    return public_domain_template % "peering"


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def pem_of(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def as_utc(now: datetime) -> datetime:
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (UTC)")
    return now.astimezone(timezone.utc)


def load_cert(cert_pem: str | bytes) -> x509.Certificate:
    """The first certificate of a PEM text; PKIError NotACertificate when there is none."""
    try:  # a lone surrogate of a JSON string fails to encode: a ValueError too
        return x509.load_pem_x509_certificate(cert_pem.encode() if isinstance(cert_pem, str) else cert_pem)
    except (ValueError, x509.InvalidVersion) as exc:  # InvalidVersion is no ValueError
        raise PKIError("NotACertificate", f"expected a PEM certificate, could not parse it: {exc}") from None


def load_certs(bundle_pem: str | bytes) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle; PKIError NotACertificate when there is none."""
    try:
        certs = x509.load_pem_x509_certificates(bundle_pem.encode() if isinstance(bundle_pem, str) else bundle_pem)
    except (ValueError, x509.InvalidVersion) as exc:
        raise PKIError("NotACertificate", f"expected PEM certificates, could not parse them: {exc}") from None
    return certs


def newest(bundle_pem: str) -> str:
    """The first certificate of a bundle as PEM (of `issued.crt`: the newest, the one in force); PKIError when
    there is none."""
    return pem_of(load_cert(bundle_pem))


def _load_key(key_pem: str) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except (ValueError, TypeError):
        raise PKIError("InvalidKey", "the private key is not an unencrypted PEM key; recreate the Secret") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise PKIError("InvalidKey", "the private key is not ECDSA P-256; recreate the Secret")
    return key


def create_ca(cluster_name: str, *, now: datetime, lifetime: timedelta = CA_LIFETIME) -> CertAndKey:
    """A new peering CA whose common name names the cluster (its UUID or domain)."""
    now = as_utc(now)
    key = _new_key()
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, CLIENT_ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, f"peering CA {cluster_name}"[:64]),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertAndKey(pem_of(cert), _key_pem(key))


def _leaf_builder(
    ca: CertAndKey, subject: x509.Name, public_key, now: datetime, lifetime: timedelta
) -> tuple[x509.CertificateBuilder, ec.EllipticCurvePrivateKey]:
    ca_cert = load_cert(ca.cert_pem)
    ca_key = _load_key(ca.key_pem)
    if ca_cert.public_key().public_numbers() != ca_key.public_key().public_numbers():
        raise PKIError("InvalidKey", "the CA key does not belong to the CA certificate; recreate the peering-ca Secret")
    if lifetime <= timedelta(0):
        raise PKIError("InvalidLifetime", f"a certificate lifetime must be positive, got {lifetime}")
    not_after = min(now + lifetime, ca_cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - min(BACKDATE, lifetime / 10))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    return builder, ca_key


def issue_server_cert(
    ca: CertAndKey, hosts: list[str] | tuple[str, ...], *, now: datetime, lifetime: timedelta = SERVER_CERT_LIFETIME
) -> CertAndKey:
    """A server certificate with a fresh key for the given DNS names (the first is the common name)."""
    if not hosts or any(not h or "/" in h or " " in h for h in hosts):
        raise PKIError("InvalidHost", f"server certificate needs at least one DNS name, got {list(hosts)!r}")
    now = as_utc(now)
    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0][:64])])
    builder, ca_key = _leaf_builder(ca, subject, key.public_key(), now, lifetime)
    cert = (
        builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return CertAndKey(pem_of(cert), _key_pem(key))


def issue_entrance_cert(ca: CertAndKey, public_domain_template: str, *, now: datetime,
                        lifetime: timedelta = SERVER_CERT_LIFETIME) -> CertAndKey:
    """The entrance server certificate for `peering-gateway.<domain>`."""
    return issue_server_cert(ca, [entrance_host(public_domain_template)], now=now, lifetime=lifetime)


def issue_egress_cert(ca: CertAndKey, *, now: datetime, lifetime: timedelta = SERVER_CERT_LIFETIME) -> CertAndKey:
    """The egress server certificate for the module's Service under its full and short names."""
    return issue_server_cert(ca, list(EGRESS_HOSTS), now=now, lifetime=lifetime)


def make_key_and_csr(cluster_uuid: str) -> CertAndKey:
    """A new client key and a CSR for it; returned as CertAndKey(cert_pem=<CSR PEM>, key_pem=<key PEM>).

    The key is kept (in the peer Secret) before the CSR leaves the cluster, so a join repeated after a crash
    presents the same public key and gets the same answer.
    """
    key = _new_key()
    return CertAndKey(_client_csr_pem(key, cluster_uuid), _key_pem(key))


def csr_for_key(key_pem: str, cluster_uuid: str) -> str:
    """A CSR for an existing client key (renewal keeps the key that the peer Secret holds)."""
    return _client_csr_pem(_load_key(key_pem), cluster_uuid)


def _client_csr_pem(key: ec.EllipticCurvePrivateKey, cluster_uuid: str) -> str:
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, CLIENT_ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, cluster_uuid[:64]),
        ]
    )
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def load_csr(csr_pem: str) -> x509.CertificateSigningRequest:
    """A CSR checked for what a peering CA signs: ECDSA P-256 key and a valid self-signature."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem.encode() if isinstance(csr_pem, str) else csr_pem)
    except (ValueError, x509.InvalidVersion):
        raise PKIError(reasons.INVALID_CSR, "the certificate request is not a PEM CSR; send a PEM CERTIFICATE REQUEST") from None
    try:
        key = csr.public_key()
    except (ValueError, UnsupportedAlgorithm):  # an unknown curve is UnsupportedAlgorithm, not a ValueError
        raise PKIError(reasons.INVALID_CSR, "the certificate request's public key cannot be read") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise PKIError(
            reasons.UNSUPPORTED_KEY, "the certificate request's key is not ECDSA P-256; make the client key with P-256"
        )
    if not csr.is_signature_valid:
        raise PKIError(
            reasons.INVALID_CSR, "the certificate request's signature does not verify; it was altered or signed with another key"
        )
    return csr


def issue_client_cert(
    ca: CertAndKey, csr_pem: str, peer_cluster_uuid: str, *, now: datetime, lifetime: timedelta = CLIENT_CERT_LIFETIME
) -> str:
    """A client certificate for a peer from its CSR; the subject is ours to set, whatever the CSR asked for."""
    if not peer_cluster_uuid:
        raise PKIError("InvalidClusterUUID", "the peer's cluster UUID is empty")
    csr = load_csr(csr_pem)
    now = as_utc(now)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, CLIENT_ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, peer_cluster_uuid[:64]),
        ]
    )
    builder, ca_key = _leaf_builder(ca, subject, csr.public_key(), now, lifetime)
    cert = builder.add_extension(
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
    ).sign(ca_key, hashes.SHA256())
    return pem_of(cert)


def fingerprint(cert_pem: str | bytes) -> str:
    """SHA-256 of the certificate's DER, lower-case hex: how the gateway maps a client cert to its peer."""
    return load_cert(cert_pem).fingerprint(hashes.SHA256()).hex()


def _spki_der(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def public_key_fingerprint(pem: str) -> str:
    """SHA-256 (hex) of the SubjectPublicKeyInfo of a certificate or a CSR: the same for a CSR and its cert."""
    text = pem if isinstance(pem, str) else pem.decode()
    if "CERTIFICATE REQUEST" in text:
        return hashlib.sha256(_spki_der(load_csr(text).public_key())).hexdigest()
    try:
        return hashlib.sha256(_spki_der(load_cert(text).public_key())).hexdigest()
    except (ValueError, UnsupportedAlgorithm):
        raise PKIError("NotACertificate", "the certificate's public key cannot be read") from None


def spki_pin(ca_pem: str) -> str:
    """`sha256:<hex>` of the CA's SubjectPublicKeyInfo DER, as kubeadm's discovery-token-ca-cert-hash."""
    return "sha256:" + hashlib.sha256(_spki_der(load_cert(ca_pem).public_key())).hexdigest()


def _pin_matches(cert: x509.Certificate, pin: str) -> bool:
    try:
        got = "sha256:" + hashlib.sha256(_spki_der(cert.public_key())).hexdigest()
    except (ValueError, UnsupportedAlgorithm):
        return False  # a key that cannot be read matches no pin
    return hmac.compare_digest(got.encode(), pin.strip().lower().encode())


def verify_pin(ca_pem: str, pin: str) -> bool:
    """Whether the bundle is exactly one certificate and it carries the key the pin names; a malformed bundle or
    pin, or a bundle of more than one certificate, never matches (a second certificate is trust nobody pinned).
    Whether that one certificate is the CA's own is `peertrust.pinned_ca`'s to check."""
    try:
        certs = load_certs(ca_pem)
    except PKIError:
        return False
    return len(certs) == 1 and _pin_matches(certs[0], pin)


def issued_by(cert_pem: str, ca_pem: str) -> bool:
    """Whether the CA signed the certificate (issuer name and signature); validity dates are not checked here."""
    try:
        cert = load_cert(cert_pem)
        ca = load_cert(ca_pem)
    except PKIError:
        return False
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False
    return True


def valid_at(cert_pem: str, now: datetime) -> bool:
    """Whether `now` lies inside the certificate's validity period."""
    cert = load_cert(cert_pem)
    now = as_utc(now)
    return cert.not_valid_before_utc <= now <= cert.not_valid_after_utc


def not_after(cert_pem: str) -> datetime:
    """When the (first) certificate of the PEM text expires."""
    return load_cert(cert_pem).not_valid_after_utc


def issued_at(cert_pem: str) -> datetime:
    """When the (first) certificate of the PEM text was issued: its notBefore undone of the backdating."""
    cert = load_cert(cert_pem)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    # notBefore = issue - min(BACKDATE, lifetime / 10), notAfter = issue + lifetime: undone from the span.
    return start + min(BACKDATE, (end - start) / 11)


def renewal_time(cert_pem: str) -> datetime:
    """When the certificate should be renewed: once `RENEW_AFTER_SHARE` (half) of its lifetime has passed."""
    cert = load_cert(cert_pem)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return start + (end - start) * RENEW_AFTER_SHARE


def needs_renewal(cert_pem: str, now: datetime) -> bool:
    """True once half of the lifetime has passed (or the certificate is not yet valid, or cannot be read)."""
    try:
        cert = load_cert(cert_pem)
    except PKIError:
        return True
    now = as_utc(now)
    if now < cert.not_valid_before_utc:
        return True
    return now >= renewal_time(cert_pem)


def common_name(cert_pem: str) -> str:
    """The subject common name of a certificate (a peer's cluster UUID for client certs)."""
    attrs = load_cert(cert_pem).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attrs[0].value) if attrs else ""


def dns_names(cert_pem: str) -> list[str]:
    """The DNS names of a certificate's subjectAltName (empty when it has none)."""
    try:
        ext = load_cert(cert_pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return ext.value.get_values_for_type(x509.DNSName)
