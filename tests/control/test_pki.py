"""The peering CA and its certificates: what a peer, the gateway and the renewal logic rely on."""

from __future__ import annotations

import ssl
from datetime import datetime, timedelta, timezone

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from control import pki

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def ca() -> pki.CertAndKey:
    return pki.create_ca("11111111-2222-3333-4444-555555555555", now=NOW)


@pytest.fixture(scope="module")
def other_ca() -> pki.CertAndKey:
    return pki.create_ca("other", now=NOW)


def test_ca_is_p256_ca_naming_the_cluster(ca):
    cert = pki.load_cert(ca.cert_pem)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert "11111111-2222-3333-4444-555555555555" in pki.common_name(ca.cert_pem)
    assert pki.issued_by(ca.cert_pem, ca.cert_pem)
    assert "hidden" in repr(ca) and "PRIVATE" not in repr(ca)


def test_entrance_and_egress_certs(ca):
    entrance = pki.issue_entrance_cert(ca, "%s.a.lab", now=NOW)
    assert pki.dns_names(entrance.cert_pem) == ["peering-gateway.a.lab"]
    egress = pki.issue_egress_cert(ca, now=NOW)
    assert set(pki.dns_names(egress.cert_pem)) == {
        "peering-gateway",
        "peering-gateway.d8-peering",
        "peering-gateway.d8-peering.svc",
        "peering-gateway.d8-peering.svc.cluster.local",
    }
    for leaf in (entrance, egress):
        assert pki.issued_by(leaf.cert_pem, ca.cert_pem)
        eku = pki.load_cert(leaf.cert_pem).extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]


@pytest.mark.parametrize("template", ["example.com", "%s.%s.com", ""])
def test_domain_template_needs_one_placeholder(ca, template):
    with pytest.raises(pki.PKIError) as err:
        pki.issue_entrance_cert(ca, template, now=NOW)
    assert err.value.reason == "InvalidDomainTemplate"


def test_join_host():
    assert pki.join_host("%s.example.com") == "peering.example.com"
    assert pki.entrance_host("%s.example.com") == "peering-gateway.example.com"


def test_client_cert_from_csr(ca):
    req = pki.make_key_and_csr("joiner-uuid")
    cert_pem = pki.issue_client_cert(ca, req.cert_pem, "b-uuid", now=NOW)
    cert = pki.load_cert(cert_pem)
    assert pki.common_name(cert_pem) == "b-uuid"  # ours to set, not the CSR's
    org = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value
    assert org == "peering.deckhouse.io"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    # Short-lived: hours, not months.
    assert cert.not_valid_after_utc - NOW == pki.CLIENT_CERT_LIFETIME == timedelta(hours=24)
    assert pki.issued_by(cert_pem, ca.cert_pem)
    # The CSR and the certificate share the public key fingerprint: a repeated join is recognised by it.
    assert pki.public_key_fingerprint(req.cert_pem) == pki.public_key_fingerprint(cert_pem)
    assert len(pki.fingerprint(cert_pem)) == 64 and pki.fingerprint(cert_pem) == pki.fingerprint(cert_pem).lower()


def test_renewal_csr_keeps_the_key(ca):
    req = pki.make_key_and_csr("b")
    again = pki.csr_for_key(req.key_pem, "b")
    assert pki.public_key_fingerprint(again) == pki.public_key_fingerprint(req.cert_pem)


def test_client_cert_never_outlives_its_ca():
    short_ca = pki.create_ca("short", now=NOW, lifetime=timedelta(hours=3))
    req = pki.make_key_and_csr("b")
    cert = pki.load_cert(pki.issue_client_cert(short_ca, req.cert_pem, "b", now=NOW))
    assert cert.not_valid_after_utc == pki.load_cert(short_ca.cert_pem).not_valid_after_utc


def _csr_with(key, sign_key=None) -> str:
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")]))
        .sign(sign_key or key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def test_csr_refusals(ca):
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(pki.PKIError) as err:
        pki.issue_client_cert(ca, _csr_with(rsa_key), "b", now=NOW)
    assert err.value.reason == "UnsupportedKey" and "P-256" in err.value.message

    p384 = ec.generate_private_key(ec.SECP384R1())
    with pytest.raises(pki.PKIError) as err:
        pki.issue_client_cert(ca, _csr_with(p384), "b", now=NOW)
    assert err.value.reason == "UnsupportedKey"

    with pytest.raises(pki.PKIError) as err:
        pki.issue_client_cert(ca, "not a csr", "b", now=NOW)
    assert err.value.reason == "InvalidCSR"


def test_csr_with_bad_signature_is_refused(ca):
    good = pki.make_key_and_csr("b").cert_pem
    der = bytearray(x509.load_pem_x509_csr(good.encode()).public_bytes(serialization.Encoding.DER))
    der[-3] ^= 0x01  # inside the signature
    tampered = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM).decode()
    with pytest.raises(pki.PKIError) as err:
        pki.issue_client_cert(ca, tampered, "b", now=NOW)
    assert err.value.reason == "InvalidCSR" and "signature" in err.value.message


