"""The administrator's guide's kubectl commands against both backends: what kubectl prints and its exit code are
compared, with ages and tokens reduced to their form. kubectl is the client here, so this also covers what it
asks for that the other cases do not name (its discovery, OpenAPI for explain, apply's patches)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import pathlib
import re
import sys

import pytest
import pytest_asyncio
from differential_support import ADMIN, Backend, User

from lab.apiserver.testing import write_kubeconfig

pytestmark = pytest.mark.asyncio(loop_scope="module")

KUBECTL = str(pathlib.Path(sys.executable).with_name("kubectl"))
NS = "diff-kubectl"
ALICE = User("diff-kc-alice")
AGE = re.compile(r"(?<=\s)\d+(\.\d+)?(s|m|h|d)\d*(s|m)?(?=\s|$)")


SERVED_GROUPS = ("v1", "peering.deckhouse.io", "deckhouse.io", "rbac.authorization.k8s.io", "coordination.k8s.io",
                 "authentication.k8s.io", "authorization.k8s.io", "events.k8s.io", "apiextensions.k8s.io")


def invite(name: str, **spec) -> str:
    return json.dumps({"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                       "metadata": {"name": name}, "spec": {"type": "Invite", **spec}})


class Kubectl:
    """kubectl for one backend and one user, each with its own discovery cache; run in this event loop (the
    emulator serves from it)."""

    def __init__(self, backend: Backend, home: pathlib.Path) -> None:
        self.backend = backend
        self.home = home
        self._configs: dict = {}

    def kubeconfig(self, who) -> pathlib.Path:
        if who not in self._configs:
            cert = self.backend.pki.admin if who == ADMIN else self.backend.cert(who)
            self._configs[who] = write_kubeconfig(self.home / f"kubeconfig-{getattr(who, 'name', who)}",
                                                  self.backend.url, self.backend.pki.public_ca.cert_pem,
                                                  cert.cert_pem, cert.key_pem)
        return self._configs[who]

    async def __call__(self, *args: str, who=ADMIN, stdin: str | None = None) -> dict:
        env = dict(os.environ, HOME=str(self.home), KUBECONFIG=str(self.kubeconfig(who)))
        proc = await asyncio.create_subprocess_exec(
            KUBECTL, "--cache-dir", str(self.home / f"cache-{getattr(who, 'name', who)}"), *args, env=env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), 60)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        return {"command": "kubectl " + " ".join(args), "exit": proc.returncode,
                "stdout": self._clean(out.decode()), "stderr": self._clean(err.decode())}

    def _clean(self, text: str) -> str:
        text = AGE.sub("<age>", text.replace(self.backend.url, "<server>"))
        # kubectl lists an Invalid answer's causes one per "* " line, in the order the server gave them, which
        # kube-apiserver does not keep stable (Go map order): each run of them is compared sorted.
        lines, out, run = text.split("\n"), [], []
        for line in lines + [None]:
            if line is not None and line.startswith("* "):
                run.append(line)
                continue
            out += sorted(run)
            run = []
            if line is not None:
                out.append(line)
        return "\n".join(out)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def kubectl(pair, tmp_path_factory):
    tools = {b.name: Kubectl(b, tmp_path_factory.mktemp(f"kubectl-{b.name}")) for b in (pair.emulator, pair.real)}
    for b in (pair.emulator, pair.real):
        k = tools[b.name]
        for doc in ({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "kc-sa", "namespace": NS}},
                    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                     "metadata": {"name": "diff-kc-reader"},
                     "rules": [{"apiGroups": ["peering.deckhouse.io"], "resources": ["clusterpeers"],
                                "verbs": ["get", "list"]}]},
                    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                     "metadata": {"name": "diff-kc-reader"},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                 "name": "diff-kc-reader"},
                     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": ALICE.name}]}):
            done = await k("create", "-f", "-", stdin=json.dumps(doc))
            assert done["exit"] == 0, done
    return pair, tools


async def both(kubectl, steps) -> None:
    """Run `steps(k)` (a list of kubectl runs) with each backend's kubectl; every run must print the same."""
    pair, tools = kubectl

    async def case(b: Backend):
        return {f"{i}: {r['command']}": r for i, r in enumerate(await steps(tools[b.name]))}

    await pair.run(case)


async def test_apply_get_patch_delete_a_clusterpeer(kubectl):
    async def steps(k: Kubectl):
        return [
            await k("apply", "-f", "-", stdin=invite("kc-a", capabilities=["c1"])),
            await k("apply", "-f", "-", stdin=invite("kc-a", capabilities=["c1"])),
            await k("apply", "-f", "-", stdin=invite("kc-a", capabilities=["c1", "c2"], invite={"tokenTTL": "1h"})),
            await k("get", "clusterpeers"),
            await k("get", "clusterpeers", "-o", "wide"),
            await k("get", "cpeer", "kc-a", "-o", "jsonpath={.spec}"),
            await k("get", "clusterpeer", "kc-a", "-o", "custom-columns=NAME:.metadata.name,TTL:.spec.invite.tokenTTL"),
            await k("patch", "clusterpeer", "kc-a", "--type=merge", "-p", '{"spec":{"capabilities":["c3"]}}'),
            await k("patch", "clusterpeer", "kc-a", "--type=merge", "-p", '{"spec":{"capabilities":["c3"]}}'),
            await k("patch", "clusterpeer", "kc-a", "--type=merge", "-p", '{"spec":{"type":"Join"}}'),
            await k("patch", "clusterpeer", "kc-a", "-p", '{"spec":{"capabilities":["c4"]}}'),
            await k("patch", "clusterpeer", "kc-a", "--type=json",
                    "-p", '[{"op":"replace","path":"/spec/capabilities/0","value":"c5"}]'),
            await k("label", "clusterpeer", "kc-a", "team=a"),
            await k("get", "clusterpeers", "-l", "team=a", "-o", "name"),
            await k("delete", "clusterpeer", "kc-a"),
            await k("get", "clusterpeer", "kc-a"),
            await k("delete", "clusterpeer", "kc-a"),
        ]

    await both(kubectl, steps)


