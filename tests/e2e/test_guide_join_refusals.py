"""Connection strings that cannot be used end, on the joining side and within seconds, each in its own reason:
an expired string (Expired, checked before the token leaves b), a used one (TokenUsed, from a) and one issued
for another cluster (ClusterNotExpected, from a)."""

from __future__ import annotations

import pytest

from guide_helpers import needs_peering

pytestmark = [pytest.mark.slow, needs_peering, pytest.mark.timeout(120)]


def test_unusable_connection_strings_each_say_why(story):
    story.step1_invite()
    story.step2_join()
    story.join_refusals()
    # The refused joins changed nothing of the working peering.
    story.wait_peer(story.b, "cluster-a", "Active", "True", timeout=5)
    story.wait_peer(story.a, "cluster-b", "Active", "True", timeout=5)
