"""The lab's module manager through kubectl, on both backends, as the administrator's guide uses it: the
ModuleConfig enables the module and `kubectl get module peering` shows PHASE Ready; a bad setting is refused naming
it; disabling is refused without the `modules.deckhouse.io/allow-disabling` annotation, in Deckhouse's words, and
with it removes the module's objects but not its CRDs; disabling user-authn disables peering, and enabling peering
without user-authn is refused. The tests share one cluster (without a peering process) and run in order."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import pathlib

import pytest
import pytest_asyncio
import yaml

from lab.demo.kubectl import parse_table
from lab.testing import apiserver_backends, lab_clusters

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(240)]

KUBECTL = str(pathlib.Path(sys.executable).with_name("kubectl"))
DENIED = 'admission webhook "module-configs.deckhouse-webhook.deckhouse.io" denied the request: '
CONFIRM = ("Please annotate ModuleConfig with `modules.deckhouse.io/allow-disabling=true` if you're sure that you "
           "want to disable the module.")


def module_config(name: str, **spec) -> str:
    return yaml.safe_dump({"apiVersion": "deckhouse.io/v1alpha1", "kind": "ModuleConfig", "metadata": {"name": name},
                           "spec": spec}, sort_keys=False)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=apiserver_backends())
async def cluster(request, tmp_path_factory):
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["a"], peering_command=None,
                            apiserver=request.param) as lab:
        yield lab["a"]


async def kubectl(cluster, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    env = dict(os.environ, HOME=str(cluster.dir), KUBECONFIG=str(cluster.path("kubeconfig")))
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, "--cache-dir", str(cluster.path("kube-cache")), *args, env=env,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), 60)
    return proc.returncode, out.decode(), err.decode()


async def ok(cluster, *args: str, stdin: str | None = None) -> str:
    code, out, err = await kubectl(cluster, *args, stdin=stdin)
    assert code == 0, f"kubectl {' '.join(args)}: {err}"
    return out


async def module_row(cluster, name: str = "peering") -> dict:
    rows = parse_table(await ok(cluster, "get", "module", name))
    assert len(rows) == 1
    return rows[0]


async def until_row(cluster, name: str = "peering", timeout: float = 30.0, **want: str) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        row = await module_row(cluster, name)
        if all(row.get(k) == v for k, v in want.items()):
            return row
        assert asyncio.get_running_loop().time() < deadline, f"module {name}: {row}, wanted {want}"
        await asyncio.sleep(0.1)   # bounded poll: the module manager runs beside the API


async def until_gone(cluster, *args: str, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        code, _, err = await kubectl(cluster, "get", *args)
        if code != 0 and "NotFound" in err:
            return
        assert asyncio.get_running_loop().time() < deadline, f"{args} still there"
        await asyncio.sleep(0.2)   # bounded poll: the namespace controller empties the namespace


async def test_the_module_shows_phase_ready_with_deckhouses_columns(cluster):
    out = await ok(cluster, "get", "module", "peering")
    assert out.splitlines()[0].split() == ["NAME", "STAGE", "SOURCE", "PHASE", "ENABLED", "READY"]
    assert await module_row(cluster) == {"NAME": "peering", "STAGE": "General Availability", "SOURCE": "Embedded",
                                         "PHASE": "Ready", "ENABLED": "True", "READY": "True"}
    module = json.loads(await ok(cluster, "get", "module", "peering", "-o", "json"))
    assert module["properties"]["requirements"]["modules"] == {"user-authn": ">= 0.0.0"}
    assert module["properties"]["disableOptions"]["confirmation"] is True
    configs = parse_table(await ok(cluster, "get", "moduleconfigs"))
    assert {r["NAME"]: (r["ENABLED"], r["VERSION"]) for r in configs} == {
        "global": ("", "2"), "peering": ("true", "1"), "user-authn": ("true", "2")}


async def test_a_bad_setting_is_refused_naming_it_and_changes_nothing(cluster):
    before = cluster.api.get("deckhouse.io", "moduleconfigs", "peering")
    code, _, err = await kubectl(cluster, "apply", "-f", "-", stdin=module_config(
        "peering", enabled=True, version=1, settings={"peerSyncIntervalSeconds": 1, "entrance": {"mode": "Tunnel"}}))
    assert code == 1
    assert DENIED + "spec.settings are not valid (version 1):  2 errors occurred: * peering.entrance.mode in body " \
                    "should be one of [LoadBalancer IngressNginxPassthrough] * peering.peerSyncIntervalSeconds in " \
                    "body should be greater than or equal to 5" in err
    code, _, err = await kubectl(cluster, "apply", "-f", "-", stdin=module_config(
        "peering", enabled=True, settings={"logLevel": "Debug"}))
    assert code == 1 and DENIED + "spec.version is required when spec.settings are specified" in err
    code, _, err = await kubectl(cluster, "apply", "-f", "-", stdin=module_config(
        "peering", enabled=True, version=1, settings={"logLevl": "Debug"}))
    assert code == 1 and "peering.logLevl in body is a forbidden property" in err
    after = cluster.api.get("deckhouse.io", "moduleconfigs", "peering")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


async def test_a_good_setting_is_rendered(cluster):
    await ok(cluster, "apply", "-f", "-", stdin=module_config("peering", enabled=True, version=1,
                                                                settings={"peerSyncIntervalSeconds": 45}))
    deadline = asyncio.get_running_loop().time() + 20
    while cluster.modules.applied_values["peering"]["peerSyncIntervalSeconds"] != 45:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.1)   # bounded poll: the module manager renders on the next pass
    await until_row(cluster, PHASE="Ready", ENABLED="True")


async def test_disabling_needs_the_annotation_and_keeps_the_crds(cluster):
    code, _, err = await kubectl(cluster, "patch", "moduleconfig", "peering", "--type=merge",
                                 "-p", '{"spec":{"enabled":false}}')
    message = cluster.modules.definitions["peering"]["disable"]["messages"]["en"].strip()
    assert code == 1 and DENIED + message + " " + CONFIRM in err
    code, _, err = await kubectl(cluster, "delete", "moduleconfig", "peering")
    assert code == 1 and CONFIRM in err
    await until_row(cluster, PHASE="Ready", ENABLED="True")
    await ok(cluster, "annotate", "moduleconfig", "peering", "modules.deckhouse.io/allow-disabling=true")
    await ok(cluster, "patch", "moduleconfig", "peering", "--type=merge", "-p", '{"spec":{"enabled":false}}')
    await until_row(cluster, ENABLED="False", PHASE="Downloaded", READY="False")
    assert "turned off by module config" in await ok(cluster, "get", "module", "peering", "-o", "wide")
    await until_gone(cluster, "namespace", "d8-peering")
    code, _, err = await kubectl(cluster, "get", "clusterrole", "d8:user-authz:peering:user")
    assert code == 1 and "NotFound" in err
    await ok(cluster, "get", "crd", "clusterpeers.peering.deckhouse.io")
    # Deckhouse takes the one-time annotation away once the module is off.
    annotations = json.loads(await ok(cluster, "get", "moduleconfig", "peering", "-o", "json"))["metadata"].get(
        "annotations") or {}
    deadline = asyncio.get_running_loop().time() + 10
    while "modules.deckhouse.io/allow-disabling" in annotations:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.1)   # bounded poll
        annotations = cluster.api.get("deckhouse.io", "moduleconfigs", "peering")["metadata"].get("annotations") or {}


async def test_enabling_again_installs_the_module_anew(cluster):
    await ok(cluster, "apply", "-f", "-", stdin=module_config("peering", enabled=True))
    await until_row(cluster, PHASE="Ready", ENABLED="True", READY="True")
    await ok(cluster, "get", "namespace", "d8-peering")
    secret = json.loads(await ok(cluster, "-n", "d8-peering", "get", "secret", "dex-client-peering", "-o", "json"))
    assert set(secret["data"]) == {"clientSecret"}


async def test_disabling_user_authn_disables_peering(cluster):
    await ok(cluster, "apply", "-f", "-", stdin=module_config("user-authn", enabled=False))
    await until_row(cluster, "user-authn", ENABLED="False")
    await until_row(cluster, PHASE="Downloaded", ENABLED="False")
    assert "turned off because of unmet module dependencies: 1 error occurred: dependency 'user-authn' is " \
           "disabled" in await ok(cluster, "get", "module", "peering", "-o", "wide")
    await until_gone(cluster, "namespace", "d8-peering")
    assert not cluster.dex.running
    # Enabling peering while user-authn is off is refused.
    await ok(cluster, "annotate", "moduleconfig", "peering", "modules.deckhouse.io/allow-disabling=true")
    await ok(cluster, "patch", "moduleconfig", "peering", "--type=merge", "-p", '{"spec":{"enabled":false}}')
    code, _, err = await kubectl(cluster, "apply", "-f", "-", stdin=module_config("peering", enabled=True))
    assert code == 1 and DENIED + "1 error occurred: 'user-authn' is not deployed" in err
    await ok(cluster, "apply", "-f", "-", stdin=module_config("user-authn", enabled=True, version=2,
                                                                settings={"publishAPI": {"enabled": True}}))
    await until_row(cluster, "user-authn", PHASE="Ready", ENABLED="True")
    await ok(cluster, "apply", "-f", "-", stdin=module_config("peering", enabled=True))
    await until_row(cluster, PHASE="Ready", ENABLED="True")
    assert cluster.dex.running
