"""gateway/tokenreview.py reviewed_capabilities on any answer of the API server to a TokenReview: a status and a
body as the client reads it. The answer is capabilities that an authenticated answer's audiences, the peer's
effective capabilities and the consumers all allow, or a Refusal of the documented reasons and codes that never
quotes the token the answer echoes."""

from __future__ import annotations

import json

import atheris

with atheris.instrument_imports():
    from contract import reasons
    from contract.errors import Refusal
    from gateway.tokenreview import review_audiences, reviewed_capabilities

from fuzz.common import answer_bytes, run, status_and_body
from fuzz.seeds import peer_material

REFUSALS = {(reasons.TOKEN_REVIEW_UNAVAILABLE, 503), (reasons.TOKEN_INVALID, 401),
            (reasons.TOKEN_AUDIENCE_MISMATCH, 401), (reasons.NOT_A_CONSUMER, 403)}
CONSUMES = {"system:serviceaccount:mod:controller": {"read-pods"}, "system:serviceaccount:mod:writer": {"write"}}
TOKEN = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6bW9kOmNvbnRyb2xsZXIifQ.c2lnbmF0dXJl"


def _get(value: object, *keys: str) -> object:
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def test_one_input(data: bytes) -> None:
    m = peer_material()
    peer = m["peer"]
    audiences = review_audiences(peer)
    status, body = status_and_body(data)
    try:
        granted = reviewed_capabilities(status, body, peer, m["registry"], audiences)
    except Refusal as refusal:
        if (refusal.reason, refusal.code) not in REFUSALS or not refusal.message:
            raise AssertionError(f"a refusal {refusal.code} {refusal.reason!r}") from None
        username = _get(body, "status", "user", "username")
        if TOKEN in refusal.message and not (isinstance(username, str) and TOKEN in username):
            raise AssertionError("a refusal quotes the token") from None
        return
    answered = _get(body, "status", "audiences")
    named = {audiences[a] for a in answered if isinstance(a, str) and a in audiences} if isinstance(answered, list) \
        else set()
    username = _get(body, "status", "user", "username")
    consumed = CONSUMES.get(username, set()) if isinstance(username, str) else set()
    if (status not in (200, 201) or _get(body, "status", "authenticated") is not True or not granted
            or not granted <= named & peer.effective & consumed):
        raise AssertionError(f"a review granted {sorted(granted)} against the rules")


def seeds():
    audiences = list(review_audiences(peer_material()["peer"]))
    for username, status in (("system:serviceaccount:mod:controller", 201), ("system:serviceaccount:mod:writer", 200),
                             ("system:serviceaccount:kube-system:default", 201)):
        yield answer_bytes(status, json.dumps({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": TOKEN, "audiences": audiences},
            "status": {"authenticated": True, "audiences": audiences,
                       "user": {"username": username, "uid": "u", "groups": ["system:authenticated"]}}}))
    yield answer_bytes(201, json.dumps({"status": {"authenticated": False, "error": "invalid bearer token"}}))
    yield answer_bytes(403, json.dumps({"kind": "Status", "reason": "Forbidden", "code": 403}))


if __name__ == "__main__":
    run(test_one_input, seeds)
