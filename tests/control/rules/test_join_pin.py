"""The CA pin holds: whoever answers the joiner's `POST /v1/join` (a TLS-inspecting proxy, a hijacked name) cannot
become the inviter by adding to the answer's CA bundle a certificate that carries the inviter's CA public key
(which is no secret: the entrance's handshake shows it). A bundle is exactly one self-signed peering CA, the one
the pin names; the issued certificate must chain to it by X.509 path validation; only that CA is kept. The same
holds for the joiner's bundle the inviter stores, and for every certificate later checked against a stored one
(credentials, renewals)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from contract import reasons
from control import connstring, pki
from control.rules import join as j
from tests.control.test_peertrust import NOT_A_CA, forged_cert

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
A_UUID, B_UUID = "a0000000-0000-0000-0000-00000000000a", "b0000000-0000-0000-0000-00000000000b"
A_CA = pki.create_ca(A_UUID, now=NOW)
EVIL_CA = pki.create_ca("evil", now=NOW)


def _inviter_key_forged() -> str:
    """A certificate carrying the inviter's CA public key (read from a handshake), signed by a throwaway key."""
    throwaway = ec.generate_private_key(ec.SECP256R1())
    return forged_cert(pki.load_cert(A_CA.cert_pem).public_key(), sign_key=throwaway, issuer="throwaway",
                       subject=pki.load_cert(A_CA.cert_pem).subject)


@pytest.fixture()
def joiner():
    inv = connstring.Invitation(A_UUID, "https://peering.a.lab", "peering-gateway.a.lab",
                                pki.spki_pin(A_CA.cert_pem), "abcd1234", "s" * 43, NOW + timedelta(hours=1))
    return inv, pki.make_key_and_csr(B_UUID)


def _answer(b_key: pki.CertAndKey, *, bundle: str, issuer: pki.CertAndKey, entrance="peering-gateway.a.lab",
            certificate: str | None = None) -> dict:
    cert = certificate or pki.issue_client_cert(issuer, b_key.cert_pem, B_UUID, now=NOW)
    return j.join_answer(cluster_uuid=A_UUID, alias="to-b", entrance=entrance, ca_pem=bundle, certificate_pem=cert,
                         csr_pem=pki.make_key_and_csr(A_UUID).cert_pem, offer={})


def _check(answer: dict, inv, b_key) -> j.JoinAnswer:
    return j.check_join_answer(answer, inv, own_uuid=B_UUID, now=NOW,
                               own_key_fingerprint=pki.public_key_fingerprint(b_key.cert_pem))


@pytest.mark.parametrize("bundle", [
    lambda: EVIL_CA.cert_pem + _inviter_key_forged(),
    lambda: _inviter_key_forged() + EVIL_CA.cert_pem,
    lambda: EVIL_CA.cert_pem + A_CA.cert_pem,  # the inviter's real CA certificate, as its entrance shows it
    lambda: A_CA.cert_pem + EVIL_CA.cert_pem,
], ids=["own-ca-then-forged", "forged-then-own-ca", "own-ca-then-real-ca", "real-ca-then-own-ca"])
def test_an_answerer_adding_the_pinned_key_to_its_own_ca_bundle_is_refused(joiner, bundle):
    inv, b_key = joiner
    answer = _answer(b_key, bundle=bundle(), issuer=EVIL_CA, entrance="peering-gateway.evil.lab")
    with pytest.raises(j.JoinError) as err:
        _check(answer, inv, b_key)
    assert err.value.reason == j.PIN_MISMATCH
    assert "2 certificates" in err.value.message and "new connection string" in err.value.message


def test_a_lone_certificate_carrying_the_pinned_key_that_is_not_the_ca_s_own_is_refused(joiner):
    inv, b_key = joiner
    answer = _answer(b_key, bundle=_inviter_key_forged(), issuer=EVIL_CA)
    with pytest.raises(j.JoinError) as err:
        _check(answer, inv, b_key)
    assert err.value.reason == j.PIN_MISMATCH and "not self-signed" in err.value.message


