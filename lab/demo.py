"""`make demo`: the administrator's guide told on two lab clusters, through kubectl only.

    python -m lab.demo                 # the story, a quarter of a minute
    python -m lab.demo --keep DIR      # the same, with the lab's files (kubeconfigs, logs) kept in DIR

The story is `Story`, one method per step of the guide; the scenario test (tests/e2e/test_guide_scenario.py)
runs the very same methods, so what the demo shows is what the suite proves. Each step prints the kubectl command
before its output, as an administrator would type it on cluster a or b (`a$`, `b$`); a step that does not end as
the guide says raises `StepFailed` naming the command, what was expected and what came back.

The clusters run in this process, on an event loop of their own thread (`LabThread`), because the guide needs
what only the lab can do to a cluster: stop and start its peering process (an outage, a disabled module). Every
process the demo starts is stopped on the way out, also on a failed step, Ctrl-C or SIGTERM; the peering
processes also die with the demo should it be killed outright (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import queue
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from typing import Awaitable, Callable, TypeVar

import yaml

from lab.cluster import EGRESS_HOST, NAMESPACE, Lab, LabCluster, default_peering_command
from lab.userauthn import MODULE_DEX_CLIENT_NAME, dex_client_secret

ROOT = pathlib.Path(__file__).resolve().parent.parent
KUBECTL = str(pathlib.Path(sys.executable).with_name("kubectl"))

# What the story creates. The capability belongs to an imaginary module "mirror" whose controller, in both
# clusters, reads the ConfigMaps of the paired projects of the other cluster.
CAPABILITY = "mirror-configmaps"
CAPABILITY_VERSION = "v1"
MODULE_NS = "d8-mirror"
CONSUMER = "mirror-controller"
BYSTANDER = "mirror-bystander"
PROJECT = "shop"
AUDITOR = "auditor"

# Seconds between pulls of the peer's offer in the lab (production: 30). A short interval lets an outage and a
# revocation show within a second or two instead of half a minute; the mechanism is the same.
LAB_PEER_SYNC_INTERVAL = "1"
# How long a step waits for the clusters to reach the state the guide describes.
STEP_TIMEOUT = 20.0
POLL_INTERVAL = 0.05
# How long a stopping peering process may take before it is killed (the lab itself waits 20 s for SIGTERM).
STOP_GRACE = 25.0
# The guide's promise for an open watch of a revoked peer.
WATCH_END_SECONDS = 1.0

T = TypeVar("T")


class StepFailed(Exception):
    """A step did not end as the guide says."""

    def __init__(self, step: str, command: str, expected: str, got: str) -> None:
        self.step, self.command, self.expected, self.got = step, command, expected, got
        super().__init__(f"{step}\n  command:  {command}\n  expected: {expected}\n  got:      {got}")


# --- the lab in a thread ---------------------------------------------------------------------------------------

# Runs before the peering process's own code: dies with the demo (PR_SET_PDEATHSIG) even when the demo is killed
# without a chance to clean up, then becomes the process with the extra environment.
_LAUNCHER = textwrap.dedent("""
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


def module_kubeconfig(cluster: LabCluster) -> pathlib.Path:
    """The kubeconfig the peering process of `cluster` runs with: the ServiceAccount token its pod would mount.

    A copy of the lab's, so that re-enabling the module can give the new ServiceAccount's token to the process.
    """
    return cluster.path("module-kubeconfig")


def lab_peering_command(cluster: LabCluster) -> list[str] | None:
    """The lab's peering process, with its ServiceAccount kubeconfig from `module_kubeconfig`, the lab's sync
    interval, and tied to this process's life."""
    cmd = default_peering_command(cluster)
    if cmd is None:
        return None
    kubeconfig = module_kubeconfig(cluster)
    if not kubeconfig.exists():
        write_private(kubeconfig, cluster.path("peering-kubeconfig").read_text())
    if "--kubeconfig" in cmd:
        cmd[cmd.index("--kubeconfig") + 1] = str(kubeconfig)
    else:
        cmd += ["--kubeconfig", str(kubeconfig)]
    return [sys.executable, "-c", _LAUNCHER, str(os.getpid()),
            f"PEERING_PEER_SYNC_INTERVAL={LAB_PEER_SYNC_INTERVAL}", "--", *cmd]


class LabThread:
    """Lab clusters on an event loop in a thread of their own, so that the caller can run kubectl and wait.

    `with LabThread(dir, ["a", "b"]) as lab:` starts them and stops them on exit, whatever happened inside.
    """

    def __init__(self, dir: pathlib.Path, names: list[str], *, ready_timeout: float = 30.0,
                 start_timeout: float = 120.0, apiserver: str = "emulator") -> None:
        self.dir = pathlib.Path(dir)
        self.apiserver = apiserver
        # A healthy peering process is ready within seconds; one that is not says why in its log, shown then.
        self.lab = Lab(self.dir, names, peering_command=lab_peering_command, ready_timeout=ready_timeout,
                       apiserver=apiserver)
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
            raise StepFailed("enabling the module on both clusters", "the lab's clusters start with the chart's "
                             "objects and the peering process", "every peering process ready (/readyz 200)",
                             f"{type(e).__name__}: {e}") from e
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


# --- kubectl ---------------------------------------------------------------------------------------------------