async def test_refusals_kubectl_shows(kubectl):
    async def steps(k: Kubectl):
        return [
            await k("apply", "-f", "-", stdin=json.dumps({"apiVersion": "peering.deckhouse.io/v1alpha1",
                                                          "kind": "ClusterPeer", "metadata": {"name": "kc-bad"},
                                                          "spec": {"type": "Sideways", "capabilities": ["x" * 70]}})),
            await k("apply", "-f", "-", stdin=invite("kc-bad", colour="blue")),
            await k("apply", "-f", "-", stdin=invite("kc-bad", invite={"tokenTTL": "5m"})),
            await k("get", "secrets", "-n", NS, who=ALICE),
            await k("delete", "clusterpeer", "anything", who=ALICE),
            await k("get", "clusterpeers", who=ALICE),
            await k("get", "projectpeers", "-n", NS),
            await k("get", "nothings"),
        ]

    await both(kubectl, steps)


async def test_server_side_apply_as_deckhouse_does(kubectl):
    cm = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kc-cm", "namespace": NS},
                     "data": {"a": "1"}})
    cm2 = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kc-cm", "namespace": NS},
                      "data": {"a": "2"}})

    async def steps(k: Kubectl):
        return [
            await k("apply", "--server-side", "--field-manager=deckhouse", "-f", "-", stdin=cm),
            await k("apply", "--server-side", "--field-manager=other", "-f", "-", stdin=cm2),
            await k("apply", "--server-side", "--force-conflicts", "--field-manager=other", "-f", "-", stdin=cm2),
            await k("get", "configmap", "kc-cm", "-n", NS, "-o", "jsonpath={.data}"),
            await k("apply", "--server-side", "--field-manager=deckhouse", "-f", "-", stdin=invite("kc-ssa")),
            await k("-n", NS, "create", "configmap", "kc-literal", "--from-literal=cluster=a"),
            await k("-n", NS, "get", "configmaps", "kc-literal", "kc-cm"),
            await k("delete", "clusterpeer", "kc-ssa"),
        ]

    await both(kubectl, steps)


def claims(token: str) -> dict:
    body = token.strip().split(".")[1]
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))


async def test_tokens_and_who_may_do_what(kubectl):
    async def steps(k: Kubectl):
        made = await k("create", "token", "kc-sa", "-n", NS, "--audience", "peering-test", "--duration", "10m")
        token_claims = claims(made["stdout"]) if made["exit"] == 0 else {}
        for key in ("exp", "iat", "nbf", "jti"):
            token_claims[key] = f"<{key}>" if key in token_claims else None
        token_claims.get("kubernetes.io", {}).get("serviceaccount", {})["uid"] = "<uid>"
        made["stdout"] = json.dumps(token_claims, sort_keys=True)
        whoami = await k("auth", "whoami", "-o", "json", who=ALICE)
        if whoami["exit"] == 0:
            info = json.loads(whoami["stdout"])
            info["metadata"]["creationTimestamp"] = "<time>"
            whoami["stdout"] = json.dumps(info, sort_keys=True)
        return [
            made,
            await k("create", "token", "kc-sa", "-n", NS, "--duration", "1m"),
            await k("create", "token", "kc-nobody", "-n", NS),
            await k("auth", "can-i", "get", "clusterpeers", who=ALICE),
            await k("auth", "can-i", "get", "clusterpeers", "--subresource=sensitive", who=ALICE),
            await k("auth", "can-i", "delete", "clusterpeers", who=ALICE),
            await k("auth", "can-i", "get", "clusterpeers", "--subresource=sensitive"),
            await k("auth", "can-i", "create", "configmaps", "-n", NS, "--as", "system:serviceaccount:x:y"),
            whoami,
        ]

    await both(kubectl, steps)


async def test_discovery_explain_and_version(kubectl):
    async def steps(k: Kubectl):
        version = await k("version", "-o", "json")
        if version["exit"] == 0:
            server = json.loads(version["stdout"])["serverVersion"]
            version["stdout"] = json.dumps({k2: v for k2, v in server.items() if k2 not in ("buildDate", "goVersion")},
                                           sort_keys=True)
        # The emulator serves the groups the module and the lab use, not all of kube-apiserver's (lab/README.md).
        versions = await k("api-versions")
        versions["stdout"] = "".join(line + "\n" for line in versions["stdout"].splitlines()
                                     if line.split("/")[0] in SERVED_GROUPS)
        return [
            version,
            await k("api-resources", "--api-group=peering.deckhouse.io"),
            await k("api-resources", "--api-group=deckhouse.io", "-o", "wide"),
            versions,
            await k("explain", "clusterpeer.spec"),
            await k("explain", "clusterpeer.status.conditions"),
            await k("explain", "peeringcapability.spec.consumers", "--recursive"),
        ]

    await both(kubectl, steps)


async def test_a_namespace_deleted_and_waited_for(kubectl):
    async def steps(k: Kubectl):
        return [
            await k("create", "namespace", "diff-kc-gone"),
            await k("-n", "diff-kc-gone", "create", "configmap", "x", "--from-literal=a=b"),
            await k("delete", "namespace", "diff-kc-gone", "--timeout=30s"),
            await k("get", "namespace", "diff-kc-gone"),
        ]

    await both(kubectl, steps)
