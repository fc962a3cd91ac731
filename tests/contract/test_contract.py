"""The contract both packages share: its reasons are documented with their codes, its names are the ones the
gateway and the control loop compute, and nothing else spells them again."""

from __future__ import annotations

import pathlib
import re

import pytest

from contract import names, paths, reasons
from contract.errors import InputError, Refusal

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs" / "protocol.md").read_text() + (ROOT / "gateway" / "README.md").read_text()
ALL = {value for key, value in vars(reasons).items() if key.isupper() and isinstance(value, str)}


def _rows(reason: str) -> list[str]:
    return [line for line in DOCS.splitlines()
            if line.startswith("|") and re.search(rf"(?<![A-Za-z`]){reason}(?![A-Za-z`])|`{reason}`", line)]


@pytest.mark.parametrize("reason", sorted(ALL))
def test_every_reason_is_documented_in_a_table_with_its_code(reason):
    code = reasons.JOIN_CODES.get(reason, reasons.CODES[reason])
    rows = _rows(reason)
    assert rows, f"{reason} is in contract/reasons.py but in no table of docs/protocol.md or gateway/README.md"
    assert any(re.search(rf"(?<!\d){code}(?!\d)", row) for row in rows), \
        f"{reason} is documented, but not with its code {code}: {rows}"


def test_every_reason_has_a_code_and_join_refusals_hide_the_token():
    assert ALL == set(reasons.CODES)
    assert reasons.JOIN_CODES[reasons.TOKEN_INVALID] == reasons.JOIN_CODES[reasons.TOKEN_EXPIRED] == 403


def test_input_errors_are_refusals_with_the_code_of_their_reason():
    from control.rules.join import JoinError
    from control.pki import PKIError

    err = JoinError(reasons.TOKEN_USED, "used")
    assert isinstance(err, Refusal) and isinstance(err, ValueError) and (err.code, err.reason) == (409, "TokenUsed")
    assert JoinError(reasons.TOKEN_EXPIRED, "x").code == 403  # a join hides why the token failed
    assert InputError(reasons.TOKEN_EXPIRED, "x").code == 401
    assert PKIError("SomethingElse", "x").code == 400


def test_names_of_one_peering_stay_valid_and_distinct_for_the_longest_names():
    a, b = "a" * 253, "a" * 252 + "b"
    for fn in (names.peer_secret_name, names.provider_name):
        assert len(fn(a)) <= 253 and fn(a) != fn(b)
    assert names.audience("u", "c") == "peering.deckhouse.io/u/c"
    assert names.consumer_username("u", "ns", "sa") == "peering:u:system:serviceaccount:ns:sa"
    assert names.dex_client_id() == "dex-client-peering@d8-peering"
    assert names.dex_client_secret_name() == "dex-client-peering"
    assert paths.peer_op_path("offer") == "/peering/v1/offer"
    with pytest.raises(ValueError):
        paths.peer_op_path("../join")


SPELLINGS = {
    # What the contract owns, and how it would look spelled again elsewhere.
    '"peer-"': "PEER_SECRET_PREFIX", '"peering-"': "PROVIDER_PREFIX", '"peering.deckhouse.io/"': "AUDIENCE_PREFIX",
    '"/peering/v1/"': "PEER_PREFIX", '"/v1/join"': "JOIN_PATH", '"system:serviceaccount:"': "SA_PREFIX",
    '"app.kubernetes.io/managed-by"': "MANAGED_BY", '"peering-ca"': "CA_SECRET",
}


def test_the_contract_is_spelled_once_in_the_product_code():
    found = []
    for path in [*ROOT.glob("gateway/**/*.py"), *ROOT.glob("control/**/*.py")]:
        text = path.read_text()
        for literal, name in SPELLINGS.items():
            if literal in text:
                found.append(f"{path.relative_to(ROOT)}: {literal} (use contract.names/paths {name})")
        for reason in ALL:
            for m in re.finditer(rf'"{reason}"', text):
                found.append(f"{path.relative_to(ROOT)}: \"{reason}\" (use contract.reasons)")
    assert found == []