def _quote(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


@dataclasses.dataclass
class Kubectl:
    """kubectl for one cluster and one identity; `prompt` is how its commands are shown (`a$`, `b (consumer)$`)."""

    prompt: str
    kubeconfig: pathlib.Path
    cache_dir: pathlib.Path
    out: Callable[[str], None]

    def argv(self, args: tuple[str, ...] | list[str]) -> list[str]:
        return [KUBECTL, "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.cache_dir), *args]

    def command(self, args: tuple[str, ...] | list[str], stdin: str | None = None) -> str:
        shown = f"kubectl {_quote(list(args))}"
        return shown + (" <<EOF" if stdin is not None else "")

    def run(self, *args: str, stdin: str | None = None, show: bool = True,
            timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run kubectl; when `show`, print the command (and its input), then what it printed."""
        if show:
            self.out(f"{self.prompt} {self.command(args, stdin)}")
            if stdin is not None:
                self.out(stdin.rstrip("\n") + "\nEOF")
        done = subprocess.run(self.argv(args), input=stdin, capture_output=True, text=True, timeout=timeout,
                              stdin=None if stdin is not None else subprocess.DEVNULL)
        if show:
            for text in (done.stdout, done.stderr):
                if text.strip():
                    self.out(text.rstrip("\n"))
        return done

    def ok(self, step: str, *args: str, stdin: str | None = None, show: bool = True,
           expect: str = "success") -> subprocess.CompletedProcess:
        """Run kubectl and require exit code 0."""
        done = self.run(*args, stdin=stdin, show=show)
        if done.returncode != 0:
            raise StepFailed(step, f"{self.prompt} {self.command(args, stdin)}", expect,
                             f"exit {done.returncode}: {(done.stderr or done.stdout).strip()}")
        return done

    def get_json(self, step: str, *args: str) -> dict:
        done = self.ok(step, "get", *args, "-o", "json", show=False)
        return json.loads(done.stdout)

    def get_optional(self, *args: str) -> dict | None:
        """The object as JSON, or None when kubectl cannot get it (absent, or the server did not answer)."""
        done = self.run("get", *args, "-o", "json", show=False)
        if done.returncode != 0:
            return None
        return json.loads(done.stdout)


def condition(obj: dict | None, ctype: str) -> dict:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return {}


def describe_peer(obj: dict | None) -> str:
    """phase, Ready status, reason and message of a ClusterPeer, for a step's "got"."""
    if obj is None:
        return "no such object"
    ready = condition(obj, "Ready")
    return (f"phase={obj.get('status', {}).get('phase')!r} Ready={ready.get('status')!r} "
            f"reason={ready.get('reason')!r} message={ready.get('message')!r}")


def parse_table(text: str) -> list[dict[str, str]]:
    """Rows of a kubectl table by column name; columns are cut where the header's names start, as kubectl aligns
    them, so an empty cell stays empty."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    starts = [m.start() for m in re.finditer(r"\S+", lines[0])]
    names = lines[0].split()
    ends = starts[1:] + [None]
    return [{n: line[a:b].strip() for n, a, b in zip(names, starts, ends)} for line in lines[1:]]


# --- manifests -------------------------------------------------------------------------------------------------

def invite_manifest(name: str, ttl: str = "1h", expected_cluster_uuid: str | None = None,
                    capabilities: list[str] | None = None) -> str:
    spec: dict = {"type": "Invite", "invite": {"tokenTTL": ttl}}
    if expected_cluster_uuid:
        spec["invite"]["expectedClusterUUID"] = expected_cluster_uuid
    if capabilities:
        spec["capabilities"] = capabilities
    return yaml.safe_dump({"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                           "metadata": {"name": name}, "spec": spec}, sort_keys=False)


def join_manifest(name: str, connection_string: str, capabilities: list[str] | None = None) -> str:
    spec: dict = {"type": "Join", "join": {"connectionString": connection_string}}
    if capabilities:
        spec["capabilities"] = capabilities
    return yaml.safe_dump({"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                           "metadata": {"name": name}, "spec": spec}, sort_keys=False, width=10_000)


def module_manifest() -> str:
    """The imaginary module "mirror": its namespace, its controller's ServiceAccount (the consumer), another
    ServiceAccount that is not a consumer, and the PeeringCapability it declares."""
    docs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MODULE_NS}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": CONSUMER, "namespace": MODULE_NS}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": BYSTANDER, "namespace": MODULE_NS}},
        {"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "PeeringCapability",
         "metadata": {"name": CAPABILITY},
         "spec": {"version": CAPABILITY_VERSION,
                  "consumers": [{"kind": "ServiceAccount", "namespace": MODULE_NS, "name": CONSUMER}],
                  "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}},
    ]
    return yaml.safe_dump_all(docs, sort_keys=False)


def project_manifest(cluster: str) -> str:
    """Project `shop` with its main namespace (as Deckhouse multitenancy makes them) and a ConfigMap that says
    which cluster it lives in."""
    docs = [
        {"apiVersion": "deckhouse.io/v1alpha3", "kind": "Project", "metadata": {"name": PROJECT}, "spec": {}},
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": PROJECT, "labels": {"projects.deckhouse.io/project": PROJECT}}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"price-list-{cluster}", "namespace": PROJECT},
         "data": {"cluster": cluster}},
    ]
    return yaml.safe_dump_all(docs, sort_keys=False)


def auditor_manifest() -> str:
    """A person who may read peerings (the module's d8:user-authz:peering:user) but not their sensitive fields."""
    docs = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": AUDITOR, "namespace": "default"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "auditor-peering-viewer"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "d8:user-authz:peering:user"},
         "subjects": [{"kind": "ServiceAccount", "name": AUDITOR, "namespace": "default"}]},
    ]
    return yaml.safe_dump_all(docs, sort_keys=False)


def write_token_kubeconfig(path: pathlib.Path, server: str, ca_pem: bytes, token: str,
                           tls_server_name: str | None = None) -> pathlib.Path:
    cluster: dict = {"server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()}
    if tls_server_name:
        cluster["tls-server-name"] = tls_server_name
    doc = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "c", "cluster": cluster}],
           "users": [{"name": "u", "user": {"token": token}}],
           "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
           "current-context": "c"}
    write_private(path, yaml.safe_dump(doc, sort_keys=False))
    return path


