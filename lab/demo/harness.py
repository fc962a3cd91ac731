"""Starting and stopping the lab clusters of the demo: `LabThread` runs them on an event loop of its own thread, so
that the story can run kubectl and wait, and can do to a cluster what only the lab can (stop and start its peering
process: an outage, a disabled module).

Every process it starts is stopped on the way out, also on a failed step, Ctrl-C or SIGTERM; the peering processes
also die with the demo should it be killed outright (PR_SET_PDEATHSIG, `LAUNCHER`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import signal
import sys
import textwrap
import threading
import time
from typing import Awaitable, Callable, TypeVar

from lab.cluster import EGRESS_HOST, Lab, LabCluster, default_peering_command
from lab.demo.failure import StepFailed

# Seconds between pulls of the peer's offer in the lab (production: 30). A short interval lets an outage and a
# revocation show within a second or two instead of half a minute; the mechanism is the same.
LAB_PEER_SYNC_INTERVAL = "1"
# How often a bounded poll looks again.
POLL_INTERVAL = 0.05
# How long a stopping peering process may take before it is killed (the lab itself waits 20 s for SIGTERM).
STOP_GRACE = 25.0

T = TypeVar("T")

# Runs before the peering process's own code: dies with the demo (PR_SET_PDEATHSIG) even when the demo is killed
# without a chance to clean up, then becomes the process with the extra environment.
LAUNCHER = textwrap.dedent("""
    import ctypes, os, signal, sys
    parent = int(sys.argv[1])
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        sys.exit("the lab that started this peering process is gone")
    sep = sys.argv.index("--")
    env = dict(os.environ, **dict(kv.split("=", 1) for kv in sys.argv[2:sep]))
    cmd = sys.argv[sep + 1:]
    os.execvpe(cmd[0], cmd, env)
""")


def lab_peering_command(cluster: LabCluster) -> list[str] | None:
    """The lab's peering process (with the token of the module's ServiceAccount, which the module manager writes
    anew each time it enables the module), the lab's sync interval, and tied to this process's life."""
    cmd = default_peering_command(cluster)
    if cmd is None:
        return None
    return [sys.executable, "-c", LAUNCHER, str(os.getpid()),
            f"PEERING_PEER_SYNC_INTERVAL={LAB_PEER_SYNC_INTERVAL}", "--", *cmd]


#: How long the lab's clusters may take to start (a real kube-apiserver and etcd each, on a loaded machine).
START_TIMEOUT = 120.0


class LabThread:
    """Lab clusters on an event loop in a thread of their own, so that the caller can run kubectl and wait.

    `with LabThread(dir, ["a", "b"]) as lab:` starts them and stops them on exit, whatever happened inside.
    """

    def __init__(self, dir: pathlib.Path, names: list[str], *, ready_timeout: float = 30.0,
                 start_timeout: float = START_TIMEOUT, apiserver: str = "emulator", module_enabled: bool = False) -> None:
        """module_enabled: False (the default) starts the clusters without ModuleConfig peering, for the story to
        enable the module as the guide says."""
        self.dir = pathlib.Path(dir)
        self.apiserver = apiserver
        # A healthy peering process is ready within seconds; one that is not says why in its log, shown then.
        self.lab = Lab(self.dir, names, peering_command=lab_peering_command, ready_timeout=ready_timeout,
                       apiserver=apiserver, module_enabled=module_enabled)
        self.start_timeout = start_timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="lab", daemon=True)
        self._started = False
        self._inflight: set[asyncio.Task] = set()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def call(self, fn: Callable[[Lab], Awaitable[T]], timeout: float = 60.0) -> T:
        """Run `fn(lab)` on the lab's loop and return its result; interrupted, the call is cancelled and `close`
        lets its cleanup finish."""
        async def run() -> T:
            task = asyncio.current_task()
            self._inflight.add(task)
            try:
                return await fn(self.lab)
            finally:
                self._inflight.discard(task)

        future = asyncio.run_coroutine_threadsafe(run(), self._loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    def __enter__(self) -> "LabThread":
        self._thread.start()
        self._started = True
        try:
            self.call(lambda lab: lab.start(), self.start_timeout)
        except Exception as e:
            self.close()
            raise StepFailed("starting the lab", "the lab's clusters start: API server, Dex, user-authn and the "
                             "module manager", "every cluster up", f"{type(e).__name__}: {e}") from e
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every cluster, then make sure no process of this lab is left, then end the loop and the thread."""
        if not self._started:
            return
        self._started = False
        try:
            # A call cut short (Ctrl-C during the start) is cancelled; let its own cleanup run to its end first.
            self.call(lambda lab: self._settle(STOP_GRACE), STOP_GRACE + 5)
            self.call(lambda lab: lab.stop(), 90.0)
        finally:
            try:
                self.call(lambda lab: self._reap(STOP_GRACE), STOP_GRACE + 5)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(30)
                if not self._thread.is_alive():
                    self._loop.close()

    async def _settle(self, grace: float) -> None:
        others = [t for t in self._inflight if t is not asyncio.current_task()]
        if others:
            await asyncio.wait(others, timeout=grace)

    async def _reap(self, grace: float) -> None:
        """Wait (on the running loop, which reaps them) for this lab's processes to exit; kill what ignores
        SIGTERM for `grace` seconds; then cancel what is left on the loop, so it closes clean."""
        deadline = time.monotonic() + grace
        while (left := self.processes()) and time.monotonic() < deadline:
            await asyncio.sleep(POLL_INTERVAL)  # bounded poll: the lab no longer holds these processes
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def processes(self) -> list[int]:
        """Live children of this process that run in this lab's directory (its peering processes)."""
        mine = str(self.dir)
        found = []
        for entry in pathlib.Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except (OSError, IndexError):
                continue
            if int(stat[1]) == os.getpid() and stat[0] not in ("Z", "X") and mine in cmdline:
                found.append(int(entry.name))
        return found

    def cluster(self, name: str) -> LabCluster:
        return self.lab[name]

    def kubeconfig(self, name: str) -> pathlib.Path:
        return self.lab[name].path("kubeconfig")

    def egress_address(self, name: str) -> str:
        """`127.0.0.1:<port>` of the cluster's egress Service (`peering-gateway.d8-peering.svc`)."""
        return self.lab[name].resolve_map()[EGRESS_HOST]

    def stop_peering(self, name: str) -> None:
        self.call(lambda lab: lab[name].stop_peering())

    def start_peering(self, name: str) -> None:
        self.call(lambda lab: lab[name].start_peering(), self.start_timeout)
