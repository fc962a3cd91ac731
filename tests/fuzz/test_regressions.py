"""The crashes the fuzzers found, each written out: every one now ends in the parser's own refusal."""

from __future__ import annotations

import base64
import re

import pytest

from control import pki
from control.rules import join as join_rules
from control.rules import offer as offer_rules

from tests.fuzz.test_control_parsers import NOW, _good_join_body

P256 = bytes.fromhex("06082a8648ce3d030107")  # the OID 1.2.840.10045.3.1.7 (prime256v1), DER


def _csr_with_unknown_curve() -> str:
    pem = pki.make_key_and_csr("3f0c2f4e-1d5b-4c9a-9b7e-2a6f0e1c3d4b").cert_pem
    der = base64.b64decode("".join(pem.strip().splitlines()[1:-1]))
    assert der.count(P256) == 1
    der = der.replace(P256, P256[:-1] + b"\x08")  # 1.2.840.10045.3.1.8: no curve anyone knows
    body = base64.b64encode(der).decode()
    return "-----BEGIN CERTIFICATE REQUEST-----\n" + "\n".join(re.findall(".{1,64}", body)) + \
        "\n-----END CERTIFICATE REQUEST-----\n"


def test_a_csr_on_an_unknown_curve_is_an_invalid_csr():
    # Was cryptography's UnsupportedAlgorithm out of pki.load_csr, and so out of the join handler.
    with pytest.raises(pki.PKIError) as caught:
        pki.load_csr(_csr_with_unknown_curve())
    assert caught.value.reason == "InvalidCSR"
    with pytest.raises(join_rules.JoinError) as refused:
        join_rules.parse_join_request(dict(_good_join_body(), csr=_csr_with_unknown_curve()), now=NOW)
    assert refused.value.reason == "InvalidCSR" and refused.value.code == 400


@pytest.mark.parametrize("field", ["caBundle", "csr"])
def test_a_lone_surrogate_in_a_pem_field_is_refused(field):
    # JSON may escape a lone surrogate ("\ud800"); it reached str.encode() outside the parser's try (load_certs).
    body = _good_join_body()
    body[field] = body[field][:40] + "\ud800" + body[field][40:]
    with pytest.raises(join_rules.JoinError) as refused:
        join_rules.parse_join_request(body, now=NOW)
    assert refused.value.code == 400
    for load in (pki.load_cert, pki.load_certs):
        with pytest.raises(pki.PKIError):
            load("\ud800")
    assert pki.verify_pin("\ud800", "sha256:" + "0" * 64) is False
    assert pki.issued_by("\ud800", "\ud800") is False


@pytest.mark.parametrize("offer", [{"issuer": 1.0}, {"issuer": ["x"]}, [], "x", None, {"issuer": {"jwks": 3}}])
def test_own_keys_problem_reads_any_offer(offer):
    # Was an AttributeError for an issuer that is not an object (the callers validate first; the rule is total).
    assert offer_rules.own_keys_problem(offer, {"issuer": {"jwks": '{"keys": []}'}}) is None


def _with_version(pem: str, marker: bytes, version: int) -> str:
    der = base64.b64decode("".join(pem.strip().splitlines()[1:-1]))
    assert der.count(marker) >= 1
    der = der.replace(marker, marker[:-1] + bytes([version]), 1)
    kind = pem.splitlines()[0]
    body = base64.b64encode(der).decode()
    return kind + "\n" + "\n".join(re.findall(".{1,64}", body)) + "\n" + kind.replace("BEGIN", "END") + "\n"


def test_a_csr_or_certificate_of_an_unknown_version_is_refused():
    # Found by atheris (fuzz/csr.py): x509.InvalidVersion, which is no ValueError, escaped load_csr; the same
    # holds for certificates (a CA bundle of a join).
    csr = _with_version(pki.make_key_and_csr("3f0c2f4e-1d5b-4c9a-9b7e-2a6f0e1c3d4b").cert_pem, b"\x02\x01\x00", 1)
    with pytest.raises(pki.PKIError) as caught:
        pki.load_csr(csr)
    assert caught.value.reason == "InvalidCSR"
    with pytest.raises(join_rules.JoinError):
        join_rules.parse_join_request(dict(_good_join_body(), csr=csr), now=NOW)
    from datetime import datetime, timezone

    ca = pki.create_ca("x", now=datetime(2026, 12, 1, tzinfo=timezone.utc)).cert_pem
    bad_ca = _with_version(ca, b"\xa0\x03\x02\x01\x02", 7)  # [0] EXPLICIT INTEGER 2 (v3) made 7
    for load in (pki.load_cert, pki.load_certs):
        with pytest.raises(pki.PKIError):
            load(bad_ca)
    with pytest.raises(join_rules.JoinError):
        join_rules.parse_join_request(dict(_good_join_body(), caBundle=bad_ca), now=NOW)


@pytest.mark.parametrize("url", ["https://[", "https://[::1", "http://]x[", "https://[zz]/"])
def test_an_issuer_url_with_a_broken_ipv6_literal_is_refused(url):
    # Found by atheris (fuzz/offer.py, fuzz/join_body.py): urlsplit's ValueError escaped validate_offer, and so
    # the join's parser and the pull of an offer.
    check = offer_rules.validate_offer({"issuer": {"url": url}})
    assert (check.ok, check.reason) == (False, "OfferInvalid") and "issuer.url" in check.message
    body = _good_join_body()
    body["offer"]["issuer"]["url"] = url
    with pytest.raises(join_rules.JoinError) as refused:
        join_rules.parse_join_request(body, now=NOW)
    assert refused.value.reason == "OfferInvalid"


@pytest.mark.parametrize("scope", [[{}], [["project"]], [None], [1], ["project", {"a": 1}]])
def test_a_capability_scope_of_other_than_strings_is_refused(scope):
    # Found by atheris (fuzz/offer.py): set(scope) raised TypeError for a scope list holding an object.
    offer = {"capabilities": [{"name": "c", "version": "v1", "scope": scope}]}
    check = offer_rules.validate_offer(offer)
    assert (check.ok, check.reason) == (False, "OfferInvalid") and "scope" in check.message
