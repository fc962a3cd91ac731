"""The offer message and the offer (control/rules/join.py parse_offer_message, control/rules/offer.py
validate_offer, own_keys_problem, peer_status) on any JSON body: an offer or its refusal."""

from __future__ import annotations

import json

import atheris

with atheris.instrument_imports():
    from control.rules import join as join_rules
    from control.rules import offer as offer_rules

from fuzz.common import run
from fuzz.seeds import NOW

OWN = {"issuer": {"jwks": '{"keys": []}'}}


def test_one_input(data: bytes) -> None:
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        return
    try:
        alias, offer = join_rules.parse_offer_message(body)
    except join_rules.JoinError:
        offer = body
    check = offer_rules.validate_offer(offer)
    offer_rules.own_keys_problem(offer, OWN)
    if check.ok:
        json.dumps(offer_rules.peer_status(offer, alias="a", cluster_uuid="u", endpoint="a:443", last_sync=NOW))
    elif check.reason not in ("OfferInvalid", "OfferTooLarge") or not check.message:
        raise AssertionError(f"a refusal with reason {check.reason!r}")


def seeds():
    from fuzz.seeds import material

    m = material()
    yield m["offer_message"]
    yield json.dumps(m["offer"]).encode()


if __name__ == "__main__":
    run(test_one_input, seeds)
