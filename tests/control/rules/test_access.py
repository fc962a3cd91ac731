"""status.access: the egress endpoint, the CA and the audiences consumers request."""

from __future__ import annotations

from control.rules.access import audience, desired_access


def test_desired_access():
    got = desired_access("cluster-a", "a-uuid", "PEM", ["storage", "dns", "storage"])
    assert got == {
        "endpoint": "https://peering-gateway.d8-peering.svc/peers/cluster-a",
        "caBundle": "PEM",
        "audiences": [
            {"capability": "dns", "audience": "peering.deckhouse.io/a-uuid/dns"},
            {"capability": "storage", "audience": "peering.deckhouse.io/a-uuid/storage"},
        ],
    }


def test_no_effective_capabilities_no_audiences():
    assert desired_access("x", "u", "PEM", [])["audiences"] == []
    assert audience("u", "c") == "peering.deckhouse.io/u/c"


def test_only_what_the_egress_serves_is_announced():
    # The registry published here serves dns only (storage was just made effective): storage's audience waits.
    got = desired_access("x", "u", "PEM", ["storage", "dns"], served=frozenset({"dns"}))
    assert [a["capability"] for a in got["audiences"]] == ["dns"]
    # No longer effective: gone at once, whatever the registry still serves.
    assert desired_access("x", "u", "PEM", [], served={"dns"})["audiences"] == []
    # No gateway in the process: nothing is held back.
    assert len(desired_access("x", "u", "PEM", ["storage", "dns"], served=None)["audiences"]) == 2
