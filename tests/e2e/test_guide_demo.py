"""`make demo` never leaves processes behind: when a step fails it says which and exits 1, interrupted with Ctrl-C
(or SIGTERM) it stops the lab and exits 130, and killed outright its peering processes die with it. The story it tells is the scenario's own
(test_guide_scenario.py runs the same `lab.demo.Story` steps)."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import time

import pytest

from guide_helpers import children, needs_peering, running_in, start_demo, stop, wait_gone, wait_output
from lab.demo.harness import START_TIMEOUT

pytestmark = [pytest.mark.slow, needs_peering, pytest.mark.timeout(2 * START_TIMEOUT)]


def peering_children(pid: int, count: int, timeout: float = START_TIMEOUT) -> list[int]:
    """The demo's peering processes, once `count` of them run (within the lab's own start bound)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [p for p, cmd in children(pid).items() if " run " in f" {cmd} " and "--ports-file" in cmd]
        if len(found) >= count:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"the demo did not start {count} peering processes within {timeout}s: "
                                 f"{children(pid)}")
        time.sleep(0.05)  # bounded poll: /proc has nothing to wait on


def _tree(pid: int) -> dict[int, str]:
    """The live descendants of `pid` with their state and command line, for a failure's message."""
    found, todo = {}, [pid]
    while todo:
        for child, cmd in children(todo.pop()).items():
            try:
                state = pathlib.Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            found[child] = f"{state} {cmd[:200]}"
            todo.append(child)
    return found


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_demo_stops_the_lab_and_fails(tmp_path, sig, demo_apiserver):
    proc, out = start_demo(tmp_path, demo_apiserver)
    try:
        wait_output(proc, out, "Starting the lab", 30)
        pids = peering_children(proc.pid, 2)
        # Only the demo gets the signal, not its process group: it must stop its children itself.
        proc.send_signal(sig)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the demo did not stop within 60 s of {sig.name}; its processes: "
                                 f"{_tree(proc.pid)}; it printed:\n{out.read_text(errors='replace')}") from None
        text = out.read_text(errors="replace")
        assert code == 130, text
        assert "interrupted; stopping the lab" in text
        assert "The lab is stopped." in text
        assert "Done in" not in text
        assert wait_gone(pids, 1.0) == [], f"peering processes outlived the demo: {pids}"
        assert running_in(tmp_path / "demo") == {}
    finally:
        stop(proc)


def test_a_killed_demo_takes_its_peering_processes_along(tmp_path, demo_apiserver):
    proc, out = start_demo(tmp_path, demo_apiserver)
    try:
        wait_output(proc, out, "Starting the lab", 30)
        pids = peering_children(proc.pid, 2)
        # On the real backend: its etcd, kube-apiserver and kube-controller-manager too.
        pids += [p for p in running_in(tmp_path / "demo") if p not in pids and p != proc.pid]
        commands = running_in(tmp_path / "demo")
        proc.kill()
        proc.wait(10)
        left = wait_gone(pids, 10.0)
        assert left == [], f"processes outlived a killed demo by 10 s: {({p: commands.get(p) for p in left})}"
    finally:
        stop(proc)


def test_a_demo_whose_step_fails_says_which_and_exits_1(tmp_path, demo_apiserver):
    # A log level `peering run` refuses (its flags are read from PEERING_*): the module's process never starts, and
    # its Module does not get to PHASE Ready.
    proc, out = start_demo(tmp_path, demo_apiserver, PEERING_LOG_LEVEL="chatty")
    try:
        code = proc.wait(90)
        text = out.read_text(errors="replace")
        assert code == 1, text
        assert "FAILED at step 0: The module is enabled on both clusters" in text
        assert "expected: PHASE Ready" in text and "phase='Error'" in text
        assert "the module's process did not start" in text
        assert "The lab is stopped." in text and "Done in" not in text
        assert running_in(tmp_path / "demo") == {}
    finally:
        stop(proc)
