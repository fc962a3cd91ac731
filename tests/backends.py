"""Which suites run on both API server backends, and every exception with its reason.

The end-to-end and guide suites (tests/e2e/), the reconcilers' tests (tests/control/reconcilers/) and the gateway's
kubectl test (tests/gateway/test_kubectl.py) talk to a lab cluster's API server: each of their tests runs once on
the emulator (`[emulator]`, marked `emulator`) and once on a real kube-apiserver (`[real]`, marked `real`), through
a fixture taking `params=apiserver_backends()` (lab/testing.py). `EXCEPTIONS` names every test of that scope that
does not, by file or by `file::test`, with its kind and why; tests/test_backends.py holds the scope to it, both ways.

Also a pytest plugin (`-p tests.backends`): with PEERING_BACKENDS_REPORT set to a path, the collection writes
there, as JSON, every collected test's node id, its `file::test` and whether it is marked `emulator` and `real`.
"""

from __future__ import annotations

import json
import os
import pathlib

# Where every test talks to an API server unless it is listed below.
SCOPE = ("tests/e2e/", "tests/control/reconcilers/", "tests/gateway/test_kubectl.py")

EMULATOR_ONLY = "emulator only"
REAL_ONLY = "real only"
PURE = "pure"

_HOOKS = ("needs the emulator's after-write hooks (lab/apiserver/hooks.py), which run inside the API server right "
          "after a write is stored and before its answer leaves; a real kube-apiserver has none")

#: `file` or `file::test` -> (EMULATOR_ONLY, REAL_ONLY or PURE, why).
EXCEPTIONS: dict[str, tuple[str, str]] = {
    "tests/e2e/test_join_crashes.py::test_a_crash_after_each_write_of_the_join_ends_active_on_both_sides": (
        EMULATOR_ONLY, f"kills a peering process right after each write of the join lands: {_HOOKS}"),
    "tests/e2e/test_join_crashes.py::test_a_joiner_that_gives_up_after_the_answer_leaves_a_fresh_string_not_a_hang": (
        EMULATOR_ONLY, f"kills the joiner right after the inviter stored the Secret of the redemption: {_HOOKS}"),
    "tests/e2e/test_peering_check_deckhouse.py": (
        REAL_ONLY, "the module's Deployment and its Pods, which the emulator does not serve (apps/v1, Pods); "
                   "tests/e2e/test_peering_check.py checks the emulator's shape, the Lease, on both backends"),
    "tests/e2e/test_access_announced.py::"
    "test_a_consumer_starting_when_access_is_announced_waits_for_the_peers_grants_in_force": (
        REAL_ONLY, "holds the creations of RoleBindings in the API front of a real kube-apiserver (lab/apifront.py) "
                   "and needs its RBAC authorizer, which learns of them after they are stored; the emulator's "
                   "authorizer reads its own store, and its hooks run only after a write is stored"),
    "tests/e2e/test_guide_story_parts.py": (
        PURE, "reads kubectl tables, connection strings and the launcher's command line; no cluster"),
    "tests/control/reconcilers/test_pure.py": (
        PURE, "the reconcilers' plain functions on plain data"),
    "tests/control/reconcilers/test_invite_phase.py": (
        PURE, "the Invite phase of a pass on an observed state built in the test"),
    "tests/control/reconcilers/test_certificate_renewal_races.py::"
    "test_the_certificate_before_a_renewal_is_used_while_the_peer_has_not_learnt_the_new_one": (
        PURE, "the syncer against a stand-in entrance, with no API server"),
    "tests/control/reconcilers/test_certificate_renewal_races.py::test_an_expired_previous_certificate_is_not_tried": (
        PURE, "the syncer against a stand-in entrance, with no API server"),
    "tests/control/reconcilers/test_certificate_renewal_races.py::"
    "test_a_renewal_by_the_inviter_leaves_the_joiner_nothing_to_deliver": (
        PURE, "the syncer against a stand-in entrance, with no API server"),
}

REPORT_ENV = "PEERING_BACKENDS_REPORT"


def test_key(nodeid: str) -> str:
    """`file::test` of a node id: its parameters left out."""
    return nodeid.split("[", 1)[0]


def in_scope(nodeid: str) -> bool:
    return any(nodeid.startswith(s) for s in SCOPE)


def backends_of(item: dict) -> frozenset[str]:
    return frozenset(b for b in ("emulator", "real") if item[b])


_WANTED = {EMULATOR_ONLY: frozenset({"emulator"}), REAL_ONLY: frozenset({"real"}), PURE: frozenset()}
BOTH = frozenset({"emulator", "real"})


def problems(items: list[dict], exceptions: dict[str, tuple[str, str]] = EXCEPTIONS) -> list[str]:
    """What is wrong with the in-scope `items` (as the plugin reports them) against `exceptions`: a test not on
    both backends that no entry names, an entry that names no collected test, and an entry that is no longer an
    exception of its kind (its tests now run on both, or on another backend)."""
    out = []
    tests: dict[str, set[str]] = {}
    for item in items:
        if in_scope(item["nodeid"]):
            tests.setdefault(item["test"], set()).update(backends_of(item))
    for key, (kind, why) in exceptions.items():
        if kind not in _WANTED or not why:
            out.append(f"{key}: give one of {', '.join(_WANTED)} and the reason, not {kind!r}, {why!r}")
    for test, backends in sorted(tests.items()):
        entry = exceptions.get(test) or exceptions.get(test.split("::", 1)[0])
        if entry is None:
            if not backends:
                out.append(f"{test} is marked with no backend: it runs on the emulator by default, or talks to no "
                           "API server; make its fixture take params=apiserver_backends(), or name it in "
                           "tests/backends.py EXCEPTIONS (pure, or why it cannot)")
            elif backends != BOTH:
                out.append(f"{test} runs on {', '.join(sorted(backends))} only: make its fixture take "
                           "params=apiserver_backends(), or name it in tests/backends.py EXCEPTIONS with why")
            continue
        wanted = _WANTED.get(entry[0])
        if wanted is not None and frozenset(backends) != wanted:
            now = "both backends" if backends == BOTH else ", ".join(sorted(backends)) or "no backend"
            out.append(f"{test} is listed as {entry[0]} in tests/backends.py but runs on {now}: "
                       + ("take it off the list" if backends == BOTH else "correct its entry"))
    for key in exceptions:
        if not any(t == key or t.startswith(key + "::") for t in tests):
            out.append(f"{key} is listed in tests/backends.py but no such test is collected in scope: take it off")
    return out


def report(items) -> list[dict]:
    """Each collected pytest item as the checks above read it: its node id, `file::test` and backend marks."""
    return [{"nodeid": item.nodeid, "test": test_key(item.nodeid),
             "emulator": item.get_closest_marker("emulator") is not None,
             "real": item.get_closest_marker("real") is not None} for item in items]


def pytest_collection_finish(session) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    pathlib.Path(path).write_text(json.dumps(report(session.items)))
