"""What the gateway makes of the answers of the services it asks, under arbitrary status and body: Dex's token
endpoint (gateway/exchange.py `exchange_answer`, `dex_refusal`) and the API server's TokenReview
(gateway/tokenreview.py `reviewed_capabilities`). Each answers its result or a Refusal whose reason and code are
the documented ones, never another exception; an exchanged token is one header value; a review grants only what
an authenticated answer's audiences, the peer's effective capabilities and the consumers allow; no refusal quotes
a token or the client secret that the body carries."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from contract import reasons
from contract.errors import Refusal
from contract.names import audience
from fuzz.seeds import CONSUMES, peer_material
from gateway.exchange import DEFAULT_EXPIRES_IN, dex_refusal, exchange_answer
from gateway.tokenreview import review_audiences, reviewed_capabilities

from tests.fuzz.strategies import FUZZ, json_values

M = peer_material()
PEER, REGISTRY = M["peer"], M["registry"]
TOKEN = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6bW9kOmNvbnRyb2xsZXIifQ.c2lnbmF0dXJlLXNlY3JldA"
SECRET = "dex-client-s3cret-s3cret"
NAMES = {"client_id": "peering-gateway", "connector_id": "peering-peer-a", "audience": "kubernetes"}
DEX_ERRORS = ["invalid_client", "invalid_request", "server_error", "access_denied", "invalid_grant",
              "unsupported_grant_type", "", "INVALID_CLIENT"]
_statuses = st.sampled_from([200, 201, 204, 301, 400, 401, 403, 404, 429, 500, 502, 503]) | st.integers(100, 599)


@st.composite
def dex_bodies(draw) -> object:
    """What Dex's token endpoint could answer: an RFC 6749 error or success object, with the subject token and the
    client secret echoed in fields other than the ones a refusal quotes, or any JSON at all."""
    if draw(st.booleans()):
        return draw(json_values)
    body = {"error": draw(st.sampled_from(DEX_ERRORS) | json_values),
            "error_description": draw(st.sampled_from(["connector not found", "Requested connector does not exist.",
                                                       "Invalid client credentials.", ""]) | json_values),
            "access_token": draw(st.sampled_from([TOKEN, "", "a b", "tok\r\nX-Injected: 1", "tok\ud800", "tök",
                                                  "abc==", "=abc", "a.b-c_d~e+f/g="]) | json_values),
            "expires_in": draw(st.sampled_from([300, 0, -1, 1.5, True, "300", None, 10**400, 1e308]) | json_values),
            "subject_token": TOKEN, "client_secret": SECRET}
    return {k: v for k, v in body.items() if draw(st.booleans())}


def _no_secret(refusal: Refusal) -> None:
    assert TOKEN not in refusal.message and SECRET not in refusal.message and "s3cret" not in refusal.message


@FUZZ
@given(_statuses, dex_bodies())
def test_a_dex_answer_is_a_token_for_one_header_or_a_documented_refusal(status, body):
    try:
        token, expires_in = exchange_answer(status, body, **NAMES)
    except Refusal as refusal:
        _no_secret(refusal)
        assert (refusal.reason, refusal.code) in {(reasons.TOKEN_EXCHANGE_REFUSED, 401),
                                                  (reasons.TOKEN_EXCHANGE_MISCONFIGURED, 503),
                                                  (reasons.TOKEN_EXCHANGE_UNAVAILABLE, 503)}, refusal
        assert refusal.message and len(refusal.message) < 700
        if status == 200:
            assert refusal.reason == reasons.TOKEN_EXCHANGE_UNAVAILABLE
        return
    assert status == 200 and isinstance(body, dict) and token == body["access_token"]
    # One header value upstream (Authorization: Bearer <token>): visible ASCII, no space, no line end.
    assert token and token.isascii() and all(33 <= ord(c) < 127 for c in token)
    assert isinstance(expires_in, float) and expires_in == expires_in and abs(expires_in) != float("inf")
    given_in = body.get("expires_in")
    if type(given_in) in (int, float) and abs(given_in) < 1e300:
        assert expires_in == float(given_in)
    elif not isinstance(given_in, (int, float)) or isinstance(given_in, bool):
        assert expires_in == DEFAULT_EXPIRES_IN


@FUZZ
@given(_statuses.filter(lambda s: s != 200), dex_bodies())
def test_dex_refusals_follow_the_documented_table(status, body):
    refusal = dex_refusal(status, body, **NAMES)
    _no_secret(refusal)
    error = body.get("error") if isinstance(body, dict) else None
    described = body.get("error_description") if isinstance(body, dict) else None
    misconfigured = (error == "invalid_client"
                     or (error == "invalid_request" and isinstance(described, str) and "connector" in described.lower())
                     or (status >= 500 and error == "server_error"))
    want = (reasons.TOKEN_EXCHANGE_MISCONFIGURED if misconfigured else
            reasons.TOKEN_EXCHANGE_UNAVAILABLE if status >= 500 else reasons.TOKEN_EXCHANGE_REFUSED)
    assert refusal.reason == want and refusal.code == (401 if want == reasons.TOKEN_EXCHANGE_REFUSED else 503)
    assert str(status) in refusal.message
    if misconfigured and error == "invalid_client":
        assert NAMES["client_id"] in refusal.message
    if isinstance(error, str) and error:
        assert error[:64].strip() in refusal.message


def test_a_description_too_deep_to_print_is_not_quoted():
    # A description that json.loads just manages to read needs more recursion for its text than the parser had.
    deep = json.loads('{"error": "access_denied", "error_description": ' + "[" * 900 + "]" * 900 + "}")
    refusal = dex_refusal(401, deep, **NAMES)
    assert refusal.reason == reasons.TOKEN_EXCHANGE_REFUSED and "[" not in refusal.message


AUDIENCES = review_audiences(PEER)
_usernames = st.sampled_from(["system:serviceaccount:mod:controller", "system:serviceaccount:mod:writer",
                              "system:serviceaccount:mod:other", "kubernetes-admin", "", TOKEN]) | json_values
_answered = st.sampled_from([*AUDIENCES, audience(PEER.uuid, "closed"), audience("x", "read-pods"), "kubernetes"])


@st.composite
def review_bodies(draw) -> object:
    """A TokenReview as the API server answers one (the token echoed in spec), with each part kept, dropped or
    drawn from any JSON."""
    if draw(st.integers(0, 4)) == 0:
        return draw(json_values)
    status = {"authenticated": draw(st.sampled_from([True, False, "true", "false", 1, None]) | json_values),
              "user": draw(st.builds(lambda u: {"username": u, "groups": ["system:authenticated"]}, _usernames)
                           | json_values),
              "audiences": draw(st.lists(_answered | json_values, max_size=4) | json_values),
              "error": draw(st.sampled_from(["", "invalid bearer token"]))}
    status = {k: v for k, v in status.items() if draw(st.integers(0, 5))}
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": TOKEN, "audiences": list(AUDIENCES)}, "status": status}
    if draw(st.integers(0, 5)) == 0:
        body["status"] = draw(json_values)
    return body


REVIEW_REFUSALS = {(reasons.TOKEN_REVIEW_UNAVAILABLE, 503), (reasons.TOKEN_INVALID, 401),
                   (reasons.TOKEN_AUDIENCE_MISMATCH, 401), (reasons.NOT_A_CONSUMER, 403)}


@FUZZ
@given(st.sampled_from([200, 201]) | _statuses, review_bodies())
def test_a_review_grants_only_what_an_authenticated_answer_allows(status, body):
    try:
        granted = reviewed_capabilities(status, body, PEER, REGISTRY, AUDIENCES)
    except Refusal as refusal:
        assert (refusal.reason, refusal.code) in REVIEW_REFUSALS, refusal
        assert refusal.message and TOKEN not in refusal.message.replace(str(_username(body)), "")
        return
    result = body["status"]
    assert status in (200, 201) and result["authenticated"] is True
    answered = {AUDIENCES[a] for a in result["audiences"] if isinstance(a, str) and a in AUDIENCES}
    assert granted and granted <= answered & PEER.effective & CONSUMES.get(result["user"]["username"], set())


def _username(body: object) -> object:
    try:
        return body["status"]["user"]["username"]  # type: ignore[index]
    except (TypeError, KeyError):
        return None


@FUZZ
@given(review_bodies())
def test_a_failed_review_call_is_unavailable_whatever_the_body(body):
    for status in (401, 403, 404, 500, 503):
        try:
            reviewed_capabilities(status, body, PEER, REGISTRY, AUDIENCES)
        except Refusal as refusal:
            assert refusal.reason == reasons.TOKEN_REVIEW_UNAVAILABLE and str(status) in refusal.message
        else:
            raise AssertionError(f"a {status} answer granted something")


def test_only_a_boolean_true_authenticates():
    for authenticated in ("true", "false", 1, [True], {"a": 1}):
        body = {"status": {"authenticated": authenticated, "user": {"username": "system:serviceaccount:mod:controller"},
                           "audiences": list(AUDIENCES)}}
        try:
            reviewed_capabilities(201, body, PEER, REGISTRY, AUDIENCES)
        except Refusal as refusal:
            assert refusal.reason == reasons.TOKEN_INVALID
        else:
            raise AssertionError(f"authenticated: {authenticated!r} granted capabilities")
