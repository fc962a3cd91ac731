"""control/connstring.py's decode: any text is an Invitation or a ConnectionStringError that never quotes the
token's secret."""

from __future__ import annotations

import atheris

with atheris.instrument_imports():
    from control import connstring

from fuzz.common import run, text_of
from fuzz.seeds import NOW


def test_one_input(data: bytes) -> None:
    text = text_of(data)
    if text is None:
        return  # not text: a connection string arrives as a JSON string
    try:
        inv = connstring.decode(text, now=NOW, expected_cluster_uuid=None)
    except connstring.ConnectionStringError as exc:
        if "s3cr3t" in exc.message or not exc.reason:
            raise AssertionError("a refusal quoted the secret or has no reason") from None
        return
    if connstring.decode(connstring.encode(inv), now=NOW) != inv:
        raise AssertionError("a decoded invitation does not survive encode and decode")


def seeds():
    from fuzz.seeds import material

    yield material()["connstring"].encode()


if __name__ == "__main__":
    run(test_one_input, seeds)
