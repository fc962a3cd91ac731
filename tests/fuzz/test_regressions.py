"""The crashes the fuzzers found, each written out: every one now ends in the parser's own refusal."""

from __future__ import annotations

import base64
import json
import re
import ssl

import aiohttp
import pytest
import trustme

from contract.errors import Refusal
from control import pki
from control.rules import join as join_rules
from control.rules import offer as offer_rules
from fuzz.seeds import CLUSTER, MAX_TOKEN, NOW_S, SKEW, b64url, peer_claims, peer_material, peer_token, sign
from gateway import catchup
from gateway.exchange import DexClient, dex_refusal, exchange_answer
from gateway.resolve import OverrideResolver
from gateway.tokenreview import REVIEW_PATH, TokenReviewer, review_audiences, reviewed_capabilities
from gateway.tokens import KeySets, claims_expiry, unverified_claims, unverified_expiry, verify_peer_token

from tests.fuzz.test_control_parsers import NOW, _good_join_body
from tests.gateway.support import _tls_site

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


# ----- the gateway: a peer's token, the claims read without verifying, the answers of Dex and TokenReview -----------
PEER_M = peer_material()


def _verify(token: str):
    return verify_peer_token(token, PEER_M["peer"], PEER_M["registry"], KeySets(), now=NOW_S, skew=SKEW,
                             max_bytes=MAX_TOKEN)


def _refused(token: str) -> str:
    with pytest.raises(Refusal) as refused:
        _verify(token)
    assert refused.value.code == 401
    return refused.value.reason


def test_claims_beside_a_json_serialized_signature_are_refused():
    # Found by review, while writing the properties (test_claims_the_signature_does_not_cover_are_refused): jwcrypto
    # reads a token that is JSON as the JWS JSON serialization and verified the signature in it, while the claims
    # were read from the token's text split on dots. One token of the peer, of any audience, expired or not, made
    # the claims of any consumer verify: here a default ServiceAccount's token for another cluster became a token
    # of mod/writer for `write`.
    legit = peer_token("p256", aud=["https://kubernetes.default.svc"], exp=1,
                       sub="system:serviceaccount:kube-system:default").split(".")
    forged_claims = peer_claims(aud=[f"peering.deckhouse.io/{CLUSTER}/write"], sub="system:serviceaccount:mod:writer")
    header = b64url(b'{"alg":"ES256","kid":"p256"}')
    forged = json.dumps({header: "." + b64url(json.dumps(forged_claims).encode()) + ".",
                         "protected": legit[0], "payload": legit[1], "signature": legit[2]})
    assert forged.count(".") == 2
    assert _refused(forged) == "TokenMalformed"


def test_a_token_spelled_otherwise_than_base64url_is_refused():
    # Found by hypothesis (test_every_single_mutation_of_a_valid_token_is_refused): the lenient base64 decoding
    # of jwcrypto skips characters outside the alphabet, accepts padding and ignores the last character's stray
    # bits, so one signed token had endless spellings that all verified, each a verification and an entry of its
    # own in the verified-token cache.
    token = peer_token("p256")
    protected, payload, signature = token.split(".")
    last = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".index(signature[-1])
    stray = signature[:-1] + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[last ^ 1]
    for variant in (token + "=", f"{protected}.{payload}.{signature[:10]}!{signature[10:]}",
                    f"{protected}.{payload}.{stray}", f"{protected}.{payload}.{signature[:5]}\n{signature[5:]}"):
        assert _refused(variant) == "TokenMalformed", variant
    assert _verify(token).capabilities == {"read-pods"}


def test_a_deeply_nested_token_is_refused_not_a_recursion_error():
    # Found by review, while writing the properties: json.loads raises RecursionError, which is no ValueError, for
    # a JSON nested deeper than the interpreter's recursion limit; it escaped the entrance's token check (from the
    # header, before any signature), the egress's claims and the catch-up's claims_of.
    deep = b64url(b"[" * 5000 + b"]" * 5000)
    assert _refused(f"{deep}.e30.e30") == "TokenMalformed"
    assert _refused(sign(b'{"alg":"ES256","kid":"p256"}', b"[" * 5000 + b"]" * 5000)) == "TokenMalformed"
    assert unverified_claims(f"e30.{deep}.e30") is None and catchup.claims_of(f"e30.{deep}.e30") == {}
    assert unverified_expiry(f"e30.{deep}.e30") is None


@pytest.mark.parametrize("exp", [10**400, "NaN", "Infinity", "-Infinity"])
def test_an_expiry_that_is_no_finite_number_is_no_expiry(exp):
    # Found by hypothesis (test_a_signed_token_verifies_exactly_when_every_rule_holds): an integer exp beyond a
    # float raised OverflowError out of the entrance's check (and out of the egress's claims_expiry, for any local
    # pod's token); NaN, which json.loads reads, verified with an expiry that never comes (NaN <= now is false).
    payload = json.dumps(peer_claims(exp=...))[:-1].encode() + b', "exp": %s}' % str(exp).encode()
    token = sign(b'{"alg":"ES256","kid":"p256"}', payload)
    assert _refused(token) in ("TokenExpired", "TokenMalformed")
    assert unverified_expiry(token) is None
    if isinstance(exp, int):
        assert claims_expiry({"exp": exp}) is None


