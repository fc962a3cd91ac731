"""`kubectl describe clusterpeer` tells the story of the administrator's guide: the guide's steps (the ones
`make demo` shows) are run on two lab clusters, and the Events each object's describe lists are read at the
moments the story has told: the invitation issued, the join, the token exchange ready, the capability effective,
the project paired, the peer unreachable and back, the peering revoked by the peer, the module re-enabled. Each
Event has the reason word of the condition that changed, and none carries a connection string or a token."""

from __future__ import annotations

import re

import pytest

from guide_helpers import needs_peering

pytestmark = [pytest.mark.slow, needs_peering, pytest.mark.timeout(240)]

CONTROLLER = "peering.deckhouse.io/controller"


def events(kubectl, *args: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events `kubectl describe` lists, oldest first."""
    done = kubectl.run("describe", *args)
    assert done.returncode == 0, done.stderr
    # The admin's describe shows the status too (the connection string in clear): only the Events are judged.
    section = done.stdout.split("\nEvents:", 1)[1]
    assert "d8peer1." not in section and not re.search(r"eyJ[\w-]{10,}\.", section), "a secret in the Events"
    table = section.splitlines()
    rows = []
    for row in table[3:]:
        if not row.strip():
            break
        kind, reason, _age, source, message = re.split(r"\s{2,}", row.strip(), maxsplit=4)
        assert source == CONTROLLER, row
        rows.append((kind, reason, message))
    return rows


def in_order(rows: list[tuple[str, str, str]], *wanted: tuple[str, str]) -> None:
    """Each wanted (type, reason) appears, in this order (others may come between)."""
    got = [(kind, reason) for kind, reason, _ in rows]
    at = 0
    for want in wanted:
        assert want in got[at:], f"{want} not after {got[:at]} in {got}"
        at = got.index(want, at) + 1


def test_kubectl_describe_tells_the_story_of_the_guide(guide_story):
    s = guide_story
    s.step0_enable()
    s.step1_invite()
    s.step2_join()
    s.step3_capability()
    s.step4_projects()
    s.step5_consumer()
    s.step6_sensitive()
    s.step7_outage()
    uuid_a, uuid_b = s.uuid["a"], s.uuid["b"]

    # a: the invitation, the join of b, the token exchange, the capability, the project.
    rows = events(s.a, "clusterpeer", "cluster-b")
    in_order(rows, ("Normal", "InvitePending"), ("Normal", "PeeringReady"), ("Normal", "EffectiveCapabilities"),
             ("Normal", "Paired"))
    assert ("Normal", "ProviderReady") in [(k, r) for k, r, _ in rows]
    issued = next(m for k, r, m in rows if r == "InvitePending")
    assert issued.startswith("a connection string was issued: token ID ") and "secure channel" in issued
    joined = next(m for k, r, m in rows if r == "PeeringReady")
    assert joined.startswith(f"the peering with cluster {uuid_b} (cluster-a) is established")
    assert "mirror-configmaps (before: none)" in next(m for k, r, m in rows if r == "EffectiveCapabilities")

    # b: joined, then a went away and came back.
    rows = events(s.b, "clusterpeer", "cluster-a")
    in_order(rows, ("Normal", "PeeringReady"), ("Normal", "EffectiveCapabilities"), ("Normal", "Paired"),
             ("Warning", "PeerUnreachable"), ("Normal", "PeeringReady"))
    # The phase went Active (maybe while its certificate for a was still being delivered): that Event says who.
    assert any(m.startswith(f"the peering with cluster {uuid_a} (cluster-b) is established") for _, _, m in rows)
    back = [m for k, r, m in rows if r == "PeeringReady"][-1]
    assert re.search(r"the peering works again, after PeerUnreachable for \d+", back), back
    # The pair in the project says the same, and the capability was accepted on both.
    in_order(events(s.b, "-n", "shop", "projectpeer", "cluster-a"), ("Normal", "Paired"),
             ("Warning", "PeerUnreachable"), ("Normal", "Paired"))
    for k in (s.a, s.b):
        in_order(events(k, "peeringcapability", "mirror-configmaps"), ("Normal", "Accepted"))

    # a revokes; b is told by the refusal; then b's module is disabled and enabled again.
    s.step8_revoke()
    s.step9_reenable()
    rows = events(s.b, "clusterpeer", "cluster-a")
    in_order(rows, ("Normal", "PeeringReady"), ("Warning", "PeerUnreachable"), ("Normal", "PeeringReady"),
             ("Warning", "PeerRefusedCertificate"), ("Warning", "CredentialsFromOtherCA"))
    assert "revoked" in next(m for k, r, m in rows if r == "PeerRefusedCertificate")

    # The peering established anew is a new object with a story of its own.
    s.step9_anew()
    rows = events(s.b, "clusterpeer", "cluster-a")
    assert ("Warning", "CredentialsFromOtherCA") not in [(k, r) for k, r, _ in rows]
    in_order(rows, ("Normal", "PeeringReady"))
