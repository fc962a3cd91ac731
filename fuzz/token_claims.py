"""The claims read from a token without verifying it: gateway/catchup.py claims_of, _audiences and the catch-up's
decisions on them, gateway/tokens.py unverified_claims and claims_expiry. On any token text, or any payload in a
compact token, each answers a dict, strings, a finite number or a boolean, never an exception, and the catch-up
reads what the egress reads."""

from __future__ import annotations

import base64
import json
import math

import atheris

with atheris.instrument_imports():
    from contract import reasons
    from contract.errors import Refusal
    from gateway import catchup
    from gateway.tokens import claims_expiry, unverified_claims

from fuzz.common import run
from fuzz.seeds import peer_material

LIFT = Refusal(401, reasons.TOKEN_AUDIENCE_MISMATCH, "refused")
COMING = Refusal(503, reasons.PEER_NOT_CONNECTED, "refused")


def _refuse_constant(name: str) -> None:
    raise ValueError(name)


def check(token: str, payload: bytes | None) -> None:
    m = peer_material()
    claims = unverified_claims(token)
    if claims is not None and not isinstance(claims, dict):
        raise AssertionError(f"claims of type {type(claims).__name__}")
    if catchup.claims_of(token) != (claims or {}):
        raise AssertionError("the catch-up reads other claims than the egress")
    if payload is not None:
        try:
            value = json.loads(payload, parse_constant=_refuse_constant)
        except (ValueError, RecursionError):
            value = None
        if (value if isinstance(value, dict) else None) != claims:
            raise AssertionError("the claims of a compact token are not its payload")
    exp = claims_expiry(claims or {})
    if exp is not None and not math.isfinite(exp):
        raise AssertionError(f"an expiry of {exp}")
    if not all(isinstance(a, str) for a in catchup._audiences(claims or {})):
        raise AssertionError("an audience that is no string")
    fields = [(b"Authorization", b"Bearer " + token.encode("utf-8", "surrogatepass"))]
    for answer in (catchup.entrance_may_lift(m["registry"], m["peer"], LIFT, token),
                   catchup.egress_behind(m["registry"], m["peer"], token),
                   catchup.egress_peer_may_come(m["registry"], COMING, b"/peers/peer-a/api", fields, 16 * 1024)):
        if answer not in (True, False):
            raise AssertionError(f"a decision {answer!r}")


def test_one_input(data: bytes) -> None:
    if data[:1] == b"\x00":  # any payload in a compact token
        payload = data[1:]
        check("e30." + base64.urlsafe_b64encode(payload).rstrip(b"=").decode() + ".c2ln", payload)
    else:
        check(data.decode("latin-1"), None)


def seeds():
    from fuzz.seeds import CLUSTER, PEER_UUID, peer_claims, peer_token

    yield peer_token().encode()
    yield b"\x00" + json.dumps(peer_claims(aud=[f"peering.deckhouse.io/{CLUSTER}/closed"])).encode()
    yield b"\x00" + json.dumps(peer_claims(aud=f"peering.deckhouse.io/{PEER_UUID}/closed", exp=1e308)).encode()


if __name__ == "__main__":
    run(test_one_input, seeds)
