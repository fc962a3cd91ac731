"""Suite-wide rules: warnings are errors (pyproject), every test has a timeout, no test leaves a task behind, and no
async test blocks its event loop.

The loop watchdog: while an async test runs, a thread hands its event loop a callback every `tick` seconds
(`call_soon_threadsafe`) and measures how long the loop takes to run it. A loop that does not get control back for
longer than the bound (`BLOCK_BOUND_DEFAULT` seconds, `BLOCK_BOUND_REAL_DEFAULT` for a test on the real backend, or
`PEERING_TEST_LOOP_BLOCK_SECONDS` for all) is blocked by whatever runs in it: the test fails, naming the time and
where the loop's thread was (its stack, taken while it was blocked). A test that must block on purpose says so
with `@pytest.mark.blocks_loop(reason="why")`.

The time the loop's thread spent waiting for a CPU (its run-queue delay, from /proc/self/task/<tid>/schedstat) is
not counted: on a machine loaded by other test runs a callback is delayed by them, not blocked by itself, while a
sleep, a synchronous call to another process or a socket, and a long computation count in full.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import os
import sys
import threading
import time
import traceback

import pytest

BLOCK_BOUND_ENV = "PEERING_TEST_LOOP_BLOCK_SECONDS"
# Measured on the shared 2-core machine while other test runs loaded it (load average 3 to 4), bounds of 0.2 s and
# 0.05 s set through the variable: over the 1,039 tests of tests/control and 19 of tests/e2e the longest time a test's
# loop went without control, its wait for a CPU not counted, was 0.21 s (the emulator generating its 2048-bit RSA
# key inside a test); waits for a CPU of up to 0.33 s were discounted. 2 s is ten times that and still catches a
# sleep, or a synchronous call to kubectl or a socket.
BLOCK_BOUND_DEFAULT = 2.0
# On the real backend the lab's `cluster.api` is a synchronous HTTP client of kube-apiserver (lab/real/api.py, the
# emulator's in-process calls over HTTP), which the tests call from the loop: there the loop waits for kube-apiserver
# and etcd, whose writes took up to 2.02 s here at a load average of 9.5. Tests marked `real` get this bound instead.
BLOCK_BOUND_REAL_DEFAULT = 10.0
# How many frames of the blocked thread a failure shows at each end: where the test called, and what blocked.
STACK_FRAMES = 6


@dataclasses.dataclass(frozen=True)
class Stall:
    """The loop went `seconds` without control (not counting `queued`, its thread's wait for a CPU); `stack` is where
    its thread was while it was blocked."""

    seconds: float
    queued: float
    stack: str


def run_queue_delay(native_id: int) -> float:
    """Seconds thread `native_id` of this process has waited, runnable, for a CPU; 0.0 where the kernel does not
    say (no schedstat), so that the watchdog then counts wall time."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class LoopWatchdog:
    """Watches one event loop from a thread of its own; `stalls` lists every time it went longer than `bound`
    seconds without running a callback handed to it. Time in which the loop is not running (between a test's
    phases) is not counted: a callback is handed over only to a running loop, and a wait during which the loop
    stops is dropped."""

    def __init__(self, loop: asyncio.AbstractEventLoop, bound: float, tick: float | None = None) -> None:
        """Made in the thread that runs `loop`."""
        if bound <= 0:
            raise ValueError(f"the loop watchdog's bound must be a positive number of seconds, not {bound!r}")
        self.loop = loop
        self.bound = bound
        self.tick = min(0.1, bound / 4) if tick is None else tick
        self.loop_thread = threading.get_ident()
        self.loop_native_id = threading.get_native_id()
        self.stalls: list[Stall] = []
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)

    def start(self) -> "LoopWatchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Called in the loop's thread: a callback handed over and not run yet counts up to now."""
        self._stop.set()
        self._thread.join()

    def _stack(self) -> str:
        frame = sys._current_frames().get(self.loop_thread)
        if frame is None:
            return "(the loop's thread has no frame)"
        frames = traceback.extract_stack(frame)
        # From the callback the loop runs on: the frames of pytest and of asyncio's own loop above it say nothing.
        runs = [i for i, f in enumerate(frames) if f.name == "_run" and f.filename.endswith("asyncio/events.py")]
        if runs:
            frames = frames[runs[-1] + 1:]
        if len(frames) > 2 * STACK_FRAMES:  # the caller's frames and the blocking call's, the middle left out
            shown = traceback.format_list(frames[:STACK_FRAMES]) + ["  ...\n"] + traceback.format_list(
                frames[-STACK_FRAMES:])
        else:
            shown = traceback.format_list(frames)
        return "".join(shown).rstrip()

    def _watch(self) -> None:
        while not self._stop.is_set():
            if not self.loop.is_running():
                self._stop.wait(self.tick)
                continue
            ran = threading.Event()
            seen: list[float] = []

            def run() -> None:  # in the loop's thread: when, and how long it had waited for a CPU by then
                seen[:] = [time.monotonic(), run_queue_delay(self.loop_native_id)]
                ran.set()

            queued_before = run_queue_delay(self.loop_native_id)
            handed = time.monotonic()
            try:
                self.loop.call_soon_threadsafe(run)
            except RuntimeError:  # closed between the check and the call
                self._stop.wait(self.tick)
                continue
            stack = None
            while not ran.wait(self.tick):
                if not self.loop.is_running():
                    break  # stopped, not blocked: the callback waits for the next run
                if self._stop.is_set():
                    # Stopped from the loop's thread before the loop ran the callback: it had no control since.
                    if not seen:
                        seen[:] = [time.monotonic(), run_queue_delay(self.loop_native_id)]
                    break
                if stack is None and time.monotonic() - handed > self.bound:
                    stack = self._stack()
            if not seen:
                continue
            queued = max(0.0, seen[1] - queued_before)
            took = seen[0] - handed - queued
            self.longest = max(self.longest, took)
            if took > self.bound:
                self.stalls.append(Stall(took, queued, stack or "(not taken)"))
            self._stop.wait(self.tick)

    def report(self) -> str:
        """What a failing test says: each stall's time and where the loop's thread was."""
        parts = [f"the event loop did not get control back for {s.seconds:.2f}s (bound {self.bound:g}s, "
                 f"{BLOCK_BOUND_ENV} sets it; another {s.queued:.2f}s waiting for a CPU not counted); its thread "
                 f"was here:\n{s.stack}" for s in self.stalls]
        return ("a blocking call ran in the event loop: await it, or run it in a thread (asyncio.to_thread); a test "
                "that must block says why with @pytest.mark.blocks_loop(reason=...)\n" + "\n".join(parts))


