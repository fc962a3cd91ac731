"""What the clusters went through while a scenario ran, held against what its steps caused.

`Transitions` watches, with kubectl on each cluster, every ClusterPeer's Ready condition and every ProjectPeer's
STATE, and reads the Warning Events. A healthy peering goes through establishing reasons (InvitePending,
CredentialsPending, Joining) to Ready True and stays there; a pair goes to Paired and stays there. Anything else (a
Warning Event, a Ready=False or a PeerUnreachable after the first good state) must be one a step caused: the
scenario says so with `caused(cluster, kind, name, reason)` after the step, and `unexplained()` lists the rest.
Objects are told apart by uid, so that a peering made anew under the same name starts clean.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import subprocess
import threading
import time

from control.events import REPORTING_CONTROLLER
from lab.demo.kubectl import Kubectl

#: Ready=False reasons of a peering that is still being established (rules/conditions.py).
ESTABLISHING = frozenset({"InvitePending", "CredentialsPending", "Joining"})
SEP = "\x1f"
CLUSTERPEER_LINE = (f"{{.metadata.name}}{SEP}{{.metadata.uid}}{SEP}"
                    f"{{.status.conditions[?(@.type==\"Ready\")].status}}{SEP}"
                    f"{{.status.conditions[?(@.type==\"Ready\")].reason}}{{\"\\n\"}}")
PROJECTPEER_LINE = (f"{{.metadata.namespace}}/{{.metadata.name}}{SEP}{{.metadata.uid}}{SEP}{{.status.state}}{SEP}"
                    f"{{.status.reason}}{{\"\\n\"}}")


@dataclasses.dataclass(frozen=True)
class Seen:
    """One thing an object went through that a healthy run has no cause for."""

    cluster: str
    kind: str
    name: str
    uid: str
    reason: str
    what: str

    def __str__(self) -> str:
        return f"{self.cluster}: {self.kind} {self.name} ({self.uid[:8]}): {self.what} {self.reason}"


class _Watch:
    """`kubectl get <kind> -w -o jsonpath=...`, one line per event, read in a thread."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: "queue.Queue[str]" = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="kubectl-transitions", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def drain(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self.lines.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
        _, err = self.proc.communicate()
        self._reader.join(5)
        return err or ""


class Transitions:
    def __init__(self, clusters: dict[str, Kubectl]) -> None:
        self.clusters = clusters
        self.allowed: set[tuple[str, str, str, str]] = set()  # (cluster, kind, uid, reason)
        self.seen: list[Seen] = []
        self._uids: dict[tuple[str, str, str], str] = {}  # (cluster, kind, name): the uid it has now
        self._good: set[tuple[str, str, str]] = set()  # (cluster, kind, uid) that reached its good state
        self._watches: list[tuple[str, str, _Watch]] = []
        for cluster, k in clusters.items():
            self._watches.append((cluster, "ClusterPeer", _Watch(k.argv(
                ["get", "clusterpeers", "--watch", "-o", f"jsonpath={CLUSTERPEER_LINE}"]))))
            self._watches.append((cluster, "ProjectPeer", _Watch(k.argv(
                ["get", "projectpeers", "--all-namespaces", "--watch", "-o", f"jsonpath={PROJECTPEER_LINE}"]))))

    def _read(self) -> None:
        for cluster, kind, watch in self._watches:
            for line in watch.drain():
                parts = line.split(SEP)
                if len(parts) != 4 or not parts[1]:
                    continue
                name, uid, state, reason = parts
                self._uids[(cluster, kind, name)] = uid
                good = state == ("True" if kind == "ClusterPeer" else "Paired")
                key = (cluster, kind, uid)
                if good:
                    self._good.add(key)
                elif not state:
                    continue  # no status yet
                elif key in self._good or (kind == "ClusterPeer" and reason not in ESTABLISHING):
                    what = "Ready=False" if kind == "ClusterPeer" else f"STATE {state}"
                    self.seen.append(Seen(cluster, kind, name, uid, reason or state, what))
        for cluster, k in self.clusters.items():
            done = k.run("get", "events", "--all-namespaces", "-o", "json", show=False)
            assert done.returncode == 0, done.stderr
            for event in json.loads(done.stdout).get("items") or []:
                # The module's own (kube-apiserver's controllers report on the lab's objects too).
                if event.get("type") != "Warning" or event.get("reportingComponent") != REPORTING_CONTROLLER:
                    continue
                obj = event.get("involvedObject") or {}
                name = f"{obj['namespace']}/{obj.get('name', '')}" if obj.get("namespace") else obj.get("name", "")
                seen = Seen(cluster, obj.get("kind", ""), name, obj.get("uid", ""), event.get("reason", ""),
                            "Warning Event")
                if seen not in self.seen:
                    self.seen.append(seen)

    def caused(self, cluster: str, kind: str, name: str, *reasons: str) -> None:
        """A step caused `kind` `name` (as it is now: its uid) on `cluster` to go to each of `reasons` (a Ready
        reason, or the pair's state and its Warning Events' reasons)."""
        self._read()
        uid = self._uids.get((cluster, kind, name))
        assert uid, f"{cluster} has no {kind} {name} to have caused anything to"
        self.allowed.update((cluster, kind, uid, reason) for reason in reasons)

    def unexplained(self) -> list[Seen]:
        """What no step caused, of everything seen so far (read afresh now)."""
        self._read()
        return [s for s in self.seen if (s.cluster, s.kind, s.uid, s.reason) not in self.allowed]

    def assert_explained(self, after: str, settle: float = 2.0) -> None:
        """Everything seen is caused, now and `settle` seconds later (a late Event or transition counts too)."""
        deadline = time.monotonic() + settle
        while True:
            left = self.unexplained()
            assert not left, f"after {after}, not caused by any step:\n" + "\n".join(map(str, left))
            if time.monotonic() >= deadline:
                return
            time.sleep(0.2)  # bounded poll: the watches and Events of other processes

    def close(self) -> None:
        for _, _, watch in self._watches:
            watch.close()
