"""The connection string: round trip, every refusal reason, and no secret in any message."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control import connstring, pki
from control.connstring import ConnectionStringError, Invitation

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
SECRET = "S3cr3t_s3cr3t-S3cr3t_s3cr3t-0123456789ab"
CA = pki.create_ca("a", now=NOW)


def _inv(**over) -> Invitation:
    base = Invitation(
        cluster_uuid="6f0b8c7e-3f52-4c1e-9a51-3d2f0f6c1a10",
        join_url="https://peering.a.lab",
        entrance_host="peering-gateway.a.lab",
        ca_pin=pki.spki_pin(CA.cert_pem),
        token_id="abc123",
        token_secret=SECRET,
        expires_at=NOW + timedelta(hours=1),
    )
    return replace(base, **over)


def _payload(text: str) -> dict:
    body = text.split(".", 1)[1]
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))


def _reencode(payload: dict, *, fix_checksum: bool = True, prefix: str = "d8peer1.") -> str:
    if fix_checksum:
        payload["k"] = connstring._checksum(payload)
    return prefix + base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()


def test_round_trip():
    inv = _inv()
    text = connstring.encode(inv)
    assert text.startswith("d8peer1.") and len(text) <= 4096
    assert connstring.decode(text, now=NOW) == inv
    assert connstring.decode("  " + text + "\n", now=NOW) == inv  # pasted with whitespace
    assert SECRET not in repr(inv)
    assert inv.token == f"abc123.{SECRET}"


def test_round_trip_with_join_ca():
    join_ca = pki.create_ca("ingress", now=NOW).cert_pem
    inv = _inv(join_ca_pem=join_ca)
    got = connstring.decode(connstring.encode(inv), now=NOW)
    assert pki.fingerprint(got.join_ca_pem) == pki.fingerprint(join_ca)
    assert pki.load_certs(got.join_ca_pem)[0] == pki.load_certs(join_ca)[0]


def test_rsa_join_ca_chain_still_fits():
    import trustme

    ca = trustme.CA()  # RSA 2048 root, the common case of a private ingress CA
    text = connstring.encode(_inv(join_ca_pem=ca.cert_pem.bytes().decode()))
    assert len(text) <= 4096


def test_encode_refuses_oversized_bundle():
    bundle = "".join(pki.create_ca(f"x{i}", now=NOW).cert_pem for i in range(6))
    with pytest.raises(ValueError, match="over the limit of 4096"):
        connstring.encode(_inv(join_ca_pem=bundle))


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"join_url": "http://peering.a.lab"}, "https"),
        ({"join_url": "https://peering.a.lab/v1/join"}, "no path"),
        ({"entrance_host": "peering-gateway.a.lab/x"}, "host"),
        ({"ca_pin": "sha1:abc"}, "pin"),
        ({"token_id": "ABCDEFGHIJKLMNOPQ"}, "token ID"),
        ({"token_secret": "short"}, "128 bits"),
        ({"cluster_uuid": ""}, "UUID"),
        ({"expires_at": datetime(2026, 12, 1)}, "timezone"),
    ],
)
def test_encode_refuses_bad_fields(over, match):
    with pytest.raises(ValueError, match=match):
        connstring.encode(_inv(**over))


def _reason(text: str, **kw) -> ConnectionStringError:
    with pytest.raises(ConnectionStringError) as err:
        connstring.decode(text, now=kw.pop("now", NOW), **kw)
    assert SECRET not in err.value.message and SECRET not in str(err.value)
    return err.value


GOOD = connstring.encode(_inv())


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "Malformed"),
        ("hello", "Malformed"),
        ("<omitted>", "Malformed"),
        ("d8peer1.", "Malformed"),
        ("d8peer1.!!!!", "Malformed"),
        ("d8peer1." + base64.urlsafe_b64encode(b"not json").decode(), "Malformed"),
        ("d8peer1." + base64.urlsafe_b64encode(b"[1,2]").decode(), "Malformed"),
        (GOOD[:-10], "Malformed"),  # truncated
        (GOOD[:200], "Malformed"),
        ("d8peer2." + GOOD[8:], "UnsupportedVersion"),
        ("d8peer17.abc", "UnsupportedVersion"),
        (GOOD + "A" * 4096, "TooLong"),
    ],
)
def test_decode_refusals(text, reason):
    assert _reason(text).reason == reason


def test_missing_field():
    payload = _payload(GOOD)
    del payload["e"]
    err = _reason(_reencode(payload))
    assert err.reason == "Malformed" and "missing fields e" in err.message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("x", "tomorrow"),
        ("x", True),
        ("x", 10**20),
        ("u", 5),
        ("t", "no-dot-here"),
        ("t", "abc." + "x" * 5),
        ("j", "https://evil.example/steal"),
        ("p", "sha256:" + "Z" * 64),
        ("c", "not a list"),
        ("c", ["%%%"]),
    ],
)
def test_bad_field_values(key, value):
    payload = _payload(GOOD)
    payload[key] = value
    assert _reason(_reencode(payload)).reason == "Malformed"


def test_tampering_without_checksum_is_malformed():
    payload = _payload(GOOD)
    payload["j"] = "https://peering.evil.example"
    err = _reason(_reencode(payload, fix_checksum=False))
    assert err.reason == "Malformed" and "checksum" in err.message


def test_tampered_pin_with_recomputed_checksum_fails_at_the_pin():
    """A deliberate change decodes, and is caught by the pin once the join answer brings the real CA."""
    payload = _payload(GOOD)
    payload["p"] = pki.spki_pin(pki.create_ca("attacker", now=NOW).cert_pem)
    inv = connstring.decode(_reencode(payload), now=NOW)
    assert not pki.verify_pin(CA.cert_pem, inv.ca_pin)


def test_expired():
    err = _reason(GOOD, now=NOW + timedelta(hours=1))
    assert err.reason == "Expired" and "new connection string" in err.message
    assert connstring.decode(GOOD, now=NOW + timedelta(minutes=59, seconds=59)).token_id == "abc123"


def test_cluster_not_expected_is_checked_before_use():
    err = _reason(GOOD, expected_cluster_uuid="00000000-0000-0000-0000-000000000000")
    assert err.reason == "ClusterNotExpected" and "not sent" in err.message
    assert connstring.decode(GOOD, now=NOW, expected_cluster_uuid=_inv().cluster_uuid).cluster_uuid


def test_expiry_outranks_expectation():
    # Both wrong: Expired is reported, because a new string is needed in any case.
    assert _reason(GOOD, now=NOW + timedelta(days=1), expected_cluster_uuid="other").reason == "Expired"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=600))
def test_arbitrary_text_never_crashes(text):
    try:
        connstring.decode(text, now=NOW)
    except ConnectionStringError as err:
        assert err.reason in {"Malformed", "UnsupportedVersion", "TooLong", "Expired", "ClusterNotExpected"}


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=8, max_value=len(GOOD) - 1), st.integers(min_value=0, max_value=255))
def test_any_single_change_is_detected(pos, byte):
    """Any one changed or removed character either fails decoding or yields different content."""
    changed = GOOD[:pos] + chr(byte) + GOOD[pos + 1 :]
    try:
        got = connstring.decode(changed, now=NOW)
    except ConnectionStringError as err:
        assert err.reason in {"Malformed", "TooLong"}
    else:
        # Only encodings of the same bytes survive (e.g. the unused low bits of the last base64 character).
        assert got == _inv()
