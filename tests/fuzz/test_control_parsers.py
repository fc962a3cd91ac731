"""What the control loop parses from the network, under arbitrary input: the connection string, the join body, the
offer message and the offer, and CSRs. Each answers its result or its own refusal (an InputError with a reason and
a message), never another exception, and never quotes a token's secret."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from contract.errors import InputError
from control import connstring, pki
from control.rules import join as join_rules
from control.rules import offer as offer_rules

from tests.fuzz.strategies import FUZZ, dumps, json_values

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
SECRET = "s3cr3t-s3cr3t-s3cr3t-s3cr3t"
CA = pki.create_ca("fuzz", now=NOW)
B_UUID = "3f0c2f4e-1d5b-4c9a-9b7e-2a6f0e1c3d4b"
CSR = pki.make_key_and_csr(B_UUID).cert_pem
GOOD_INVITATION = connstring.Invitation(
    cluster_uuid="9d1e5c3a-7b2f-4e6d-8a0c-5f3b1d7e9a2c", join_url="https://peering.a.example", entrance_host="peering-gateway.a.example:443",
    ca_pin=pki.spki_pin(CA.cert_pem), token_id="abc123", token_secret=SECRET, expires_at=NOW + timedelta(hours=1))


def _refusal(exc: InputError) -> None:
    assert exc.reason and isinstance(exc.reason, str) and exc.message and isinstance(exc.message, str)
    assert SECRET not in exc.message


def _mutate(text: str, data) -> str:
    """`text` with a few characters replaced, removed or inserted."""
    chars = list(text)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, max(len(chars) - 1, 0)))
        op = data.draw(st.sampled_from(["replace", "delete", "insert"]))
        c = data.draw(st.characters(max_codepoint=0x10FFFF))
        if op == "replace" and chars:
            chars[i] = c
        elif op == "delete" and chars:
            del chars[i]
        else:
            chars.insert(i, c)
    return "".join(chars)


def _payload_string(payload: dict, with_checksum: bool) -> str:
    if with_checksum:
        payload = dict(payload, k=connstring._checksum(payload))
    raw = json.dumps(payload, separators=(",", ":")).encode("utf-8", "surrogatepass")
    return "d8peer1." + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _decode(text) -> None:
    try:
        inv = connstring.decode(text, now=NOW, expected_cluster_uuid=None)
    except connstring.ConnectionStringError as exc:
        _refusal(exc)
    else:
        assert isinstance(inv, connstring.Invitation) and inv.expires_at > NOW


@FUZZ
@given(st.text(max_size=200) | st.text(max_size=100).map(lambda t: "d8peer1." + t))
def test_connection_string_any_text(text):
    _decode(text)


CONNSTRING_FIELDS = {"u": st.text(max_size=40), "j": st.text(max_size=40), "e": st.text(max_size=40),
                     "p": st.text(max_size=80), "t": st.text(max_size=60), "x": json_values,
                     "c": json_values | st.lists(st.text(max_size=30), max_size=3)}


@FUZZ
@given(st.data(), st.booleans())
def test_connection_string_with_a_valid_checksum_and_arbitrary_fields(data, with_checksum):
    good = json.loads(base64.urlsafe_b64decode(connstring.encode(GOOD_INVITATION)[8:] + "==="))
    good.pop("k")
    for key in data.draw(st.sets(st.sampled_from(sorted(CONNSTRING_FIELDS)), max_size=3)):
        good[key] = data.draw(CONNSTRING_FIELDS[key])
    _decode(_payload_string(good, with_checksum))


@FUZZ
@given(st.data())
def test_connection_string_mutated(data):
    _decode(_mutate(connstring.encode(GOOD_INVITATION), data))


def test_connection_string_round_trip():
    assert connstring.decode(connstring.encode(GOOD_INVITATION), now=NOW) == GOOD_INVITATION


def _good_join_body() -> dict:
    offer = offer_rules.build_offer(issuer_url="https://api.b.example", jwks="", projects={"p": ["p"]},
                                    capabilities=[], peering_version="0.1.0")
    return join_rules.join_request(GOOD_INVITATION, cluster_uuid=B_UUID, alias="b", entrance="b.example:443",
                                   ca_pem=CA.cert_pem, csr_pem=CSR, offer=offer)


JOIN_KEYS = ["token", "clusterUUID", "alias", "entrance", "caBundle", "csr", "offer", "extra"]


def _parse_join(body) -> None:
    try:
        request = join_rules.parse_join_request(body, now=NOW)
    except join_rules.JoinError as exc:
        _refusal(exc)
        assert exc.code in (400, 403, 409, 413)
    else:
        assert isinstance(request, join_rules.JoinRequest) and SECRET not in repr(request)


@FUZZ
@given(json_values)
def test_join_body_any_json(body):
    _parse_join(body)


@FUZZ
@given(st.data())
def test_join_body_with_some_fields_replaced(data):
    body = _good_join_body()
    for key in data.draw(st.sets(st.sampled_from(JOIN_KEYS), max_size=3)):
        body[key] = data.draw(json_values | st.sampled_from([CA.cert_pem, CSR, _mutate(CSR, data)]))
    _parse_join(body)


def test_join_body_good():
    assert join_rules.parse_join_request(_good_join_body(), now=NOW).alias == "b"


OFFER_KEYS = ["issuer", "projects", "capabilities", "peeringVersion"]


def _check_offer(offer) -> None:
    check = offer_rules.validate_offer(offer)
    assert isinstance(check, offer_rules.OfferCheck)
    assert check.ok or (check.reason in ("OfferInvalid", "OfferTooLarge") and check.message)
    offer_rules.own_keys_problem(offer, {"issuer": {"jwks": '{"keys": []}'}})
    if check.ok:
        status = offer_rules.peer_status(offer, alias="b", cluster_uuid="u", endpoint="b:443", last_sync=NOW)
        json.dumps(status)  # what the control loop writes into status.peer is JSON


offer_parts = {
    "issuer": json_values | st.fixed_dictionaries({"url": json_values, "jwks": json_values | st.text().map(dumps)}),
    "projects": json_values | st.lists(st.fixed_dictionaries({"name": json_values, "namespaces": json_values}),
                                       max_size=3),
    "capabilities": json_values | st.lists(st.fixed_dictionaries(
        {"name": json_values, "version": json_values, "scope": json_values}), max_size=3),
    "peeringVersion": json_values,
}


@FUZZ
@given(st.data())
def test_offer_message_and_offer(data):
    offer = {k: data.draw(v) for k, v in offer_parts.items() if data.draw(st.booleans())}
    body = data.draw(st.sampled_from(["message", "any"]))
    message = {"alias": data.draw(json_values), "offer": offer} if body == "message" else data.draw(json_values)
    try:
        alias, parsed = join_rules.parse_offer_message(message)
    except join_rules.JoinError as exc:
        _refusal(exc)
        parsed = offer
    _check_offer(parsed)


def _load_csr(text) -> None:
    try:
        csr = pki.load_csr(text)
    except pki.PKIError as exc:
        _refusal(exc)
        assert exc.reason in ("InvalidCSR", "UnsupportedKey")
    else:
        assert csr.is_signature_valid
        pki.public_key_fingerprint(text)


@FUZZ
@given(st.text(max_size=300) | st.binary(max_size=300))
def test_csr_any_text(text):
    _load_csr(text)


@FUZZ
@given(st.data())
def test_csr_mutated(data):
    _load_csr(_mutate(CSR, data))
    # A JSON body may carry lone surrogates; they reach the parser as they are.
    _load_csr(CSR[:40] + "\ud800" + CSR[40:])


def _load_certs(text) -> None:
    try:
        certs = pki.load_certs(text)
    except pki.PKIError as exc:
        _refusal(exc)
    else:
        assert certs


@FUZZ
@given(st.data())
def test_ca_bundle_mutated(data):
    _load_certs(_mutate(CA.cert_pem, data))


ANSWER_KEYS = ["clusterUUID", "alias", "entrance", "caBundle", "certificate", "csr", "offer"]


@FUZZ
@given(st.data())
def test_join_answer_with_some_fields_replaced(data):
    body = join_rules.join_answer(cluster_uuid=GOOD_INVITATION.cluster_uuid, alias="a", entrance="a.example:443",
                                  ca_pem=CA.cert_pem, certificate_pem=CA.cert_pem, csr_pem=CSR,
                                  offer={"projects": []})
    for key in data.draw(st.sets(st.sampled_from(ANSWER_KEYS), min_size=1, max_size=3)):
        body[key] = data.draw(json_values | st.sampled_from([CA.cert_pem, CSR, _mutate(CA.cert_pem, data)]))
    try:
        join_rules.check_join_answer(body, GOOD_INVITATION, own_uuid=B_UUID,
                                     own_key_fingerprint=pki.public_key_fingerprint(CSR), now=NOW)
    except join_rules.JoinError as exc:
        _refusal(exc)