def block_bound(real: bool = False) -> float:
    """The watchdog's bound in seconds: the environment's PEERING_TEST_LOOP_BLOCK_SECONDS, else BLOCK_BOUND_DEFAULT
    (BLOCK_BOUND_REAL_DEFAULT for a test on the real backend)."""
    text = os.environ.get(BLOCK_BOUND_ENV, "").strip()
    if not text:
        return BLOCK_BOUND_REAL_DEFAULT if real else BLOCK_BOUND_DEFAULT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise pytest.UsageError(f"{BLOCK_BOUND_ENV}={text!r} is not a positive number of seconds; set it to how "
                                f"long an event loop may go without control, e.g. {BLOCK_BOUND_ENV}=5, or unset it "
                                f"for {BLOCK_BOUND_DEFAULT:g}")
    return value


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "blocks_loop(reason): the test blocks its event loop on purpose; the loop "
                                       "watchdog leaves it alone (give the reason)")
    block_bound()  # a bad value stops the run at its start, saying what to set


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files that hold a `slow` test first, each in its own order, then the rest. With `--dist loadfile
    --no-loadscope-reorder` (the Makefile) pytest-xdist hands the workers whole files in this order, so the long
    ones start first and the short ones fill the end; by default it orders files by how many tests they hold, which
    left the outage suite (six tests, a sixth of the run's test time) to start last."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture(autouse=True)
def _loop_watchdog(request):
    """Fail an async test whose event loop went longer than the bound without control while the test ran (see the
    docstring above). The test function is wrapped, so that the watchdog watches the loop the test runs in, whatever
    its loop scope."""
    item = request.node
    marker = item.get_closest_marker("blocks_loop")
    if marker is not None and not (marker.kwargs.get("reason") or marker.args):
        pytest.fail("@pytest.mark.blocks_loop needs reason=\"...\": say why this test must block its event loop")
    test = getattr(item, "obj", None)
    if marker is not None or not inspect.iscoroutinefunction(test):
        yield
        return
    bound = block_bound(real=item.get_closest_marker("real") is not None)

    @functools.wraps(test)
    async def watched(*args, **kwargs):
        watchdog = LoopWatchdog(asyncio.get_running_loop(), bound).start()
        try:
            result = await test(*args, **kwargs)
        finally:
            watchdog.stop()
        if watchdog.stalls:
            pytest.fail(watchdog.report(), pytrace=False)
        return result

    item.obj = watched
    try:
        yield
    finally:
        item.obj = test


@pytest.fixture(autouse=True)
async def _no_leaked_tasks():
    """Fail a test that leaves asyncio tasks running once it and its fixtures are done."""
    before = set(asyncio.all_tasks())
    yield
    # Give tasks that were cancelled during teardown one turn of the loop to finish.
    for _ in range(3):
        leftover = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
        if not leftover:
            return
        await asyncio.sleep(0)
    names = ", ".join(sorted(t.get_name() + ":" + repr(t.get_coro()) for t in leftover))
    pytest.fail(f"test left {len(leftover)} task(s) running: {names}")