def test_pin_matches_only_its_ca(ca, other_ca):
    pin = pki.spki_pin(ca.cert_pem)
    assert pin.startswith("sha256:") and len(pin) == 7 + 64
    assert pki.verify_pin(ca.cert_pem, pin)
    assert pki.verify_pin(ca.cert_pem, pin.upper().replace("SHA256", "sha256"))
    assert not pki.verify_pin(other_ca.cert_pem, pin)
    assert not pki.verify_pin("garbage", pin)
    assert not pki.verify_pin(ca.cert_pem, "sha256:" + "0" * 64)
    # A bundle matches only when it is exactly the pinned certificate: one more certificate is trust nobody pinned.
    assert not pki.verify_pin(other_ca.cert_pem + ca.cert_pem, pin)
    assert not pki.verify_pin(ca.cert_pem + other_ca.cert_pem, pin)
    assert not pki.verify_pin(ca.cert_pem + ca.cert_pem, pin)


def test_pin_is_the_spki_hash_kubeadm_uses(ca):
    import hashlib

    spki = pki.load_cert(ca.cert_pem).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert pki.spki_pin(ca.cert_pem) == "sha256:" + hashlib.sha256(spki).hexdigest()


def test_issued_by_tells_cas_apart(ca, other_ca):
    leaf = pki.issue_egress_cert(ca, now=NOW)
    assert pki.issued_by(leaf.cert_pem, ca.cert_pem)
    assert not pki.issued_by(leaf.cert_pem, other_ca.cert_pem)
    assert not pki.issued_by("junk", ca.cert_pem)


def test_ca_key_must_match(ca, other_ca):
    mixed = pki.CertAndKey(ca.cert_pem, other_ca.key_pem)
    with pytest.raises(pki.PKIError) as err:
        pki.issue_egress_cert(mixed, now=NOW)
    assert err.value.reason == "InvalidKey"


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        (timedelta(0), False),
        (timedelta(hours=11), False),
        # Half of (24 h + 5 min backdate) counted from the backdated start: NOW + 12 h - 150 s.
        (timedelta(hours=12, seconds=-151), False),
        (timedelta(hours=12, seconds=-150), True),
        (timedelta(hours=20), True),
        (timedelta(hours=25), True),
        (timedelta(days=-1), True),  # not yet valid: the clock moved back; renew rather than present it
    ],
)
def test_needs_renewal_after_half(ca, offset, expected):
    leaf = pki.issue_client_cert(ca, pki.make_key_and_csr("b").cert_pem, "b", now=NOW)
    assert pki.needs_renewal(leaf, NOW + offset) is expected


def test_needs_renewal_of_unreadable_cert():
    assert pki.needs_renewal("nope", NOW)


def test_naive_now_is_refused(ca):
    with pytest.raises(ValueError, match="timezone"):
        pki.issue_egress_cert(ca, now=datetime(2026, 1, 1))


def test_valid_at(ca):
    leaf = pki.issue_egress_cert(ca, now=NOW).cert_pem
    assert pki.valid_at(leaf, NOW)
    assert not pki.valid_at(leaf, NOW + timedelta(hours=13))
    assert not pki.valid_at(leaf, NOW - timedelta(hours=1))


def test_server_certs_are_short_lived_and_their_lifetime_can_be_chosen(ca):
    leaf = pki.issue_entrance_cert(ca, "%s.example.com", now=NOW).cert_pem
    assert pki.not_after(leaf) - NOW == pki.SERVER_CERT_LIFETIME == timedelta(hours=12)
    short = pki.issue_egress_cert(ca, now=NOW, lifetime=timedelta(seconds=40)).cert_pem
    assert pki.not_after(short) - NOW == timedelta(seconds=40)
    # A short lifetime is backdated by a tenth of it, not five minutes: its renewal is due at half, not at once.
    assert pki.load_cert(short).not_valid_before_utc == NOW - timedelta(seconds=4)
    assert pki.renewal_time(short) == NOW + timedelta(seconds=18)
    assert not pki.needs_renewal(short, NOW + timedelta(seconds=17))
    with pytest.raises(pki.PKIError) as err:
        pki.issue_egress_cert(ca, now=NOW, lifetime=timedelta(0))
    assert err.value.reason == "InvalidLifetime"


def test_certs_work_in_real_tls(ca, tmp_path):
    """The server and client certificates load into ssl contexts that require each other."""
    now = datetime.now(timezone.utc)
    live_ca = pki.create_ca("live", now=now)
    server = pki.issue_server_cert(live_ca, ["peering-gateway.a.lab"], now=now)
    req = pki.make_key_and_csr("b")
    client_cert = pki.issue_client_cert(live_ca, req.cert_pem, "b", now=now)
    for name, text in {
        "ca.pem": live_ca.cert_pem,
        "s.pem": server.cert_pem,
        "s.key": server.key_pem,
        "c.pem": client_cert,
        "c.key": req.key_pem,
    }.items():
        (tmp_path / name).write_text(text)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tmp_path / "ca.pem"))
    server_ctx.load_cert_chain(tmp_path / "s.pem", tmp_path / "s.key")
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    client_ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "c.key")

    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="peering-gateway.a.lab")
    srv = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(10):
        for key, end, out, peer_in in (("c", client, c_out, s_in), ("s", srv, s_out, c_in)):
            if not done[key]:
                try:
                    end.do_handshake()
                    done[key] = True
                except ssl.SSLWantReadError:
                    pass
            peer_in.write(out.read())
        if all(done.values()):
            break
    assert all(done.values())
    peer = srv.getpeercert(binary_form=True)
    assert pki.fingerprint(x509.load_der_x509_certificate(peer).public_bytes(serialization.Encoding.PEM)) == (
        pki.fingerprint(client_cert)
    )
