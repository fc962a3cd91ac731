"""The peer Secret's typed value: the keys docs/internals.md lists, read from the API's form and written back to it,
a key of no peer Secret refused by name, a private key never in its repr."""

from __future__ import annotations

import base64
import pathlib
import re

import pytest

from contract.peer_secret import KEYS, PeerCredentials

ROOT = pathlib.Path(__file__).resolve().parents[2]
FULL = PeerCredentials(peer_ca="ca-pem", client_key="key-pem", client_cert="cert-pem", issued="issued-pem",
                       peer_uuid="b-uuid", peer_entrance="peering-gateway.b.lab:443")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_the_keys_are_those_the_docs_list_for_the_peer_secret():
    row = next(line for line in (ROOT / "docs" / "internals.md").read_text().splitlines()
               if line.startswith("| `peer-<clusterpeer>`"))
    assert set(re.findall(r"`([a-z.-]+)`", row.split("|")[3])) == set(KEYS)


def test_a_secret_round_trips_through_its_data():
    data = FULL.to_data()
    assert set(data) == set(KEYS)
    assert PeerCredentials.from_secret({"data": data}) == FULL
    assert data["issued.crt"] == _b64("issued-pem") and data["peer-uuid"] == _b64("b-uuid")
    assert PeerCredentials.from_values(FULL.values()) == FULL


def test_empty_values_are_left_out_of_the_data():
    assert PeerCredentials(client_key="k").to_data() == {"client.key": _b64("k")}
    assert PeerCredentials().to_data() == {} and PeerCredentials().values() == {}


NOT_UTF8 = base64.b64encode(b"\xff").decode()


@pytest.mark.parametrize("secret", [None, {}, {"data": None}, {"data": "x"}, {"data": {"client.key": 7}},
                                    {"data": {"client.key": "!!!"}}, {"data": {"client.key": NOT_UTF8}}])
def test_an_absent_or_unreadable_secret_reads_as_empty(secret):
    assert PeerCredentials.from_secret(secret) == PeerCredentials()


def test_keys_of_no_peer_secret_are_ignored_when_read_and_refused_when_written():
    assert PeerCredentials.from_secret({"data": {"token": _b64("x"), "peer-uuid": _b64("u")}}) == \
        PeerCredentials(peer_uuid="u")
    with pytest.raises(ValueError, match="unknown keys for a peer Secret: token; a peer Secret holds peer-ca.crt"):
        PeerCredentials.from_values({"token": "x"})


def test_the_repr_names_the_keys_held_never_a_value():
    text = repr(FULL) + str(PeerCredentials(client_key="secret-key-pem"))
    assert "key-pem" not in text and "client.key" in text
    assert repr(PeerCredentials()) == "PeerCredentials(<empty>)"