def write_private(path: pathlib.Path, text: str) -> None:
    """Write a file that holds a token: readable by its owner only, from the first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def expired_copy(connection_string: str) -> str:
    """The same invitation with its expiry an hour ago, checksum recomputed: what a string looks like when it was
    left lying around past its tokenTTL (the guide's smallest TTL is ten minutes, too long to wait for)."""
    from control import connstring

    inv = connstring.decode(connection_string, now=datetime.datetime.now(datetime.timezone.utc))
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
    return connstring.encode(dataclasses.replace(inv, expires_at=past))


def shorten(secret_text: str) -> str:
    """A one-time secret as the demo shows it: enough to recognise, not enough to use."""
    return f"{secret_text[:16]}...({len(secret_text)} characters, shown shortened)"


# --- a consumer's open watch -----------------------------------------------------------------------------------

class Watch:
    """`kubectl get -w` running in the background, its lines collected as they come."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._queue: "queue.Queue[str | None]" = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="kubectl-watch", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_line(self, predicate: Callable[[str], bool], timeout: float) -> str | None:
        """The first line (old or new) for which `predicate` holds, waiting up to `timeout` seconds."""
        for line in self.lines:
            if predicate(line):
                return line
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                self._queue.put(None)  # keep the end visible to later calls
                return None
            self.lines.append(line)
            if predicate(line):
                return line
        return None

    def wait_exit(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# --- the story -------------------------------------------------------------------------------------------------

_REQUEST_LOG = re.compile(r'"Response" verb="(?P<verb>[A-Z]+)" url="(?P<url>[^"]+)" status="(?P<status>[^"]+)"')


class Story:
    """The administrator's guide, step by step, on clusters a (inviting) and b (joining).

    Each step checks what the guide promises and raises `StepFailed` otherwise. Steps build on each other in
    the order of their numbers; `run_demo` runs the ones `make demo` shows.
    """

    def __init__(self, lab: LabThread, work: pathlib.Path, out: Callable[[str], None] = print,
                 timeout: float = STEP_TIMEOUT) -> None:
        self.lab = lab
        self.work = pathlib.Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.timeout = timeout
        self.step = "start"
        cache = self.work / "kube-cache"
        self.a = Kubectl("a$", lab.kubeconfig("a"), cache, out)
        self.b = Kubectl("b$", lab.kubeconfig("b"), cache, out)
        self.uuid = {name: lab.cluster(name).uuid for name in ("a", "b")}
        self.connection_string = ""
        self.consumer: Kubectl | None = None
        self.watch: Watch | None = None
        self._cache = cache

    # helpers

    def title(self, step: str, text: str) -> None:
        self.step = f"step {step}: {text}"
        self.out(f"\n== {step}. {text}")

    def say(self, text: str) -> None:
        self.out(f"# {text}")

    def expect_row(self, k: Kubectl, args: tuple[str, ...], name: str, **columns: str) -> None:
        """Show `kubectl get` as a table and check the row `name`: each column as given (`EFFECTIVE` contains it)."""
        self.expect_rows(k, args, {name: columns})

    def expect_rows(self, k: Kubectl, args: tuple[str, ...], want: dict[str, dict[str, str]]) -> None:
        done = k.ok(self.step, *args)
        rows = {r.get("NAME"): r for r in parse_table(done.stdout)}
        for name, columns in want.items():
            row = rows.get(name)
            got = {c: (row or {}).get(c) for c in columns}
            if row is None or any(got[c] != v and not (c == "EFFECTIVE" and v in (got[c] or ""))
                                  for c, v in columns.items()):
                raise StepFailed(self.step, f"{k.prompt} {k.command(args)}", f"{name}: {columns}",
                                 f"{name}: {got}" if row is not None else done.stdout.strip() or "no rows")

    def until(self, what: str, command: str, probe: Callable[[], tuple[bool, str]],
              timeout: float | None = None) -> str:
        """Poll `probe` (-> (done, what was seen)) until done; StepFailed with the last observation otherwise."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            done, seen = probe()
            if done:
                return seen
            if time.monotonic() > deadline:
                raise StepFailed(self.step, command, what, seen)
            time.sleep(POLL_INTERVAL)  # bounded poll of another process's state

    def wait_peer(self, k: Kubectl, name: str, phase: str, ready: str | None = None,
                  reason: str | None = None, timeout: float | None = None) -> dict:
        """Wait until ClusterPeer `name` has `phase` (and Ready `ready` with `reason`); returns it."""
        want = f"phase={phase!r}" + (f" Ready={ready!r}" if ready else "") + (f" reason={reason!r}" if reason else "")
        holder: dict = {}

        def probe() -> tuple[bool, str]:
            obj = k.get_optional("clusterpeer", name)
            holder["obj"] = obj
            c = condition(obj, "Ready")
            ok = (obj is not None and obj.get("status", {}).get("phase") == phase
                  and (ready is None or c.get("status") == ready) and (reason is None or c.get("reason") == reason))
            return ok, describe_peer(obj)

        self.until(want, f"{k.prompt} kubectl get clusterpeer {name} -o json", probe, timeout)
        return holder["obj"]

    def apply_join(self, name: str, connection_string: str, capabilities: list[str] | None = None) -> None:
        """`b$ kubectl apply` a Join ClusterPeer; the one-time string is shown shortened, applied in full."""
        shown = join_manifest(name, shorten(connection_string), capabilities)
        self.out(f"b$ kubectl apply -f - <<EOF\n{shown.rstrip()}\nEOF")
        done = self.b.ok(self.step, "apply", "-f", "-", stdin=join_manifest(name, connection_string, capabilities),
                         show=False)
        self.out(done.stdout.rstrip())

    def show_ready_message(self, k: Kubectl, name: str) -> None:
        k.ok(self.step, "get", "clusterpeer", name, "-o",
             'jsonpath={.status.conditions[?(@.type=="Ready")].reason}: '
             '{.status.conditions[?(@.type=="Ready")].message}{"\\n"}')

    def wait_projectpeer(self, k: Kubectl, name: str, state: str, timeout: float | None = None) -> dict:
        holder: dict = {}

        def probe() -> tuple[bool, str]:
            obj = k.get_optional("projectpeer", name, "-n", PROJECT)
            holder["obj"] = obj
            st = (obj or {}).get("status") or {}
            return st.get("state") == state, (f"state={st.get('state')!r} reason={st.get('reason')!r} "
                                              f"message={st.get('message')!r}" if obj else "no such ProjectPeer")

        self.until(f"STATE {state}", f"{k.prompt} kubectl -n {PROJECT} get projectpeer {name} -o json", probe,
                   timeout)
        return holder["obj"]

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None

    def read_connection_string(self, name: str) -> str:
        """Wait for a's ClusterPeer `name` to issue its string and read it as the guide says; shown shortened."""
        cmd = ("get", "clusterpeer", name, "-o", "jsonpath={.status.invite.connectionString}")

        def probe() -> tuple[bool, str]:
            done = self.a.run(*cmd, show=False)
            text = done.stdout.strip()
            return (done.returncode == 0 and text.startswith("d8peer")), (text[:40] or done.stderr.strip()
                                                                           or "empty")

        self.until("a connection string d8peer1....", f"a$ kubectl {_quote(list(cmd))}", probe)
        text = self.a.ok(self.step, *cmd, show=False).stdout.strip()
        self.out(f"a$ kubectl {_quote(list(cmd))}")
        self.out(shorten(text))
        return text

    # 1

    def step1_invite(self, name: str = "cluster-b") -> str:
        self.title("1", "Cluster a invites cluster b")
        self.a.ok(self.step, "apply", "-f", "-", stdin=invite_manifest(name))
        self.connection_string = self.read_connection_string(name)
        self.expect_row(self.a, ("get", "clusterpeers"), name, PHASE="Pending")
        return self.connection_string

    # 2

    def step2_join(self, name: str = "cluster-a", inviter: str = "cluster-b") -> None:
        self.title("2", "Cluster b joins with the connection string")
        self.say("the string travels to b's administrator over a secure channel")
        self.apply_join(name, self.connection_string)
        self.wait_peer(self.b, name, "Active", "True")
        self.wait_peer(self.a, inviter, "Active", "True")
        self.expect_row(self.b, ("get", "clusterpeers"), name, PHASE="Active", READY="True")
        self.expect_row(self.a, ("get", "clusterpeers"), inviter, PHASE="Active", READY="True")

    # 3

    def step3_capability(self, a_peer: str = "cluster-b", b_peer: str = "cluster-a") -> None:
        self.title("3", "Both clusters open the capability of the module mirror")
        for k in (self.a, self.b):
            k.ok(self.step, "apply", "-f", "-", stdin=module_manifest(), show=k is self.a)
        self.say("the same module, so the same PeeringCapability, is installed on b")
        for k in (self.a, self.b):
            def accepted(k: Kubectl = k) -> tuple[bool, str]:
                c = condition(k.get_optional("peeringcapability", CAPABILITY), "Accepted")
                return c.get("status") == "True", f"Accepted={c.get('status')!r} reason={c.get('reason')!r} " \
                                                  f"message={c.get('message')!r}"
            self.until("ACCEPTED True", f"{k.prompt} kubectl get peeringcapability {CAPABILITY}", accepted)
            self.expect_row(k, ("get", "peeringcapabilities"), CAPABILITY, ACCEPTED="True")
        patch = json.dumps({"spec": {"capabilities": [CAPABILITY]}})
        self.a.ok(self.step, "patch", "clusterpeer", a_peer, "--type=merge", "-p", patch)
        self.b.ok(self.step, "patch", "clusterpeer", b_peer, "--type=merge", "-p", patch)
        for k, name in ((self.a, a_peer), (self.b, b_peer)):
            def effective(k: Kubectl = k, name: str = name) -> tuple[bool, str]:
                obj = k.get_optional("clusterpeer", name)
                eff = ((obj or {}).get("status") or {}).get("effectiveCapabilities") or []
                return CAPABILITY in eff, f"effectiveCapabilities={eff!r}; {describe_peer(obj)}"
            self.until(f"EFFECTIVE lists {CAPABILITY}", f"{k.prompt} kubectl get clusterpeer {name} -o json",
                       effective)
        self.expect_row(self.a, ("get", "clusterpeers"), a_peer, PHASE="Active", READY="True", EFFECTIVE=CAPABILITY)
        self.expect_row(self.b, ("get", "clusterpeers"), b_peer, PHASE="Active", READY="True", EFFECTIVE=CAPABILITY)

    # 4

    def step4_projects(self, a_peer: str = "cluster-b", b_peer: str = "cluster-a") -> None:
        self.title("4", f"Project {PROJECT} exists on both clusters and pairs by itself")
        for k, c in ((self.a, "a"), (self.b, "b")):
            k.ok(self.step, "apply", "-f", "-", stdin=project_manifest(c), show=k is self.a)
        self.say("the same on b (its ConfigMap is price-list-b)")
        for k, name in ((self.a, a_peer), (self.b, b_peer)):
            self.wait_projectpeer(k, name, "Paired")
            self.expect_row(k, ("-n", PROJECT, "get", "projectpeers"), name, STATE="Paired")
        self.wait_grants(a_peer)

    def wait_grants(self, a_peer: str) -> None:
        """Wait until a's ClusterPeer lists the access it grants b's consumers in the project (status.grants)."""
        def probe() -> tuple[bool, str]:
            obj = self.a.get_optional("clusterpeer", a_peer)
            grants = ((obj or {}).get("status") or {}).get("grants") or []
            ok = any(g.get("capability") == CAPABILITY and PROJECT in (g.get("namespaces") or []) for g in grants)
            return ok, f"grants={grants!r}"

        cmd = ("get", "clusterpeer", a_peer, "-o", "jsonpath={.status.grants}{\"\\n\"}")
        self.until(f"{CAPABILITY} granted in namespace {PROJECT}", f"a$ kubectl {_quote(list(cmd))}", probe)
        self.a.ok(self.step, *cmd)

    # 5

    def consumer_kubeconfig(self, sa: str, b_peer: str = "cluster-a", name: str = "consumer") -> Kubectl:
        """A kubeconfig as the controller on b would build it: egress URL, CA and audience from b's
        `status.access`, a token of `sa` from `kubectl create token --audience`."""
        peer = self.b.get_json(self.step, "clusterpeer", b_peer)
        access = peer.get("status", {}).get("access") or {}
        audiences = {a.get("capability"): a.get("audience") for a in access.get("audiences") or []}
        if CAPABILITY not in audiences or not access.get("caBundle") or not access.get("endpoint"):
            raise StepFailed(self.step, f"b$ kubectl get clusterpeer {b_peer} -o jsonpath='{{.status.access}}'",
                             f"endpoint, caBundle and an audience for {CAPABILITY}", json.dumps(access)[:500])
        audience = audiences[CAPABILITY]
        args = ("create", "token", sa, "-n", MODULE_NS, "--audience", audience, "--duration", "10m")
        self.out(f"b$ kubectl {_quote(list(args))}")
        token = self.b.ok(self.step, *args, show=False).stdout.strip()
        self.out("(a token; not shown)")
        # kubectl cannot use the lab's resolver map: connect to the egress Service's address and name it for TLS.
        server = f"https://{self.lab.egress_address('b')}/peers/{b_peer}"
        path = write_token_kubeconfig(self.work / f"{name}.kubeconfig", server, access["caBundle"].encode(), token,
                                      tls_server_name=EGRESS_HOST)
        self.say(f"{name}: server {access['endpoint']} (here {server}), CA = status.access.caBundle")
        return Kubectl(f"b ({name})$", path, self._cache, self.out)

    def refused(self, k: Kubectl, *args: str) -> str:
        """Run a request that must be refused: kubectl fails and the server answered 403 (or 401)."""
        self.out(f"{k.prompt} kubectl {_quote(list(args))}")
        done = k.run(*args, "-v=6", show=False)
        errors = self._errors(done.stderr)
        if errors:
            self.out(errors)
        statuses = [m["status"] for m in _REQUEST_LOG.finditer(done.stderr)]
        if done.returncode == 0 or not statuses or not statuses[-1].startswith(("403", "401")):
            raise StepFailed(self.step, f"{k.prompt} kubectl {_quote(list(args))}", "refused: 403 Forbidden",
                             f"exit {done.returncode}, answers {statuses}: {(done.stdout + errors).strip()[:500]}")
        return errors

    def open_watch(self, new_configmap: str) -> None:
        """Start the consumer's `kubectl get configmaps -w` and see `new_configmap`, created on a, arrive."""
        assert self.consumer is not None
        consumer = self.consumer
        watch_args = ["get", "configmaps", "-n", PROJECT, "-w"]
        self.out(f"{consumer.prompt} kubectl {_quote(watch_args)} &")
        if self.watch is not None:
            self.watch.close()
        self.watch = Watch(consumer.argv(watch_args))
        if self.watch.wait_line(lambda line: line.startswith("price-list-a "), self.timeout) is None:
            raise StepFailed(self.step, f"{consumer.prompt} kubectl {_quote(watch_args)}",
                             "the table with price-list-a", "\n".join(self.watch.lines)[-800:] or "nothing")
        self.a.ok(self.step, "-n", PROJECT, "create", "configmap", new_configmap, "--from-literal=cluster=a")
        line = self.watch.wait_line(lambda line: line.startswith(new_configmap + " "), self.timeout)
        if line is None:
            raise StepFailed(self.step, f"{consumer.prompt} kubectl {_quote(watch_args)}",
                             f"a line for {new_configmap}", "\n".join(self.watch.lines)[-800:] or "nothing")
        self.out(f"{consumer.prompt} (watch) {line}")

    def step5_consumer(self, b_peer: str = "cluster-a") -> None:
        self.title("5", "The mirror controller on b reads ConfigMaps of project shop on a")
        self.consumer = consumer = self.consumer_kubeconfig(CONSUMER, b_peer)
        args = ("get", "configmaps", "-n", PROJECT)
        self.out(f"{consumer.prompt} kubectl {_quote(list(args))}")
        done = consumer.run(*args, "-v=6", show=False)
        crossing = [m for m in _REQUEST_LOG.finditer(done.stderr) if f"/namespaces/{PROJECT}/configmaps" in m["url"]]
        for m in crossing:
            self.out(f"  -> {m['verb']} {m['url']}  <- {m['status']}")
        if done.stdout.strip():
            self.out(done.stdout.rstrip())
        if done.returncode != 0 or "price-list-a" not in done.stdout or "price-list-b" in done.stdout:
            raise StepFailed(self.step, f"{consumer.prompt} kubectl {_quote(list(args))}",
                             "the ConfigMaps of shop on a (price-list-a), not b's",
                             f"exit {done.returncode}: {(done.stdout + self._errors(done.stderr)).strip()[:800]}")
        if not crossing or not all(m["status"].startswith("200") for m in crossing):
            raise StepFailed(self.step, f"{consumer.prompt} kubectl {_quote(list(args))} -v=6",
                             f"a GET of .../peers/{b_peer}/api/v1/namespaces/{PROJECT}/configmaps answered 200",
                             done.stderr.strip()[-800:])

        self.say("an open watch through the same path sees a change made on a")
        self.open_watch("price-list-a-autumn")

        self.say("what the capability does not grant is refused")
        self.refused(consumer, "get", "secrets", "-n", PROJECT)
        self.refused(consumer, "get", "configmaps", "-n", "default")
        self.refused(consumer, "-n", PROJECT, "create", "configmap", "from-b", "--from-literal=x=y")
        self.refused(consumer, "-n", PROJECT, "delete", "configmap", "price-list-a")
        self.say(f"and so is a ServiceAccount that is not a consumer of {CAPABILITY}")
        bystander = self.consumer_kubeconfig(BYSTANDER, b_peer, name="bystander")
        self.refused(bystander, "get", "configmaps", "-n", PROJECT)

    @staticmethod
    def _errors(stderr: str) -> str:
        """What kubectl says at its default verbosity, from the output of `-v=6`."""
        return "\n".join(line for line in stderr.splitlines() if line.startswith(("Error", "error:", "Warning")))

    # 6

    def step6_sensitive(self, a_peer: str = "cluster-b") -> None:
        self.title("6", "Someone without clusterpeers/sensitive sees <omitted>")
        self.a.ok(self.step, "apply", "-f", "-", stdin=auditor_manifest())
        token = self.a.ok(self.step, "create", "token", AUDITOR, "-n", "default", "--duration", "10m",
                          show=False).stdout.strip()
        admin = yaml.safe_load(self.lab.kubeconfig("a").read_text())["clusters"][0]["cluster"]
        path = write_token_kubeconfig(self.work / "auditor.kubeconfig", admin["server"],
                                      base64.b64decode(admin["certificate-authority-data"]), token,
                                      tls_server_name=admin.get("tls-server-name"))
        auditor = Kubectl("a (auditor)$", path, self._cache, self.out)
        can = auditor.run("auth", "can-i", "get", "clusterpeers", "--subresource=sensitive")
        if can.stdout.strip() != "no":
            raise StepFailed(self.step, "a (auditor)$ kubectl auth can-i get clusterpeers --subresource=sensitive",
                             "no",
                             (can.stdout + can.stderr).strip())
        cmd = ("get", "clusterpeer", a_peer, "-o", "jsonpath={.status.invite.connectionString}")
        if self.lab.apiserver == "real":
            # The masking is Deckhouse's own patch of kube-apiserver (x-kubernetes-sensitive-data): a stock
            # kube-apiserver shows the field to whoever may read the object.
            self.say("<omitted> is Deckhouse's patch of kube-apiserver, which a stock one lacks: not shown here")
            self.expect_row(auditor, ("get", "clusterpeers"), a_peer, PHASE="Active", READY="True")
            return
        done = auditor.ok(self.step, *cmd)
        if done.stdout.strip() != "<omitted>":
            raise StepFailed(self.step, f"a (auditor)$ kubectl {_quote(list(cmd))}", "<omitted>",
                             shorten(done.stdout.strip()) if done.stdout.strip() else "empty")
        self.expect_row(auditor, ("get", "clusterpeers"), a_peer, PHASE="Active", READY="True")

    # 7

    def step7_outage(self, a_peer: str = "cluster-b", b_peer: str = "cluster-a") -> None:
        self.title("7", "Cluster a's gateway goes away for a while")
        self.say("a's peering process stops (the lab stops it as a failed node would)")
        self.lab.stop_peering("a")
        self.wait_projectpeer(self.b, b_peer, "PeerUnreachable")
        self.expect_row(self.b, ("-n", PROJECT, "get", "projectpeers"), b_peer, STATE="PeerUnreachable")
        self.wait_peer(self.b, b_peer, "Active", "False", "PeerUnreachable")
        self.expect_row(self.b, ("get", "clusterpeers"), b_peer, PHASE="Active", READY="False")
        self.show_ready_message(self.b, b_peer)
        self.say("a comes back")
        self.lab.start_peering("a")
        self.wait_projectpeer(self.b, b_peer, "Paired")
        self.wait_peer(self.b, b_peer, "Active", "True")
        self.expect_row(self.b, ("-n", PROJECT, "get", "projectpeers"), b_peer, STATE="Paired")
        if self.consumer is not None:
            self.say("the consumer's watch broke with a's gateway; its controller watches again")
            self.open_watch("price-list-a-winter")

    # 8

    def step8_revoke(self, a_peer: str = "cluster-b", b_peer: str = "cluster-a") -> None:
        self.title("8", "Cluster a revokes the peering")
        if self.consumer is None or self.watch is None or self.watch.proc.poll() is not None:
            raise StepFailed(self.step, "(the consumer's watch of step 5)", "open", "not running")
        self.a.ok(self.step, "delete", "clusterpeer", a_peer)
        revoked_at = time.monotonic()
        code = self.watch.wait_exit(WATCH_END_SECONDS)
        took = time.monotonic() - revoked_at
        if code is None:
            raise StepFailed(self.step, f"{self.consumer.prompt} kubectl get configmaps -n {PROJECT} -w",
                             f"the watch ends within {WATCH_END_SECONDS:.0f}s of the deletion",
                             f"still open after {took:.2f}s")
        self.out(f"{self.consumer.prompt} (the watch ended {took:.2f}s after the deletion, exit {code})")
        self.refused(self.consumer, "get", "configmaps", "-n", PROJECT)
        self.wait_peer(self.b, b_peer, "Active", "False", "PeerRefusedCertificate")
        self.expect_row(self.b, ("get", "clusterpeers"), b_peer, PHASE="Active", READY="False")
        self.show_ready_message(self.b, b_peer)
        self.watch.close()
        self.watch = None

    # 9

    def step9_reenable(self, b_peer: str = "cluster-a") -> None:
        self.title("9", "The module is disabled and enabled again on b")
        self.disable_module("b")
        self.enable_module("b")
        self.wait_peer(self.b, b_peer, "Error", "False", "CredentialsFromOtherCA")
        self.expect_row(self.b, ("get", "clusterpeers"), b_peer, PHASE="Error", READY="False")
        self.show_ready_message(self.b, b_peer)

    def step9_anew(self, a_peer: str = "cluster-b", b_peer: str = "cluster-a") -> None:
        """After a re-enable: the peering established anew on both clusters, and the consumer reads again."""
        self.title("9", "The peering is established anew, as the guide says")
        self.b.ok(self.step, "delete", "clusterpeer", b_peer)
        if self.a.get_optional("clusterpeer", a_peer) is not None:
            self.a.ok(self.step, "delete", "clusterpeer", a_peer)
        self.a.ok(self.step, "apply", "-f", "-", stdin=invite_manifest(a_peer, capabilities=[CAPABILITY]))
        self.connection_string = self.read_connection_string(a_peer)
        self.apply_join(b_peer, self.connection_string, [CAPABILITY])
        for k, name in ((self.b, b_peer), (self.a, a_peer)):
            def effective(k: Kubectl = k, name: str = name) -> tuple[bool, str]:
                obj = k.get_optional("clusterpeer", name)
                c = condition(obj, "Ready")
                eff = ((obj or {}).get("status") or {}).get("effectiveCapabilities") or []
                done = (obj or {}).get("status", {}).get("phase") == "Active" and c.get("status") == "True"
                return done and CAPABILITY in eff, f"effectiveCapabilities={eff!r}; {describe_peer(obj)}"
            self.until(f"Active, Ready True, EFFECTIVE {CAPABILITY}", f"{k.prompt} kubectl get clusterpeer {name}",
                       effective)
        self.expect_row(self.b, ("get", "clusterpeers"), b_peer, PHASE="Active", READY="True", EFFECTIVE=CAPABILITY)
        self.wait_projectpeer(self.b, b_peer, "Paired")
        self.wait_grants(a_peer)
        self.say("the consumer takes the new CA from status.access and reads again")
        consumer = self.consumer_kubeconfig(CONSUMER, b_peer)
        done = consumer.ok(self.step, "get", "configmaps", "-n", PROJECT)
        if "price-list-a" not in done.stdout:
            raise StepFailed(self.step, f"{consumer.prompt} kubectl get configmaps -n {PROJECT}",
                             "the ConfigMaps of shop on a", done.stdout.strip()[:500])

    def disable_module(self, name: str) -> None:
        """What Deckhouse does when the module is disabled: the process stops and its namespace (with the
        peering CA and every peer Secret) is deleted."""
        k = self.a if name == "a" else self.b
        self.say(f"ModuleConfig peering: enabled: false on {name}")
        self.lab.stop_peering(name)
        k.ok(self.step, "delete", "namespace", NAMESPACE, "--timeout=20s")

    def enable_module(self, name: str) -> None:
        """What Deckhouse does when the module is enabled again: the chart's objects (namespace, ServiceAccount,
        RBAC), user-authn's Dex client Secret, and the process with the new ServiceAccount's token."""
        k = self.a if name == "a" else self.b
        cluster = self.lab.cluster(name)
        self.say(f"ModuleConfig peering: enabled: true on {name}")
        chart = yaml.safe_dump_all(cluster.chart_objects(), sort_keys=False)
        k.ok(self.step, "apply", "--server-side", "--force-conflicts", "--field-manager=deckhouse", "-f", "-",
             stdin=chart, show=False)
        # user-authn writes the Secret of the chart's DexClient again (Dex keeps the client, whose ID is derived).
        dex_client = dex_client_secret(MODULE_DEX_CLIENT_NAME, NAMESPACE, cluster.dex_client_secret)
        k.ok(self.step, "apply", "-f", "-", stdin=json.dumps(dex_client), show=False)
        token = k.ok(self.step, "create", "token", "peering", "-n", NAMESPACE, "--duration", "24h",
                     show=False).stdout.strip()
        doc = yaml.safe_load(module_kubeconfig(cluster).read_text())
        doc["users"][0]["user"] = {"token": token}
        write_private(module_kubeconfig(cluster), yaml.safe_dump(doc, sort_keys=False))
        self.lab.start_peering(name)

    # refusals of a join

    def join_refusals(self) -> None:
        """An expired string, a used string and a string for another cluster each end, on the joining side, in
        their own reason within seconds. Needs a used string: run after step 2."""
        self.title("J", "Connection strings that cannot be used")
        self.say("a string past its expiry")
        expired = expired_copy(self.connection_string)
        self.apply_join("stale", expired)
        self.report_refusal("stale", "Expired")
        self.say("the string b already used, again")
        self.apply_join("again", self.connection_string)
        self.report_refusal("again", "TokenUsed")
        self.say("a string a issued for another cluster only")
        self.a.ok(self.step, "apply", "-f", "-",
                  stdin=invite_manifest("cluster-c", expected_cluster_uuid=str(uuid.uuid4())))
        other = self.read_connection_string("cluster-c")
        self.apply_join("for-c", other)
        self.report_refusal("for-c", "ClusterNotExpected")
        reasons = {"stale": "Expired", "again": "TokenUsed", "for-c": "ClusterNotExpected"}
        self.expect_rows(self.b, ("get", "clusterpeers", *reasons, "-o", "custom-columns=NAME:.metadata.name,"
                                  "PHASE:.status.phase,REASON:.status.conditions[?(@.type==\"Ready\")].reason"),
                         {name: {"PHASE": "Error", "REASON": reason} for name, reason in reasons.items()})
        self.b.ok(self.step, "delete", "clusterpeer", "stale", "again", "for-c")
        self.a.ok(self.step, "delete", "clusterpeer", "cluster-c")

    def report_refusal(self, name: str, reason: str) -> None:
        self.wait_peer(self.b, name, "Error", "False", reason, timeout=min(self.timeout, 10.0))
        self.show_ready_message(self.b, name)

    # the demo

    def run_demo(self) -> None:
        self.step1_invite()
        self.step2_join()
        self.step3_capability()
        self.step4_projects()
        self.step5_consumer()
        self.step6_sensitive()
        self.step7_outage()
        self.step8_revoke()
        self.step9_reenable()
        self.step9_anew()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--keep", metavar="DIR", help="keep the lab's files (kubeconfigs, logs) in DIR")
    parser.add_argument("--apiserver", choices=("emulator", "real"), default="emulator",
                        help="the clusters' API servers: the lab's emulator (default) or a real kube-apiserver")
    args = parser.parse_args(argv)
    started = time.monotonic()
    # SIGTERM ends the demo the way Ctrl-C does, so that the lab is stopped on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print("Deckhouse peering module: the administrator's guide on two lab clusters, a and b.")
    with contextlib.ExitStack() as stack:
        work = pathlib.Path(args.keep) if args.keep else pathlib.Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="peering-demo-")))
        work.mkdir(parents=True, exist_ok=True)
        lab: LabThread | None = None
        story: Story | None = None
        try:
            print(f"Starting the lab in {work} ...", flush=True)
            lab = LabThread(work / "lab", ["a", "b"], apiserver=args.apiserver)
            lab.__enter__()
            print(f"Clusters a and b are up ({time.monotonic() - started:.1f}s). "
                  f"Each `x$` line runs kubectl with cluster x's admin kubeconfig.")
            story = Story(lab, work / "story", out=lambda s: print(s, flush=True))
            story.run_demo()
        except StepFailed as e:
            print(f"\nFAILED at {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("\ninterrupted; stopping the lab", file=sys.stderr)
            return 130
        except Exception as e:
            print(f"\nFAILED: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        finally:
            # A second Ctrl-C must not cut the teardown short and leave processes behind.
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            try:
                if story is not None:
                    story.close()
                if lab is not None:
                    lab.close()
                    print("The lab is stopped.")
            finally:
                signal.signal(signal.SIGINT, previous)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        print(f"\nDone in {time.monotonic() - started:.0f}s. On Deckhouse clusters, enable the module on both:")
        print("  apiVersion: deckhouse.io/v1alpha1, kind: ModuleConfig, metadata.name: peering, spec.enabled: true")
        print("  then follow the same steps with `d8 k` on both clusters (docs/guide-scenario.md).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
