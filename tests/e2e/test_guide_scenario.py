"""The administrator's guide (spec 001), end to end on two lab clusters, through kubectl only.

One test, the guide's steps in its order, each step checking what the guide promises; they are the steps
`make demo` shows (lab/demo/story.py), so the demo and this test prove one code path. A step that does not end as the
guide says fails with the kubectl command, what was expected and what came back; the output of the steps so far
is the test's captured output.

Throughout, every Warning Event and every Ready=False (or PeerUnreachable pair) after a good state must be one that
a step caused (transitions.py): a healthy join, a capability opened, a project paired, a consumer's calls, a
restart of the other side's process raise none.
"""

from __future__ import annotations

import pytest

from guide_helpers import needs_peering

pytestmark = [pytest.mark.slow, needs_peering, pytest.mark.timeout(180)]


def test_the_guide_on_two_clusters(guide_story, transitions):
    s, seen = guide_story, transitions
    # Enabling the module: its ModuleConfig, then PHASE Ready.
    s.step0_enable()
    # Creating an invitation, connecting: Active and Ready on both sides.
    s.step1_invite()
    s.step2_join()
    # Opening capabilities: Accepted on both, opened on both, EFFECTIVE on both.
    s.step3_capability()
    # Paired projects.
    s.step4_projects()
    # A consumer on b reads and watches across egress and entrance; everything else is refused.
    s.step5_consumer()
    # The connection string is a sensitive field.
    s.step6_sensitive()
    seen.assert_explained("the guide's steps without a fault")
    # Temporary unavailability does not revoke: b sees a unreachable (and says so), a comes back clean.
    s.step7_outage()
    seen.caused("b", "ClusterPeer", "cluster-a", "PeerUnreachable")
    seen.caused("b", "ProjectPeer", "shop/cluster-a", "PeerUnreachable")
    seen.assert_explained("a's gateway went away and came back")
    # Revoking: access ends at once, the other side is told by the refusal.
    s.step8_revoke()
    seen.caused("b", "ClusterPeer", "cluster-a", "PeerRefusedCertificate")
    seen.caused("b", "ProjectPeer", "shop/cluster-a", "PeerUnreachable", "PeerRefusedCertificate")
    seen.assert_explained("a revoked the peering")
    # Disabling and enabling the module: old peerings say to re-create; a new peering works.
    s.step9_reenable()
    seen.caused("b", "ClusterPeer", "cluster-a", "CredentialsFromOtherCA")
    s.step9_anew()
    seen.assert_explained("the peering was established anew")
