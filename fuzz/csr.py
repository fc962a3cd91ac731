"""control/pki.py on any PEM text: load_csr, load_certs, the public key's fingerprint and the pin answer their
result or a PKIError."""

from __future__ import annotations

import atheris

with atheris.instrument_imports():
    from control import pki

from fuzz.common import run, text_of

PIN = "sha256:" + "0" * 64


def test_one_input(data: bytes) -> None:
    text = text_of(data)
    if text is None:
        return  # a PEM field arrives as a JSON string
    for parse in (pki.load_csr, pki.load_certs, pki.public_key_fingerprint):
        try:
            parse(text)
        except pki.PKIError:
            pass
    pki.verify_pin(text, PIN)
    pki.issued_by(text, text)


def seeds():
    from fuzz.seeds import material

    m = material()
    yield m["csr"].encode()
    yield m["ca"].cert_pem.encode()


if __name__ == "__main__":
    run(test_one_input, seeds)
