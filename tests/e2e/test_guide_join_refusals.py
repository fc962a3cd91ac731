"""Connection strings that cannot be used end, on the joining side and within seconds, each in its own reason:
an expired string (Expired, checked before the token leaves b), a used one (TokenUsed, from a) and one issued
for another cluster (ClusterNotExpected, from a)."""

from __future__ import annotations

import pytest

from guide_helpers import needs_peering

pytestmark = [pytest.mark.slow, needs_peering, pytest.mark.timeout(120)]


def test_unusable_connection_strings_each_say_why(guide_story):
    guide_story.step0_enable()
    guide_story.step1_invite()
    guide_story.step2_join()
    guide_story.join_refusals()
    # The refused joins changed nothing of the working peering.
    guide_story.wait_peer(guide_story.b, "cluster-a", "Active", "True", timeout=5)
    guide_story.wait_peer(guide_story.a, "cluster-b", "Active", "True", timeout=5)
