"""Fixtures of the guide scenario: two lab clusters driven through kubectl by `lab.demo.Story`, the very steps
`make demo` shows, and the checks that nothing outlives them.

conftest.py only re-exports the fixtures; tests import from here (a uniquely named module, since several test
folders have a conftest.py)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Iterator

import pytest

from lab.cluster import peering_executable
from lab.demo import LabThread, Story
from lab.testing import apiserver_backends, real_binaries_or_skip
from transitions import Transitions

ROOT = pathlib.Path(__file__).resolve().parents[2]

needs_peering = pytest.mark.skipif(peering_executable() is None,
                                   reason="control/cli.py (`peering run`) is not in the tree")


def children(pid: int) -> dict[int, str]:
    """Live (not zombie) processes whose parent is `pid`, with their command lines."""
    found: dict[int, str] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue
        if int(stat[1]) == pid and stat[0] not in ("Z", "X"):
            found[int(entry.name)] = cmdline
    return found


def running_in(path: pathlib.Path) -> dict[int, str]:
    """Live processes whose command line names `path` (a lab's directory is in its peering processes' flags)."""
    found: dict[int, str] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or not alive(int(entry.name)):
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if str(path) in cmdline:
            found[int(entry.name)] = cmdline
    return found


def alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Poll until none of `pids` runs; returns those still running after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)  # bounded poll: these are not our children, nothing to wait on
    return left


def peering_pids(lab: LabThread) -> list[int]:
    return [c.process.pid for c in lab.lab.clusters.values() if c.process is not None]


@pytest.fixture(params=apiserver_backends())
def guide_lab(request, tmp_path) -> Iterator[LabThread]:
    """Clusters a and b, each with the chart's objects and the real peering process, on the emulator or on real
    kube-apiservers; stopped afterwards, and every process they started must be gone then."""
    if request.param == "real":
        real_binaries_or_skip()
    started: set[int] = set()
    # Processes of other fixtures of this test process (a session's real backend, say) are not this lab's.
    before = set(children(os.getpid()))
    lab = LabThread(tmp_path / "lab", ["a", "b"], apiserver=request.param)
    with lab:
        try:
            yield lab
        finally:
            started.update(peering_pids(lab))
    left = {pid: cmd for pid, cmd in children(os.getpid()).items() if pid not in before and (
            "peering" in cmd or "kubectl" in cmd or "kube-" in cmd or "etcd" in cmd or pid in started)}
    assert not left, f"processes left behind by the lab: {left}"


@pytest.fixture
def guide_story(guide_lab, tmp_path) -> Iterator[Story]:
    """The guide's steps on `guide_lab`; what they print is the test's captured output, shown on failure."""
    s = Story(guide_lab, tmp_path / "story", out=print)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def transitions(guide_story) -> Iterator[Transitions]:
    """What the ClusterPeers and ProjectPeers of `guide_story`'s clusters go through, and their Warning Events
    (transitions.py), from before its first step."""
    seen = Transitions({"a": guide_story.a, "b": guide_story.b})
    try:
        yield seen
    finally:
        seen.close()


@pytest.fixture(params=apiserver_backends())
def demo_apiserver(request) -> str:
    """The backend `python -m lab.demo --apiserver` runs on (the binaries there, or the loud skip)."""
    if request.param == "real":
        real_binaries_or_skip()
    return request.param


_DEMO_WITH_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                     "os.execv(sys.executable, [sys.executable, '-m', 'lab.demo', *sys.argv[1:]])")


def start_demo(tmp_path: pathlib.Path, apiserver: str = "emulator", **env: str) -> tuple[subprocess.Popen, pathlib.Path]:
    """`python -m lab.demo --keep DIR --apiserver A`, its output into a file that the caller reads as it grows."""
    out = tmp_path / "demo.out"
    f = open(out, "wb")
    try:
        # As a terminal's foreground job, where Ctrl-C reaches it: SIGINT at its default, whatever this runner has
        # (a test run started in the background by a script ignores SIGINT, and its children inherit that). The
        # same process then becomes the demo (exec).
        proc = subprocess.Popen([sys.executable, "-c", _DEMO_WITH_SIGINT, "--keep", str(tmp_path / "demo"),
                                 "--apiserver", apiserver], cwd=str(ROOT),
                                stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1", **env))
    finally:
        f.close()
    return proc, out


def wait_output(proc: subprocess.Popen, out: pathlib.Path, text: str, timeout: float) -> str:
    """Poll the demo's output until it contains `text`; fail with the output so far otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        seen = out.read_text(errors="replace")
        if text in seen:
            return seen
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the demo did not print {text!r} (exit {proc.poll()}); it printed:\n{seen}")
        time.sleep(0.05)  # bounded poll of another process's output


def stop(proc: subprocess.Popen) -> None:
    """Make sure a demo a failed test started does not outlive it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
