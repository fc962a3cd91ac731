"""No copy of a connection string in a ClusterPeer's annotations (templates/admission-policy-connection-string.yaml).

kubectl's client-side apply copies the whole object, spec.join.connectionString included, into the annotation
`kubectl.kubernetes.io/last-applied-configuration`, which the API server masks for nobody: a viewer of the joining
cluster read the string there and joined the inviter first. Against a real kube-apiserver (lab/real, v1.37):
without MutatingAdmissionPolicy (the chart rendered for Kubernetes before 1.36) such a ClusterPeer is refused with a
message naming the command to use; with it (1.36 and later) the copy is removed before the object is stored. Either
way `kubectl create` and `kubectl apply --server-side` keep no copy: not in the annotations, the managed fields or
anywhere but spec.join.connectionString. The lab's emulator does not evaluate admission policies (it serves no
admissionregistration.k8s.io), so these run on the real backend only (skipped loudly without its binaries, failing
instead when PEERING_REQUIRE_REAL_APISERVER=1); the module's own removal of such an annotation is tested on both
backends (tests/e2e/test_connection_string_copies.py)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time

import helm_python as helm
import pytest

from chart_paths import CHART_DIR
from control import connstring
from lab import deckhouse_module
from lab.demo.kubectl import KUBECTL
from lab.real import RealControlPlane
from lab.testing import real_binaries_or_skip
from module_values import objects, values

pytestmark = pytest.mark.slow
CLUSTERPEERS = "/apis/peering.deckhouse.io/v1alpha1/clusterpeers"
# A connection string as the inviter issues it (its format only matters to the policy's pattern).
STRING = "d8peer1." + "eyJ1IjoiYTAwMDAwMDAtMDAwMC0wMDAwLTAwMDAtMDAwMDAwMDAwMDBhIn0" + "x" * 120


def _policies(kubernetes_version: str) -> list[dict]:
    with helm.Chart.load(CHART_DIR) as chart:
        rendered = objects(chart, values(kubernetes_version=kubernetes_version))
    return [o for o in rendered if o["metadata"]["name"] == "d8-peering-connection-string-copies"]


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    """A real control plane with the module's CRDs; the policies are the tests' to apply."""
    binaries = real_binaries_or_skip()
    cp = RealControlPlane("copies", tmp_path_factory.mktemp("real-copies"), binaries=binaries)
    asyncio.run(cp.start(crds=deckhouse_module.crds()))
    yield cp
    asyncio.run(cp.stop())


def kubectl(plane: RealControlPlane, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([KUBECTL, "--kubeconfig", str(plane.admin_kubeconfig), *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def join(name: str) -> str:
    return json.dumps({"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                       "metadata": {"name": name, "annotations": {"team": "platform"}},
                       "spec": {"type": "Join", "join": {"connectionString": STRING}}})


async def stored(plane: RealControlPlane, name: str) -> dict | None:
    async with plane.session() as s:
        async with s.get(f"{CLUSTERPEERS}/{name}") as r:
            return await r.json() if r.status == 200 else None


async def delete(plane: RealControlPlane, name: str) -> None:
    async with plane.session() as s:
        async with s.delete(f"{CLUSTERPEERS}/{name}"):
            pass


def copies(obj: dict) -> list[str]:
    """Where the object holds the string besides spec.join.connectionString."""
    rest = json.loads(json.dumps(obj))
    assert rest["spec"]["join"].pop("connectionString") == STRING
    return [key for key in ("metadata", "spec", "status") if STRING in json.dumps(rest.get(key))]


async def until_policy(plane: RealControlPlane, attempt, done, what: str):
    """A policy takes effect a moment after it is created: `attempt()` until `done(result)` (bounded), undoing
    what an attempt let through meanwhile."""
    deadline = time.monotonic() + 30
    while True:
        result = await attempt()
        if done(result):
            return result
        assert time.monotonic() < deadline, f"{what} never happened: {result}"
        await asyncio.sleep(0.2)


def test_the_policies_match_what_the_module_removes():
    """One pattern: the chart's CEL and control/connstring.py (the reconciler's removal)."""
    for policy in _policies("1.37.2"):
        text = json.dumps(policy["spec"])
        if policy["kind"].endswith("Policy"):
            assert connstring.COPY_PATTERN in text
    assert connstring.copies_in({"kubectl.kubernetes.io/last-applied-configuration": join("x"), "team": "platform"}) \
        == ["kubectl.kubernetes.io/last-applied-configuration"]
    assert [p["kind"] for p in _policies("1.35.4")] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    assert [p["kind"] for p in _policies("1.36.0")][:2] == ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]


async def install(plane: RealControlPlane, kubernetes_version: str) -> None:
    """The policies as the chart renders them for `kubernetes_version`, and no other of this name."""
    wanted = _policies(kubernetes_version)
    if not any(p["kind"] == "MutatingAdmissionPolicy" for p in wanted):
        async with plane.session() as s:
            for plural in ("mutatingadmissionpolicybindings", "mutatingadmissionpolicies"):
                async with s.delete(f"/apis/admissionregistration.k8s.io/v1/{plural}/"
                                    "d8-peering-connection-string-copies"):
                    pass
    await plane.apply(wanted)


async def test_without_mutating_policies_a_client_side_apply_is_refused_naming_the_command(plane):
    await install(plane, "1.33.0")
    name = "apply-refused"

    async def attempt():
        done = await asyncio.to_thread(kubectl, plane, "apply", "-f", "-", stdin=join(name))
        if done.returncode == 0:
            await delete(plane, name)
        return done
    refused = await until_policy(plane, attempt, lambda d: d.returncode != 0, "a refusal of kubectl apply")
    assert "kubectl.kubernetes.io/last-applied-configuration" in refused.stderr
    assert "d8 k create -f" in refused.stderr and "d8 k apply --server-side -f" in refused.stderr
    assert STRING not in refused.stderr and await stored(plane, name) is None
    # `create --save-config` writes the same annotation: refused alike.
    done = await asyncio.to_thread(kubectl, plane, "create", "--save-config", "-f", "-", stdin=join(name))
    assert done.returncode != 0 and "d8 k create -f" in done.stderr
    # The commands the message names pass, and keep no copy.
    for name, args in (("created", ("create", "-f", "-")),
                       ("server-side", ("apply", "--server-side", "--field-manager=admin", "-f", "-"))):
        done = await asyncio.to_thread(kubectl, plane, *args, stdin=join(name))
        assert done.returncode == 0, done.stderr
        obj = await stored(plane, name)
        assert copies(obj) == [] and obj["metadata"]["annotations"] == {"team": "platform"}
        assert obj["metadata"]["managedFields"]
    # An update that would add a copy to an existing ClusterPeer is refused too.
    done = await asyncio.to_thread(kubectl, plane, "apply", "-f", "-", stdin=join("created"))
    assert done.returncode != 0 and "d8 k create -f" in done.stderr
    assert copies(await stored(plane, "created")) == []
    for name in ("created", "server-side"):
        await delete(plane, name)


async def test_with_the_mutating_policy_the_copy_is_removed_before_it_is_stored(plane):
    await install(plane, "1.37.2")
    name = "apply-stripped"

    async def attempt():
        done = await asyncio.to_thread(kubectl, plane, "apply", "-f", "-", stdin=join(name))
        return done, (await stored(plane, name)) if done.returncode == 0 else None
    # Until the mutating policy takes effect the validating one refuses: nothing is ever stored with a copy.
    done, obj = await until_policy(plane, attempt, lambda r: r[0].returncode == 0, "kubectl apply passing")
    assert copies(obj) == [] and obj["metadata"]["annotations"] == {"team": "platform"}
    # Applied again (an update, as an administrator changing the Join would): still no copy.
    changed = json.loads(join(name))
    changed["metadata"]["annotations"]["team"] = "networking"
    done = await asyncio.to_thread(kubectl, plane, "apply", "-f", "-", stdin=json.dumps(changed))
    assert done.returncode == 0, done.stderr
    obj = await stored(plane, name)
    assert copies(obj) == [] and obj["metadata"]["annotations"] == {"team": "networking"}
    # What kubectl printed and what a watch would see hold no copy either.
    listed = await asyncio.to_thread(kubectl, plane, "get", "clusterpeers", "-o", "json")
    assert len(re.findall(re.escape(STRING), listed.stdout)) == 1  # spec.join.connectionString alone
    await delete(plane, name)
