"""gateway/exchange.py exchange_answer (and dex_refusal under it) on any answer of Dex's token endpoint: a status
and a body as the client reads it (JSON, or None). The answer is an exchanged token that is one header value with a
finite lifetime, or a Refusal of the documented reasons and codes that quotes nothing of the body but its error
and error_description."""

from __future__ import annotations

import json
import math

import atheris

with atheris.instrument_imports():
    from contract import reasons
    from contract.errors import Refusal
    from gateway.exchange import exchange_answer

from fuzz.common import answer_bytes, run, status_and_body

NAMES = {"client_id": "peering-gateway", "connector_id": "peering-peer-a", "audience": "kubernetes"}
REFUSALS = {(reasons.TOKEN_EXCHANGE_REFUSED, 401), (reasons.TOKEN_EXCHANGE_MISCONFIGURED, 503),
            (reasons.TOKEN_EXCHANGE_UNAVAILABLE, 503)}
SUBJECT = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6bW9kOmNvbnRyb2xsZXIifQ.c2lnbmF0dXJl"


def quoted(body: object) -> str:
    """What a refusal may quote of a body: its error and error_description strings."""
    if not isinstance(body, dict):
        return ""
    return " ".join(v for v in (body.get("error"), body.get("error_description")) if isinstance(v, str))


def test_one_input(data: bytes) -> None:
    status, body = status_and_body(data)
    try:
        token, expires_in = exchange_answer(status, body, **NAMES)
    except Refusal as refusal:
        if (refusal.reason, refusal.code) not in REFUSALS or not refusal.message or len(refusal.message) > 700:
            raise AssertionError(f"a refusal {refusal.code} {refusal.reason!r}") from None
        if SUBJECT in refusal.message and SUBJECT not in quoted(body):
            raise AssertionError("a refusal quotes the body's token") from None
        return
    if status != 200 or not token or not all(33 <= ord(c) < 127 for c in token) or not math.isfinite(expires_in):
        raise AssertionError(f"an exchanged token {token!r} for {expires_in} s from a {status}")


def seeds():
    yield answer_bytes(200, json.dumps({"access_token": SUBJECT, "token_type": "bearer", "expires_in": 300,
                                     "issued_token_type": "urn:ietf:params:oauth:token-type:id_token"}))
    for status, error, description in ((401, "invalid_client", "Invalid client credentials."),
                                       (400, "invalid_request", "Requested connector does not exist."),
                                       (500, "server_error", ""), (401, "access_denied", "subject token invalid")):
        yield answer_bytes(status, json.dumps({"error": error, "error_description": description,
                                               "subject_token": SUBJECT}))


if __name__ == "__main__":
    run(test_one_input, seeds)
