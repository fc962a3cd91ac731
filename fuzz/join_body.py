"""control/rules/join.py's parse_join_request on any JSON body: a JoinRequest or a JoinError."""

from __future__ import annotations

import json

import atheris

with atheris.instrument_imports():
    from control.rules import join as join_rules

from fuzz.common import run
from fuzz.seeds import NOW


def test_one_input(data: bytes) -> None:
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        return  # the handler answers MalformedBody before the parser sees it
    try:
        join_rules.parse_join_request(body, now=NOW)
    except join_rules.JoinError as exc:
        if not exc.reason or not exc.message:
            raise AssertionError("a refusal without a reason or message") from None
        secret = _secret(body)
        if secret and secret in exc.message:
            raise AssertionError("a refusal quotes the token's secret") from None


def _secret(body) -> str | None:
    """The token's secret when it is long enough to tell and appears nowhere else in the body (a refusal may
    quote another field, into which the fuzzer may have copied it)."""
    token = body.get("token") if isinstance(body, dict) else None
    secret = token.partition(".")[2] if isinstance(token, str) else ""
    rest = json.dumps({k: v for k, v in body.items() if k != "token"}) if secret else ""
    return secret if len(secret) >= 8 and secret not in rest and json.dumps(secret)[1:-1] not in rest else None


def seeds():
    from fuzz.seeds import material

    yield material()["join_body"]


if __name__ == "__main__":
    run(test_one_input, seeds)
