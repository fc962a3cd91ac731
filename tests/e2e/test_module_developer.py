"""The module developers' guide, run: `peering kubeconfig` gives a consumer's kubeconfig from the ClusterPeer, and
the guide's Python snippet (docs/module-developers.md, the official Kubernetes client) lists and watches a paired
project's ConfigMaps on the peer through both gateways, and reconnects after the peer was away."""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
import subprocess
import sys
import threading

import pytest
import pytest_asyncio
import yaml

from control import consumer_config as cc
from control.rules.access import audience
from lab.testing import apiserver_backends
from peering_lab import clusterpeer, peered_lab, until

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = pathlib.Path(__file__).resolve().parents[2]
CAP = "configmaps-watcher"
PROJECT = "shop"


def _snippet() -> dict:
    text = (ROOT / "docs" / "module-developers.md").read_text()
    code = next(block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "peering-snippet" in block)
    namespace: dict = {"__name__": "module_developer_snippet"}
    exec(compile(code, "docs/module-developers.md", "exec"), namespace)
    return namespace


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=apiserver_backends())
async def lab(request, tmp_path_factory):
    async with peered_lab(tmp_path_factory.mktemp("lab"), CAP, PROJECT, apiserver=request.param,
                          namespace="d8-my-module", account="controller", verbs=("get", "list", "watch")) as lab:
        yield lab


async def test_peering_kubeconfig_prints_what_the_controller_needs(lab, tmp_path):
    b = lab["b"]
    kubeconfig = b.info()["files"]["kubeconfig"]

    def run(*args):
        return subprocess.run([sys.executable, "-m", "control.cli", "kubeconfig", "--kubeconfig", kubeconfig, *args],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)

    done = await asyncio.to_thread(run, "--peer", "to-a", "--capability", CAP)
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    access = clusterpeer(b, "to-a")["status"]["access"]
    assert config["clusters"][0]["cluster"]["server"] == access["endpoint"]
    assert config["users"][0]["user"] == {"tokenFile": cc.token_path(cc.access_of(clusterpeer(b, "to-a"), CAP))}
    manifest = list(yaml.safe_load_all((await asyncio.to_thread(run, "--peer", "to-a", "--capability", CAP,
                                                                "--manifest")).stdout))
    projected = manifest[1]["spec"]["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"]
    assert projected["audience"] == audience(lab["a"].info()["uuid"], CAP)
    assert yaml.safe_load(manifest[0]["data"]["kubeconfig"])["clusters"] == config["clusters"]
    for args, words in ((("--peer", "nope", "--capability", CAP), "no ClusterPeer nope"),
                        (("--peer", "to-a", "--capability", "other"), "not effective in peering to-a"),
                        (("--peer", "Bad/Name", "--capability", CAP), "not a Kubernetes object name")):
        refused = await asyncio.to_thread(run, *args)
        assert refused.returncode == 1 and words in refused.stderr, refused.stderr


async def test_the_guides_python_client_lists_watches_and_reconnects_through_both_gateways(lab, tmp_path):
    a, b = lab["a"], lab["b"]
    snippet = _snippet()
    # What kubelet would project into the controller's Pod: a token with the capability's audience.
    sa = b.api.get("", "serviceaccounts", "controller", "d8-my-module")
    token, _ = b.api.sa_issuer.issue("d8-my-module", "controller", sa["metadata"]["uid"],
                                     [audience(a.info()["uuid"], CAP)], 3600)
    token_file = tmp_path / "token"
    token_file.write_text(token)
    config = cc.kubeconfig(cc.access_of(clusterpeer(b, "to-a"), CAP), str(token_file))
    # The egress Service's name resolves to the lab's loopback port (what cluster DNS does in a Pod).
    host, port = b.resolve_map()["peering-gateway.d8-peering.svc"].rsplit(":", 1)
    server = config["clusters"][0]["cluster"]
    server["tls-server-name"] = "peering-gateway.d8-peering.svc"
    server["server"] = server["server"].replace("peering-gateway.d8-peering.svc", f"{host}:{port}")
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))

    events: list[tuple[str, str]] = []
    stopping = threading.Event()
    api = await asyncio.to_thread(snippet["peer_api"], str(path))

    def on_event(kind, cm):
        name = cm["metadata"]["name"] if isinstance(cm, dict) else cm.metadata.name
        events.append((kind, name))

    follower = threading.Thread(target=snippet["follow_configmaps"],
                                args=(api, PROJECT, on_event, stopping.is_set, 5), daemon=True)
    follower.start()
    try:
        await until(lambda: ("LISTED", "prices") in events, timeout=30, what="the peer's ConfigMaps listed")
        a.api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "new-1", "namespace": PROJECT}})
        await until(lambda: ("ADDED", "new-1") in events, timeout=30, what="a watch event through both gateways")
        # The peer goes away and comes back: the snippet's loop waits it out and follows again.
        await a.stop_peering()
        await a.start_peering()
        a.api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "new-2", "namespace": PROJECT}})
        await until(lambda: any(name == "new-2" for _, name in events), timeout=60,
                    what="the ConfigMap made after the peer came back")
    finally:
        stopping.set()
        a.api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "wake", "namespace": PROJECT}})
        await asyncio.to_thread(follower.join, 30)
        api.api_client.close()
    assert not follower.is_alive()
    assert all(kind in ("LISTED", "ADDED", "MODIFIED", "DELETED") for kind, _ in events), json.dumps(events)
