"""control/rules/join.py's parse_join_request on any JSON body: a JoinRequest or a JoinError."""

from __future__ import annotations

import json

import atheris

with atheris.instrument_imports():
    from control.rules import join as join_rules

from fuzz.common import run


def test_one_input(data: bytes) -> None:
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        return  # the handler answers MalformedBody before the parser sees it
    try:
        join_rules.parse_join_request(body)
    except join_rules.JoinError as exc:
        if not exc.reason or not exc.message or "s3cr3t" in exc.message:
            raise AssertionError("a refusal without a reason or message, or quoting the token") from None


def seeds():
    from fuzz.seeds import material

    yield material()["join_body"]


if __name__ == "__main__":
    run(test_one_input, seeds)
