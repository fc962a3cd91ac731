"""`make demo`: the administrator's guide told on two lab clusters, through kubectl only.

    python -m lab.demo                 # the story, a quarter of a minute
    python -m lab.demo --keep DIR      # the same, with the lab's files (kubeconfigs, logs) kept in DIR

The story is `Story` (story.py), one method per step of the guide; the scenario test
(tests/e2e/test_guide_scenario.py) runs the very same methods, so what the demo shows is what the suite proves. Each
step prints the kubectl command before its output, as an administrator would type it on cluster a or b (`a$`,
`b$`); a step that does not end as the guide says raises `StepFailed` naming the command, what was expected and
what came back.

The modules: harness.py starts and stops the two lab clusters (`LabThread`), in this process, on an event loop of
their own thread, because the guide needs what only the lab can do to a cluster: stop and start its peering
process (an outage); the module itself is enabled and disabled with its ModuleConfig, as the guide says, and the
lab's module manager (lab/module_manager.py) does the rest; every process the demo starts is stopped on the way out, also on a failed
step, Ctrl-C or SIGTERM, and the peering processes also die with the demo should it be killed outright
(PR_SET_PDEATHSIG). kubectl.py runs the real kubectl against them; manifests.py holds the objects the story
applies; checks.py what a step is made of (show, wait, check); story.py the steps; __main__.py the command.
"""

from __future__ import annotations

from lab.demo.checks import STEP_TIMEOUT, Checks
from lab.demo.failure import StepFailed
from lab.demo.harness import LAUNCHER, LabThread, lab_peering_command
from lab.demo.kubectl import KUBECTL, Kubectl, Watch, condition, describe_peer, parse_table
from lab.demo.manifests import (AUDITOR, BYSTANDER, CAPABILITY, CAPABILITY_VERSION, CONSUMER, MODULE_NS, PROJECT,
                                auditor_manifest, expired_copy, invite_manifest, join_manifest, module_config_manifest,
                                module_manifest, project_manifest, shorten, write_private, write_token_kubeconfig)
from lab.demo.story import WATCH_END_SECONDS, Story

__all__ = [
    "AUDITOR", "BYSTANDER", "CAPABILITY", "CAPABILITY_VERSION", "CONSUMER", "KUBECTL", "MODULE_NS", "PROJECT",
    "STEP_TIMEOUT", "WATCH_END_SECONDS", "LAUNCHER", "Checks", "Kubectl", "LabThread", "StepFailed", "Story",
    "Watch", "auditor_manifest", "condition", "describe_peer", "expired_copy", "invite_manifest", "join_manifest",
    "lab_peering_command", "module_config_manifest", "module_manifest", "parse_table", "project_manifest", "shorten",
    "write_private", "write_token_kubeconfig",
]
