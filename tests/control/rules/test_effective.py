"""Effective capabilities: the four conditions of DESIGN.md §6, each failing alone."""

from __future__ import annotations

import pytest

from control.rules import capabilities as caps
from control.rules.effective import effective_capabilities, offered_capabilities


def _local(name: str, version: str = "v1", accepted: bool = True, scope=("project",)) -> caps.ValidatedCapability:
    verdict = caps.Verdict("True", "Accepted", "") if accepted else caps.Verdict("False", "Wildcard", "stars")
    return caps.ValidatedCapability(name, version, verdict, scope if accepted else (), (("ns", "sa"),))


LOCAL = {
    "storage": _local("storage"),
    "dns": _local("dns", scope=("cluster",)),
    "old": _local("old", version="v1"),
    "bad": _local("bad", accepted=False),
    "unopened": _local("unopened"),
}
PEER = [
    {"name": "storage", "version": "v1", "scope": ["project"]},
    {"name": "dns", "version": "v1", "scope": ["cluster", "bogus"]},
    {"name": "old", "version": "v2", "scope": ["project"]},
    {"name": "bad", "version": "v1", "scope": ["project"]},
    {"name": "unopened", "version": "v1", "scope": ["project"]},
    {"name": "peer-only", "version": "v1", "scope": ["project"]},
    "garbage",
]


def test_effective_and_why_not():
    r = effective_capabilities(["storage", "dns", "old", "bad", "missing", "peer-only", "storage"], PEER, LOCAL)
    assert r.names == ["dns", "storage"]
    assert r.get("dns").scope == ("cluster",) and r.get("dns").peer_scope == ("cluster",)
    assert r.get("storage").version == "v1" and r.get("nope") is None
    assert set(r.not_effective) == {"old", "bad", "missing", "peer-only"}
    assert "v1 here, v2 at the peer" in r.not_effective["old"]
    assert "Wildcard" in r.not_effective["bad"]
    assert "no PeeringCapability" in r.not_effective["missing"]
    assert "no PeeringCapability" in r.not_effective["peer-only"]
    assert r.summary().startswith("bad: ")


@pytest.mark.parametrize(
    ("opened", "peer", "why"),
    [
        (["storage"], None, "has not arrived"),
        (["storage"], [], "has not opened it"),
        (["storage"], [{"name": "storage"}], "versions differ"),
    ],
)
def test_peer_side_missing(opened, peer, why):
    r = effective_capabilities(opened, peer, LOCAL)
    assert r.names == [] and why in r.not_effective["storage"]


def test_nothing_opened():
    r = effective_capabilities(None, PEER, LOCAL)
    assert r.names == [] and r.not_effective == {} and r.summary() == ""


def test_offered_capabilities():
    assert offered_capabilities(["storage", "bad", "missing", "dns"], LOCAL) == [
        {"name": "dns", "version": "v1", "scope": ["cluster"]},
        {"name": "storage", "version": "v1", "scope": ["project"]},
    ]