@pytest.mark.parametrize("nbf", [10**400, "NaN", '"soon"', "true"])
def test_a_not_before_that_is_no_number_is_refused(nbf):
    # With the expiry: an nbf beyond a float raised OverflowError; one that is no number was read as none.
    payload = json.dumps(peer_claims(nbf=...))[:-1].encode() + b', "nbf": %s}' % str(nbf).encode()
    assert _refused(sign(b'{"alg":"ES256","kid":"p256"}', payload)) == "TokenMalformed"


NAMES = {"client_id": "peering-gateway", "connector_id": "peering-peer-a", "audience": "kubernetes"}


@pytest.mark.parametrize("access_token", ["tok\r\nX-Injected: 1", "tok\ud800", "tok en", "tök", ""])
def test_an_exchanged_token_that_is_no_header_value_is_refused(access_token):
    # Found by review, while writing the properties: Dex's access_token went into the upstream request head as it
    # came (b"Bearer " + token.encode()): a line end was a header of its own there, a lone surrogate a
    # UnicodeEncodeError.
    with pytest.raises(Refusal) as refused:
        exchange_answer(200, {"access_token": access_token, "expires_in": 300}, **NAMES)
    assert (refused.value.code, refused.value.reason) == (503, "TokenExchangeUnavailable")


def test_an_exchange_lifetime_beyond_a_float_is_the_default():
    # Found by review, while writing the properties: float(expires_in) raised OverflowError for an integer beyond
    # a float, out of the Dex client.
    assert exchange_answer(200, {"access_token": "a.b.c", "expires_in": 10**400}, **NAMES) == ("a.b.c", 300.0)
    assert exchange_answer(200, {"access_token": "a.b.c", "expires_in": 60}, **NAMES) == ("a.b.c", 60.0)


def test_a_dex_description_too_deep_to_print_is_not_quoted():
    # Found by review, while writing the properties: str() of an error_description that json.loads had just
    # managed to read needs a few more frames than the parser had, and raised RecursionError out of dex_refusal.
    for depth in range(1000, 0, -1):  # the deepest description json.loads reads here
        try:
            deep = json.loads('{"error": "access_denied", "error_description": ' + "[" * depth + "]" * depth + "}")
            break
        except RecursionError:
            continue

    def deeper(n: int):
        return dex_refusal(401, deep, **NAMES) if n == 0 else deeper(n - 1)

    refusal = deeper(20)
    assert refusal.reason == "TokenExchangeRefused" and "[" not in refusal.message


@pytest.mark.parametrize("authenticated", ["true", "false", 1, [True], {"a": 1}])
def test_only_a_boolean_true_authenticates_a_token_review(authenticated):
    # Found by review, while writing the properties: any truthy `authenticated` was taken for yes.
    audiences = review_audiences(PEER_M["peer"])
    body = {"status": {"authenticated": authenticated, "audiences": list(audiences),
                       "user": {"username": "system:serviceaccount:mod:controller"}}}
    with pytest.raises(Refusal) as refused:
        reviewed_capabilities(201, body, PEER_M["peer"], PEER_M["registry"], audiences)
    assert (refused.value.code, refused.value.reason) == (401, "TokenInvalid")
    body["status"]["authenticated"] = True
    assert reviewed_capabilities(201, body, PEER_M["peer"], PEER_M["registry"], audiences) == {"read-pods"}


async def test_a_deeply_nested_answer_of_dex_or_the_api_server_is_unavailable():
    # Found by review, while writing the properties: aiohttp's resp.json() raises RecursionError for JSON nested
    # deeper than the recursion limit; neither the Dex client nor the TokenReview client caught it.
    from aiohttp import web

    deep = b"[" * 100_000 + b"]" * 100_000

    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=deep, status=200 if request.path == "/token" else 201,
                            content_type="application/json")

    app = web.Application()
    app.router.add_post("/token", answer)
    app.router.add_post(REVIEW_PATH, answer)
    ca = trustme.CA()
    runner, port = await _tls_site(app, ca.issue_cert("dex.x.lab", "api.x.lab"))
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    resolver = OverrideResolver({"dex.x.lab": f"127.0.0.1:{port}", "api.x.lab": f"127.0.0.1:{port}"})
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, resolver=resolver)) as session:
            dex = DexClient(session, "https://dex.x.lab/token", "peering-gateway", lambda: "s3cret", "kubernetes",
                            timeout=10)
            with pytest.raises(Refusal) as refused:
                await dex("peering-peer-a", peer_token())
            assert (refused.value.code, refused.value.reason) == (503, "TokenExchangeUnavailable")
            reviewer = TokenReviewer(session, "https://api.x.lab", lambda: "api-token", timeout=10, ttl=10,
                                     registry=lambda: PEER_M["registry"])
            with pytest.raises(Refusal) as refused:
                await reviewer("peer-a/1", peer_token())
            assert (refused.value.code, refused.value.reason) == (503, "TokenReviewUnavailable")
    finally:
        await runner.cleanup()
