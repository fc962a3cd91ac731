"""What a step of the story is made of: show a kubectl command and its output, wait (a bounded poll) until the
clusters reach the state the guide describes, check a table's row, and raise `StepFailed` naming the command, what
was expected and what came back. `Checks` holds them; `lab.demo.story.Story` tells the steps with them."""

from __future__ import annotations

import json
import pathlib
import time
from typing import Callable

from lab.cluster import EGRESS_HOST
from lab.demo.failure import StepFailed
from lab.demo.harness import POLL_INTERVAL, LabThread
from lab.demo.kubectl import REQUEST_LOG, Kubectl, Watch, condition, describe_peer, errors_of, parse_table, quote
from lab.demo.manifests import CAPABILITY, MODULE_NS, PROJECT, join_manifest, shorten, write_token_kubeconfig

# How long a step waits for the clusters to reach the state the guide describes.
STEP_TIMEOUT = 20.0


class Checks:
    """The helpers of the steps, on clusters a (inviting) and b (joining): `a` and `b` are kubectl with each one's
    admin kubeconfig; `step` names the step running, for its `StepFailed`."""

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

    def create_join(self, name: str, connection_string: str, capabilities: list[str] | None = None) -> None:
        """`b$ kubectl create` a Join ClusterPeer; the one-time string is shown shortened, sent in full. Created,
        not applied: kubectl's client-side apply would copy the string into the annotation
        kubectl.kubernetes.io/last-applied-configuration, which every reader of ClusterPeers can read (and the
        module's admission policy refuses it, or strips it where the API server serves MutatingAdmissionPolicy)."""
        shown = join_manifest(name, shorten(connection_string), capabilities)
        self.out(f"b$ kubectl create -f - <<EOF\n{shown.rstrip()}\nEOF")
        done = self.b.ok(self.step, "create", "-f", "-", stdin=join_manifest(name, connection_string, capabilities),
                         show=False)
        self.out(done.stdout.rstrip())

    def expect_no_copy(self, name: str, connection_string: str) -> None:
        """b's ClusterPeer `name`, as b's admin reads it, holds the string in spec.join.connectionString only: no
        annotation, managed field or status copies it (docs/guide-scenario.md, step 2)."""
        obj = self.b.get_json(self.step, "clusterpeer", name)
        rest = json.loads(json.dumps(obj))
        rest.get("spec", {}).get("join", {}).pop("connectionString", None)
        if connection_string in json.dumps(rest):
            found = [k for k in ("metadata", "status") if connection_string in json.dumps(rest.get(k))]
            raise StepFailed(self.step, f"b$ kubectl get clusterpeer {name} -o json",
                             "the connection string in spec.join.connectionString only",
                             f"a copy in {', '.join(found) or 'the object'}")

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

        self.until("a connection string d8peer1....", f"a$ kubectl {quote(list(cmd))}", probe)
        text = self.a.ok(self.step, *cmd, show=False).stdout.strip()
        self.out(f"a$ kubectl {quote(list(cmd))}")
        self.out(shorten(text))
        return text

    def wait_grants(self, a_peer: str) -> None:
        """Wait until a's ClusterPeer lists the access it grants b's consumers in the project (status.grants)."""
        def probe() -> tuple[bool, str]:
            obj = self.a.get_optional("clusterpeer", a_peer)
            grants = ((obj or {}).get("status") or {}).get("grants") or []
            ok = any(g.get("capability") == CAPABILITY and PROJECT in (g.get("namespaces") or []) for g in grants)
            return ok, f"grants={grants!r}"

        cmd = ("get", "clusterpeer", a_peer, "-o", "jsonpath={.status.grants}{\"\\n\"}")
        self.until(f"{CAPABILITY} granted in namespace {PROJECT}", f"a$ kubectl {quote(list(cmd))}", probe)
        self.a.ok(self.step, *cmd)

    # a consumer on b

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
        self.out(f"b$ kubectl {quote(list(args))}")
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
        self.out(f"{k.prompt} kubectl {quote(list(args))}")
        done = k.run(*args, "-v=6", show=False)
        errors = errors_of(done.stderr)
        if errors:
            self.out(errors)
        statuses = [m["status"] for m in REQUEST_LOG.finditer(done.stderr)]
        if done.returncode == 0 or not statuses or not statuses[-1].startswith(("403", "401")):
            raise StepFailed(self.step, f"{k.prompt} kubectl {quote(list(args))}", "refused: 403 Forbidden",
                             f"exit {done.returncode}, answers {statuses}: {(done.stdout + errors).strip()[:500]}")
        return errors

    def open_watch(self, new_configmap: str) -> None:
        """Start the consumer's `kubectl get configmaps -w` and see `new_configmap`, created on a, arrive."""
        assert self.consumer is not None
        consumer = self.consumer
        watch_args = ["get", "configmaps", "-n", PROJECT, "-w"]
        self.out(f"{consumer.prompt} kubectl {quote(watch_args)} &")
        if self.watch is not None:
            self.watch.close()
        self.watch = Watch(consumer.argv(watch_args))
        if self.watch.wait_line(lambda line: line.startswith("price-list-a "), self.timeout) is None:
            raise StepFailed(self.step, f"{consumer.prompt} kubectl {quote(watch_args)}",
                             "the table with price-list-a", "\n".join(self.watch.lines)[-800:] or "nothing")
        self.a.ok(self.step, "-n", PROJECT, "create", "configmap", new_configmap, "--from-literal=cluster=a")
        line = self.watch.wait_line(lambda line: line.startswith(new_configmap + " "), self.timeout)
        if line is None:
            raise StepFailed(self.step, f"{consumer.prompt} kubectl {quote(watch_args)}",
                             f"a line for {new_configmap}", "\n".join(self.watch.lines)[-800:] or "nothing")
        self.out(f"{consumer.prompt} (watch) {line}")
