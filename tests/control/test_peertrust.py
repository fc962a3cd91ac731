"""What this cluster trusts of a peer's certificates: a CA bundle is exactly one self-signed peering CA, valid now
(pinned or not), and a certificate the peer issues us passes X.509 path validation to it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from control import peertrust, pki

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
A_CA = pki.create_ca("a", now=NOW)
EVIL_CA = pki.create_ca("evil", now=NOW)


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def forged_cert(subject_key, *, sign_key=None, issuer: str | None = None, subject: x509.Name | None = None,
          ca: bool | None = True,
          critical: bool = True, key_cert_sign: bool = True, not_before=NOW - timedelta(minutes=5),
          not_after=NOW + timedelta(days=365)) -> str:
    """A certificate for `subject_key`'s public key, signed by `sign_key` (itself when None) under `issuer`'s name
    (the subject's when None), with the given basic constraints and key usage."""
    name = subject or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "forged")])
    builder = (x509.CertificateBuilder().subject_name(name)
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]) if issuer else name)
               .public_key(subject_key.public_key() if hasattr(subject_key, "public_key") else subject_key)
               .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after))
    if ca is not None:
        builder = builder.add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=critical)
    builder = builder.add_extension(x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
        key_agreement=False, key_cert_sign=key_cert_sign, crl_sign=key_cert_sign, encipher_only=False,
        decipher_only=False), critical=True)
    return _pem(builder.sign(sign_key if sign_key is not None else subject_key, hashes.SHA256()))


def _own_key_cases():
    key = ec.generate_private_key(ec.SECP256R1())
    return {
        "not a CA": (forged_cert(key, ca=False), "do not make it a CA"),
        "no basic constraints": (forged_cert(key, ca=None), "no basic constraints"),
        "constraints not critical": (forged_cert(key, critical=False), "do not make it a CA"),
        "no keyCertSign": (forged_cert(key, key_cert_sign=False), "keyCertSign"),
        "not self-signed": (forged_cert(key, sign_key=ec.generate_private_key(ec.SECP256R1()), issuer="other"),
                            "not self-signed"),
        "self-issued, other signer": (forged_cert(key, sign_key=ec.generate_private_key(ec.SECP256R1())),
                                      "signature does not verify"),
        "expired": (forged_cert(key, not_before=NOW - timedelta(days=20), not_after=NOW - timedelta(days=1)),
                    "not valid now"),
        "not yet valid": (forged_cert(key, not_before=NOW + timedelta(days=1)), "not valid now"),
        "RSA": (forged_cert(rsa.generate_private_key(public_exponent=65537, key_size=2048)), "not ECDSA P-256"),
        "two CAs": (A_CA.cert_pem + EVIL_CA.cert_pem, "2 certificates"),
    }


NOT_A_CA = _own_key_cases()["not a CA"][0]


@pytest.mark.parametrize("case", sorted(_own_key_cases()))
def test_a_peer_ca_bundle_is_exactly_one_self_signed_p256_ca_valid_now(case):
    bundle, why = _own_key_cases()[case]
    with pytest.raises(pki.PKIError) as err:
        peertrust.peer_ca(bundle, now=NOW)
    assert err.value.reason == peertrust.NOT_A_PEERING_CA and why in err.value.message
    # The same bundle under its own pin is no better.
    with pytest.raises(pki.PKIError):
        peertrust.pinned_ca(bundle, pki.spki_pin(bundle), now=NOW)
    assert peertrust.peer_ca(A_CA.cert_pem, now=NOW) == A_CA.cert_pem


def test_the_pinned_ca_is_the_one_certificate_carrying_the_pinned_key():
    pin = pki.spki_pin(A_CA.cert_pem)
    assert peertrust.pinned_ca("# the bundle\n" + A_CA.cert_pem, pin, now=NOW) == A_CA.cert_pem
    with pytest.raises(pki.PKIError) as err:
        peertrust.pinned_ca(EVIL_CA.cert_pem, pin, now=NOW)
    assert err.value.reason == peertrust.PIN_MISMATCH
    with pytest.raises(pki.PKIError) as err:
        peertrust.pinned_ca(A_CA.cert_pem + EVIL_CA.cert_pem, pin, now=NOW)
    assert err.value.reason == peertrust.NOT_A_PEERING_CA and "2 certificates" in err.value.message


def test_a_client_certificate_passes_path_validation_to_its_ca_only():
    key = pki.make_key_and_csr("b")
    cert = pki.issue_client_cert(A_CA, key.cert_pem, "b", now=NOW)
    assert peertrust.verify_client_cert(cert, A_CA.cert_pem, now=NOW) == cert
    refusals = {
        "does not chain": (cert, EVIL_CA.cert_pem, NOW),
        "not valid at validation time": (cert, A_CA.cert_pem, NOW + timedelta(days=2)),
        "EKU": (pki.issue_egress_cert(A_CA, now=NOW).cert_pem, A_CA.cert_pem, NOW),
        "one client certificate": (cert + cert, A_CA.cert_pem, NOW),
    }
    for why, (leaf, ca, at) in refusals.items():
        with pytest.raises(pki.PKIError) as err:
            peertrust.verify_client_cert(leaf, ca, now=at)
        assert err.value.reason == peertrust.NOT_ISSUED_BY_PEER_CA and why in err.value.message, why
    with pytest.raises(ValueError, match="timezone"):
        peertrust.verify_client_cert(cert, A_CA.cert_pem, now=datetime(2026, 11, 30))
