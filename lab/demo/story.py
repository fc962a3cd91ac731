"""The administrator's guide as the demo tells it: `Story`, one method per step, on clusters a (inviting) and b
(joining). The scenario test (tests/e2e/test_guide_scenario.py) runs the very same methods, so what the demo shows
is what the suite proves."""

from __future__ import annotations

import base64
import json
import time
import uuid

import yaml

from lab.cluster import NAMESPACE, READY_TIMEOUT
from lab.demo.checks import Checks
from lab.demo.failure import StepFailed
from lab.demo.kubectl import REQUEST_LOG, Kubectl, condition, describe_peer, errors_of, quote
from lab.demo.manifests import (AUDITOR, BYSTANDER, CAPABILITY, CONSUMER, PROJECT, auditor_manifest, expired_copy,
                                invite_manifest, module_config_manifest, module_manifest, project_manifest, shorten,
                                write_token_kubeconfig)
from lab.module_webhook import ALLOW_DISABLING, DISABLE_SUFFIX

# The guide's promise for an open watch of a revoked peer.
WATCH_END_SECONDS = 1.0


class Story(Checks):
    """The administrator's guide, step by step, on clusters a (inviting) and b (joining).

    Each step checks what the guide promises and raises `StepFailed` otherwise. Steps build on each other in
    the order of their numbers; `run_demo` runs the ones `make demo` shows.
    """

    # 0

    def step0_enable(self) -> None:
        self.title("0", "The module is enabled on both clusters")
        for k in (self.a, self.b):
            k.ok(self.step, "apply", "-f", "-", stdin=module_config_manifest(), show=k is self.a)
        self.say("the same on b")
        for k in (self.a, self.b):
            self.wait_module(k, "PHASE Ready", lambda m: (m.get("status") or {}).get("phase") == "Ready")
            self.expect_row(k, ("get", "module", "peering"), "peering", PHASE="Ready", ENABLED="True")

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
        self.create_join(name, self.connection_string)
        self.expect_no_copy(name, self.connection_string)
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

    # 5

    def step5_consumer(self, b_peer: str = "cluster-a") -> None:
        self.title("5", "The mirror controller on b reads ConfigMaps of project shop on a")
        self.consumer = consumer = self.consumer_kubeconfig(CONSUMER, b_peer)
        args = ("get", "configmaps", "-n", PROJECT)
        self.out(f"{consumer.prompt} kubectl {quote(list(args))}")
        done = consumer.run(*args, "-v=6", show=False)
        crossing = [m for m in REQUEST_LOG.finditer(done.stderr) if f"/namespaces/{PROJECT}/configmaps" in m["url"]]
        for m in crossing:
            self.out(f"  -> {m['verb']} {m['url']}  <- {m['status']}")
        if done.stdout.strip():
            self.out(done.stdout.rstrip())
        if done.returncode != 0 or "price-list-a" not in done.stdout or "price-list-b" in done.stdout:
            raise StepFailed(self.step, f"{consumer.prompt} kubectl {quote(list(args))}",
                             "the ConfigMaps of shop on a (price-list-a), not b's",
                             f"exit {done.returncode}: {(done.stdout + errors_of(done.stderr)).strip()[:800]}")
        if not crossing or not all(m["status"].startswith("200") for m in crossing):
            raise StepFailed(self.step, f"{consumer.prompt} kubectl {quote(list(args))} -v=6",
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
            raise StepFailed(self.step, f"a (auditor)$ kubectl {quote(list(cmd))}", "<omitted>",
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
        self.disable_module(self.b)
        self.enable_module(self.b)
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
        self.create_join(b_peer, self.connection_string, [CAPABILITY])
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


    def disable_module(self, k: Kubectl) -> None:
        """The guide's "Disabling the module": refused without the annotation; with it the module's objects go (its
        namespace with the peering CA and every peer Secret), its CRDs and the ClusterPeers stay."""
        patch = ("patch", "moduleconfig", "peering", "--type=merge", "-p", '{"spec":{"enabled":false}}')
        self.say("enabled: false alone is refused")
        done = k.run(*patch)
        if done.returncode == 0 or DISABLE_SUFFIX not in done.stderr:
            raise StepFailed(self.step, f"{k.prompt} {k.command(patch)}", f"refused: ...{DISABLE_SUFFIX}",
                             f"exit {done.returncode}: {(done.stderr or done.stdout).strip()}")
        self.say("with the annotation the module is disabled")
        k.ok(self.step, "annotate", "moduleconfig", "peering", f"{ALLOW_DISABLING}=true")
        k.ok(self.step, *patch)
        self.wait_module(k, "ENABLED False", lambda m: _condition(m, "EnabledByModuleManager") == "False")
        self.wait_gone(k, "namespace", NAMESPACE)
        self.expect_row(k, ("get", "module", "peering"), "peering", ENABLED="False")
        k.ok(self.step, "get", "crd", "clusterpeers.peering.deckhouse.io")

    def enable_module(self, k: Kubectl) -> None:
        """The guide's "Enabling the module": the ModuleConfig, then `kubectl get module peering` until PHASE Ready."""
        k.ok(self.step, "apply", "-f", "-", stdin=module_config_manifest())
        self.wait_module(k, "PHASE Ready", lambda m: (m.get("status") or {}).get("phase") == "Ready")
        self.expect_row(k, ("get", "module", "peering"), "peering", PHASE="Ready", ENABLED="True")

    def wait_module(self, k: Kubectl, what: str, done) -> None:
        """Until the Module `done`. The module manager keeps it Reconciling while the module's process starts,
        which it allows READY_TIMEOUT before it says Error; the wait allows as much, so that a slow start on a
        loaded machine is told from a failed one by the Module's own phase."""
        def probe() -> tuple[bool, str]:
            module = k.get_optional("module", "peering") or {}
            status = module.get("status") or {}
            seen = f"phase={status.get('phase')!r} conditions=" + ", ".join(
                f"{c.get('type')}={c.get('status')} {c.get('message') or ''}".rstrip()
                for c in status.get("conditions") or [])
            if status.get("phase") == "Error" and not done(module):
                raise StepFailed(self.step, command, what, seen)  # the module manager gave up: no use waiting
            return bool(done(module)), seen
        command = f"{k.prompt} kubectl get module peering"
        self.until(what, command, probe, timeout=max(self.timeout, READY_TIMEOUT))

    def wait_gone(self, k: Kubectl, *what: str) -> None:
        def probe() -> tuple[bool, str]:
            done = k.run("get", *what, "-o", "name", show=False)
            return done.returncode != 0 and "NotFound" in done.stderr, (done.stdout + done.stderr).strip()
        self.until(f"{' '.join(what)} gone", f"{k.prompt} kubectl get {' '.join(what)}", probe)

    # refusals of a join

    def join_refusals(self) -> None:
        """An expired string, a used string and a string for another cluster each end, on the joining side, in
        their own reason within seconds. Needs a used string: run after step 2."""
        self.title("J", "Connection strings that cannot be used")
        self.say("a string past its expiry")
        expired = expired_copy(self.connection_string)
        self.create_join("stale", expired)
        self.report_refusal("stale", "Expired")
        self.say("the string b already used, again")
        self.create_join("again", self.connection_string)
        self.report_refusal("again", "TokenUsed")
        self.say("a string a issued for another cluster only")
        self.a.ok(self.step, "apply", "-f", "-",
                  stdin=invite_manifest("cluster-c", expected_cluster_uuid=str(uuid.uuid4())))
        other = self.read_connection_string("cluster-c")
        self.create_join("for-c", other)
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
        self.step0_enable()
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


def _condition(module: dict, ctype: str) -> str | None:
    return condition(module, ctype).get("status")
