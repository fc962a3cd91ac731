"""The administrator's guide (spec 001), end to end on two lab clusters, through kubectl only.

One test, the guide's steps in its order, each step checking what the guide promises; they are the steps
`make demo` shows (lab/demo/story.py), so the demo and this test prove one code path. A step that does not end as the
guide says fails with the kubectl command, what was expected and what came back; the output of the steps so far
is the test's captured output.
"""

from __future__ import annotations

import pytest

from guide_helpers import needs_peering

pytestmark = [pytest.mark.slow, needs_peering, pytest.mark.timeout(180)]


def test_the_guide_on_two_clusters(guide_story):
    # Enabling the module: its ModuleConfig, then PHASE Ready.
    guide_story.step0_enable()
    # Creating an invitation, connecting: Active and Ready on both sides.
    guide_story.step1_invite()
    guide_story.step2_join()
    # Opening capabilities: Accepted on both, opened on both, EFFECTIVE on both.
    guide_story.step3_capability()
    # Paired projects.
    guide_story.step4_projects()
    # A consumer on b reads and watches across egress and entrance; everything else is refused.
    guide_story.step5_consumer()
    # The connection string is a sensitive field.
    guide_story.step6_sensitive()
    # Temporary unavailability does not revoke.
    guide_story.step7_outage()
    # Revoking: access ends at once, the other side is told by the refusal.
    guide_story.step8_revoke()
    # Disabling and enabling the module: old peerings say to re-create; a new peering works.
    guide_story.step9_reenable()
    guide_story.step9_anew()