def test_the_honest_answer_keeps_only_the_pinned_ca_and_the_one_certificate(joiner):
    inv, b_key = joiner
    cert = pki.issue_client_cert(A_CA, b_key.cert_pem, B_UUID, now=NOW)
    got = _check(_answer(b_key, bundle="text around\n" + A_CA.cert_pem + "more text\n", issuer=A_CA,
                         certificate="junk\n" + cert), inv, b_key)
    assert got.ca_pem == A_CA.cert_pem and got.certificate_pem == cert


@pytest.mark.parametrize(("certificate", "why"), [
    (lambda b: pki.issue_client_cert(A_CA, b.cert_pem, B_UUID, now=NOW - timedelta(days=2)), "not valid"),
    (lambda b: pki.issue_client_cert(A_CA, b.cert_pem, B_UUID, now=NOW) * 2, "one client certificate"),
    (lambda b: pki.issue_client_cert(EVIL_CA, b.cert_pem, B_UUID, now=NOW), "does not chain"),
    (lambda b: pki.issue_server_cert(A_CA, ["peering-gateway.b.lab"], now=NOW).cert_pem, "EKU"),
], ids=["expired", "two", "other-ca", "server-cert"])
def test_the_issued_certificate_must_pass_path_validation_to_the_pinned_ca(joiner, certificate, why):
    inv, b_key = joiner
    answer = _answer(b_key, bundle=A_CA.cert_pem, issuer=A_CA, certificate=certificate(b_key))
    with pytest.raises(j.JoinError) as err:
        _check(answer, inv, b_key)
    assert err.value.reason == j.INVALID_ANSWER and why in err.value.message


def _join_body(bundle: str) -> dict:
    return {"token": "abcd1234." + "s" * 43, "clusterUUID": B_UUID, "alias": "to-a",
            "entrance": "peering-gateway.b.lab", "caBundle": bundle, "csr": pki.make_key_and_csr(B_UUID).cert_pem,
            "offer": {}}


def test_the_inviter_keeps_only_the_joiner_s_one_ca():
    b_ca = pki.create_ca(B_UUID, now=NOW)
    with pytest.raises(j.JoinError) as err:
        j.parse_join_request(_join_body(b_ca.cert_pem + EVIL_CA.cert_pem), now=NOW)
    assert (err.value.reason, err.value.code) == (reasons.MALFORMED, 400) and "2 certificates" in err.value.message
    with pytest.raises(j.JoinError) as err:
        j.parse_join_request(_join_body(NOT_A_CA), now=NOW)
    assert err.value.reason == reasons.MALFORMED and "not a peering CA" in err.value.message
    assert j.parse_join_request(_join_body("# bundle\n" + b_ca.cert_pem), now=NOW).ca_pem == b_ca.cert_pem


def test_credentials_and_renewals_are_checked_against_exactly_one_stored_ca():
    a_key = pki.make_key_and_csr(A_UUID)
    fp = pki.public_key_fingerprint(a_key.cert_pem)
    b_ca = pki.create_ca(B_UUID, now=NOW)
    by_evil = j.credentials_message(pki.issue_client_cert(EVIL_CA, a_key.cert_pem, A_UUID, now=NOW))
    # A stored bundle of more than one certificate (written before bundles were checked) trusts none of them.
    for stored in (b_ca.cert_pem + EVIL_CA.cert_pem, EVIL_CA.cert_pem + b_ca.cert_pem):
        with pytest.raises(j.JoinError) as err:
            j.check_credentials(by_evil, own_key_fingerprint=fp, own_uuid=A_UUID, peer_ca_pem=stored, now=NOW)
        assert err.value.reason == reasons.MALFORMED and "2 certificates" in err.value.message
    good = pki.issue_client_cert(b_ca, a_key.cert_pem, A_UUID, now=NOW)
    assert j.check_credentials(j.credentials_message(good), own_key_fingerprint=fp, own_uuid=A_UUID,
                               peer_ca_pem=b_ca.cert_pem, now=NOW) == good
    with pytest.raises(j.JoinError) as err:
        j.check_credentials(j.credentials_message(good), own_key_fingerprint=fp, own_uuid=A_UUID,
                            peer_ca_pem=b_ca.cert_pem, now=NOW + timedelta(days=2))
    assert "not valid" in err.value.message
