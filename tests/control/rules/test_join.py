"""The join handshake end to end in plain functions: string, request, redemption, answer, pin, credentials."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

import pytest
from jwcrypto import jwk

from control import connstring, pki
from control.rules import invite
from control.rules import join as j
from control.rules.offer import build_offer

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
A_UUID, B_UUID = "a0000000-0000-0000-0000-00000000000a", "b0000000-0000-0000-0000-00000000000b"
A_CA = pki.create_ca(A_UUID, now=NOW)
B_CA = pki.create_ca(B_UUID, now=NOW)
_key = jwk.JWK.generate(kty="EC", crv="P-256")
_set = jwk.JWKSet()
_set.add(_key)
OFFER = build_offer(
    issuer_url="https://api.x.lab", jwks=_set.export(private_keys=False), projects={"p": ["p"]},
    capabilities=[], peering_version="0.1.0",
)


@pytest.fixture()
def handshake():
    """A: an Invite with a fresh token and its string. B: its key and CSR, kept before calling A."""
    token = invite.generate_token()
    expires = NOW + timedelta(hours=1)
    text = connstring.encode(
        connstring.Invitation(A_UUID, "https://peering.a.lab", "peering-gateway.a.lab", pki.spki_pin(A_CA.cert_pem),
                              token.token_id, token.secret, expires)
    )
    status = invite.invite_status(token, text, expires)
    b_key = pki.make_key_and_csr(B_UUID)
    inv = connstring.decode(text, now=NOW)
    req = j.join_request(inv, cluster_uuid=B_UUID, alias="cluster-a", entrance="peering-gateway.b.lab",
                         ca_pem=B_CA.cert_pem, csr_pem=b_key.cert_pem, offer=OFFER)
    return {"token": token, "status": status, "inv": inv, "b_key": b_key, "req": req}


def _answer(parsed: j.JoinRequest, a_key: pki.CertAndKey, *, ca=A_CA, uuid=A_UUID) -> dict:
    cert = pki.issue_client_cert(ca, parsed.csr_pem, parsed.cluster_uuid, now=NOW)
    return j.join_answer(cluster_uuid=uuid, alias="cluster-b", entrance="peering-gateway.a.lab", ca_pem=ca.cert_pem,
                         certificate_pem=cert, csr_pem=a_key.cert_pem, offer=OFFER)


def test_full_handshake(handshake):
    parsed = j.parse_join_request(handshake["req"], now=NOW)
    assert parsed.cluster_uuid == B_UUID and parsed.alias == "cluster-a"
    assert handshake["token"].secret not in repr(parsed)
    decision = invite.redeem(handshake["status"], parsed.token, parsed.cluster_uuid, None, NOW,
                             joiner_key_fingerprint=parsed.key_fingerprint)
    assert decision.outcome == "accept"
    a_key = pki.make_key_and_csr(A_UUID)
    answer = _answer(parsed, a_key)

    b_fp = pki.public_key_fingerprint(handshake["b_key"].cert_pem)
    got = j.check_join_answer(answer, handshake["inv"], own_uuid=B_UUID, own_key_fingerprint=b_fp, now=NOW)
    assert got.cluster_uuid == A_UUID and got.alias == "cluster-b"

    # B signs A's CSR and delivers it over mTLS; A checks it is for its key.
    delivered = j.credentials_message(pki.issue_client_cert(B_CA, got.csr_pem, A_UUID, now=NOW))
    a_fp = pki.public_key_fingerprint(a_key.cert_pem)
    cert = j.check_credentials(delivered, own_key_fingerprint=a_fp, own_uuid=A_UUID, peer_ca_pem=B_CA.cert_pem, now=NOW)
    assert pki.issued_by(cert, B_CA.cert_pem)

    # B repeats the join after a crash: same key, same answer; another cluster gets TokenUsed.
    used = invite.mark_used(handshake["status"], invite.Redeemer(B_UUID, parsed.key_fingerprint), NOW)
    again = invite.redeem(used, parsed.token, B_UUID, None, NOW, joiner_key_fingerprint=parsed.key_fingerprint,
                          redeemed_by=invite.Redeemer(B_UUID, pki.public_key_fingerprint(got.certificate_pem)))
    assert again.outcome == "reanswer"


def test_pin_mismatch_when_another_ca_answers(handshake):
    parsed = j.parse_join_request(handshake["req"], now=NOW)
    evil_ca = pki.create_ca("evil", now=NOW)
    answer = _answer(parsed, pki.make_key_and_csr(A_UUID), ca=evil_ca)
    with pytest.raises(j.JoinError) as err:
        j.check_join_answer(answer, handshake["inv"], own_uuid=B_UUID,
                            own_key_fingerprint=parsed.key_fingerprint, now=NOW)
    assert err.value.reason == "PinMismatch"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda a: a.update(clusterUUID="someone-else"), "InvalidAnswer"),
        (lambda a: a.update(certificate=pki.issue_client_cert(A_CA, pki.make_key_and_csr("x").cert_pem, B_UUID, now=NOW)),
         "InvalidAnswer"),
        (lambda a: a.update(csr="nope"), "InvalidAnswer"),
        (lambda a: a.pop("alias"), "InvalidAnswer"),
        (lambda a: a.update(offer={"projects": "x"}), "OfferInvalid"),
    ],
)
def test_bad_answers(handshake, mutate, reason):
    parsed = j.parse_join_request(handshake["req"], now=NOW)
    answer = _answer(parsed, pki.make_key_and_csr(A_UUID))
    mutate(answer)
    with pytest.raises(j.JoinError) as err:
        j.check_join_answer(answer, handshake["inv"], own_uuid=B_UUID, own_key_fingerprint=parsed.key_fingerprint, now=NOW)
    assert err.value.reason == reason


def test_answer_that_is_not_an_object(handshake):
    with pytest.raises(j.JoinError) as err:
        j.check_join_answer("<html>", handshake["inv"], own_uuid=B_UUID, own_key_fingerprint="x", now=NOW)
    assert err.value.reason == "InvalidAnswer"


@pytest.mark.parametrize(
    ("mutate", "reason", "code"),
    [
        (lambda r: r.pop("token"), "Malformed", 400),
        (lambda r: r.update(clusterUUID="x" * 37), "Malformed", 400),
        (lambda r: r.update(caBundle="nope"), "Malformed", 400),
        (lambda r: r.update(csr="nope"), "InvalidCSR", 400),
        (lambda r: r.update(offer=[]), "OfferInvalid", 400),
        (lambda r: r.update(offer={"projects": [{"name": str(i)} for i in range(10_001)]}), "OfferTooLarge", 413),
    ],
)
def test_bad_requests(handshake, mutate, reason, code):
    req = copy.deepcopy(handshake["req"])
    mutate(req)
    with pytest.raises(j.JoinError) as err:
        j.parse_join_request(req, now=NOW)
    assert (err.value.reason, err.value.code) == (reason, code)
    assert handshake["token"].secret not in err.value.message


def test_request_not_an_object():
    with pytest.raises(j.JoinError):
        j.parse_join_request(["x"], now=NOW)


@pytest.mark.parametrize(
    ("code", "body", "reason"),
    [
        (None, "connection refused", "JoinEndpointUnreachable"),
        (409, {"kind": "Status", "reason": "TokenUsed", "message": "used"}, "TokenUsed"),
        (403, {"reason": "TokenInvalid", "message": "m"}, "TokenInvalid"),
        (429, {"reason": "TooManyAttempts", "message": "m"}, "TooManyAttempts"),
        (502, "<html>bad gateway</html>", "JoinRefused"),
        (403, {"reason": "Forbidden", "message": "m"}, "JoinRefused"),
    ],
)
def test_join_failure(code, body, reason):
    assert j.join_failure(code, body)[0] == reason


def test_offer_and_certificate_messages():
    assert j.parse_offer_message(j.offer_message("cluster-b", OFFER)) == ("cluster-b", OFFER)
    for bad in ({}, {"offer": OFFER}, {"offer": OFFER, "alias": 5}, None):
        with pytest.raises(j.JoinError):
            j.parse_offer_message(bad)
    csr = pki.make_key_and_csr(B_UUID).cert_pem
    assert j.parse_certificate_request(j.certificate_request(csr)) == csr
    with pytest.raises(j.JoinError) as err:
        j.parse_certificate_request({"csr": "x"})
    assert err.value.reason == "InvalidCSR"
    with pytest.raises(j.JoinError):
        j.parse_certificate_request({})
    assert j.certificate_answer("PEM") == {"certificate": "PEM"}


def test_credentials_from_the_wrong_ca_are_refused():
    a_key = pki.make_key_and_csr(A_UUID)
    other = pki.create_ca("other", now=NOW)
    cert = pki.issue_client_cert(other, a_key.cert_pem, A_UUID, now=NOW)
    fp = pki.public_key_fingerprint(a_key.cert_pem)
    with pytest.raises(j.JoinError):
        j.check_credentials({"certificate": cert}, own_key_fingerprint=fp, own_uuid=A_UUID, peer_ca_pem=B_CA.cert_pem, now=NOW)
    with pytest.raises(j.JoinError):
        j.check_credentials({"certificate": "junk"}, own_key_fingerprint=fp, own_uuid=A_UUID, peer_ca_pem=B_CA.cert_pem, now=NOW)
    with pytest.raises(j.JoinError):
        j.check_credentials({}, own_key_fingerprint=fp, own_uuid=A_UUID, peer_ca_pem=B_CA.cert_pem, now=NOW)
