"""Project and namespace names in a peer's offer are DNS-1123 labels: an offer with one that is
not is refused with OfferInvalid naming the bad entry, and a pull of such an offer keeps the previous status.peer."""

from __future__ import annotations

import types
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.peer_secret import PeerCredentials
from control.peerclient import Answer
from control.reconcilers.clusterpeer.sync import Syncer
from control.reconcilers.memory import Memory, PeerMemory
from control.rules import offer as of

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def offer(projects: dict) -> dict:
    return of.build_offer(issuer_url="https://api.b.lab", jwks="", projects=projects, capabilities=[],
                          peering_version="0.1.0")


@pytest.mark.parametrize(
    "name",
    ["a", "0", "p1", "my-project", "a" * 61, "1-2-3", "x0"],
)
def test_valid_project_names_pass(name):
    assert of.validate_offer(offer({name: [name]})).ok


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("Prod", "'Prod'"),
        ("-prod", "'-prod'"),
        ("prod-", "'prod-'"),
        ("prod.example", "'prod.example'"),
        ("prod_1", "'prod_1'"),
        ("a" * 62, "'" + "a" * 62 + "'"),
        ("../etc", "'../etc'"),
        ("prod\n", "'prod\\n'"),
        ("пр", "'пр'"),
        ("a b", "'a b'"),
        ("x" * 200, "'" + "x" * 70 + "...'"),
    ],
)
def test_an_invalid_project_name_is_refused_naming_it(name, shown):
    check = of.validate_offer(offer({name: []}))
    assert (check.ok, check.reason) == (False, "OfferInvalid")
    assert f"project {shown} is not a valid project name" in check.message
    assert "at most 61 characters" in check.message and "the previous offer is kept" in check.message


@pytest.mark.parametrize("ns", ["Kube-System", "ns.with.dots", "ns_", "-a", "a" * 64, "a\x00", "a/b", "*"])
def test_an_invalid_namespace_name_is_refused_naming_it_and_its_project(ns):
    check = of.validate_offer(offer({"good": ["good", ns]}))
    assert (check.ok, check.reason) == (False, "OfferInvalid")
    assert f"namespace {of._shown(ns)} is not a valid namespace name" in check.message
    assert "(in project good)" in check.message and "at most 63 characters" in check.message


def test_a_namespace_of_63_characters_passes_and_one_of_64_does_not():
    assert of.validate_offer(offer({"p": ["a" * 63]})).ok
    assert not of.validate_offer(offer({"p": ["a" * 64]})).ok


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.text(max_size=70))
def test_a_name_passes_exactly_when_it_is_a_dns_label(name):
    label = (0 < len(name) <= 63 and name[0] in "abcdefghijklmnopqrstuvwxyz0123456789"
             and name[-1] in "abcdefghijklmnopqrstuvwxyz0123456789"
             and all(c in "abcdefghijklmnopqrstuvwxyz0123456789-" for c in name))
    assert of.validate_offer(offer({"p": [name]})).ok is label
    assert of.validate_offer(offer({name: []})).ok is (label and len(name) <= 61)


class _Clock:
    def now(self):
        return NOW

    def monotonic(self) -> float:
        return 1000.0


class _Peer:
    """The peer's entrance as the control loop's client sees it: it answers the offer message given."""

    def __init__(self, body) -> None:
        self.body = body
        self.calls: list[str] = []

    async def call(self, entrance, op, **_):
        self.calls.append(op)
        return Answer(200, self.body)


async def test_a_pulled_offer_with_a_bad_name_keeps_the_previous_status_peer():
    previous = of.peer_status(offer({"shared": ["shared"]}), alias="b", cluster_uuid="u-b", endpoint="b:443",
                              last_sync=NOW)
    bad = offer({"shared": ["shared", "Not_A_Label"]})
    peer = _Peer({"alias": "b", "offer": bad})
    syncer = Syncer(kube=None, client=peer, memory=Memory(clock=_Clock()), clock=_Clock(), namespace="d8-peering")
    obs = types.SimpleNamespace(offer={}, now=NOW, key="to-b")
    mem = PeerMemory()
    kept, mem = await syncer._pull(obs, mem, PeerCredentials(peer_entrance="b:443"), previous)
    assert peer.calls == ["offer"]
    assert kept is previous
    reason, message = mem.sync_error
    assert reason == "OfferInvalid" and "'Not_A_Label'" in message and "(in project shared)" in message
    # The same peer with the name fixed: the pull succeeds and the error is gone.
    peer.body = {"alias": "b", "offer": offer({"shared": ["shared", "not-a-label"]})}
    fresh, mem = await syncer._pull(obs, mem, PeerCredentials(peer_entrance="b:443"), previous)
    assert mem.sync_error is None and fresh["projects"] == [{"name": "shared", "namespaces": ["not-a-label", "shared"]}]
