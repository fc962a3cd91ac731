"""Lab clusters on the real backend: `python -m lab up --apiserver real`, `cluster.api` over HTTP (lab/real/api.py)
answering as the emulator's in-process API does, and the front of lab/apifront.py."""

from __future__ import annotations

import asyncio
import json
import pathlib

import aiohttp
import pytest
import pytest_asyncio

from lab import certs
from lab.apiserver.errors import ApiError
from lab.cluster import DEX_CLIENT_SECRET_NAME, NAMESPACE
from lab.testing import lab_clusters, lab_processes


PROJECTS = "projects.deckhouse.io"
LAB_CRDS = {"clusterpeers.peering.deckhouse.io", "peeringcapabilities.peering.deckhouse.io",
            "projectpeers.peering.deckhouse.io", PROJECTS, "tokenexchangeproviders.deckhouse.io",
            "moduleconfigs.deckhouse.io", "modules.deckhouse.io"}


def _pids_in(path: pathlib.Path) -> list[int]:
    """Live processes whose command line names `path` (the lab's etcd, kube-apiserver, peering processes)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X") and str(path) in cmdline:
            found.append(int(entry.name))
    return found


def test_lab_up_real_runs_three_clusters_that_kubectl_knows_as_kube_apiserver(binaries, tmp_path):
    d = tmp_path / "lab"
    with lab_processes(d, ["a", "b", "c"], apiserver="real") as lab:
        assert lab.info["apiserver"] == "real"
        for name in ("a", "b", "c"):
            c = lab.cluster(name)
            assert c["apiserver"] == "real" and c["peering"]["state"] == "running", c["peering"]
            version = json.loads(lab.kubectl(name, "version", "-o", "json").stdout)
            assert version["serverVersion"]["gitVersion"] == binaries.kube_version
            # Not the emulator: kube-apiserver's own namespaces and bootstrap roles, the CRDs through its validation.
            namespaces = lab.kubectl(name, "get", "namespaces", "-o", "name").stdout.split()
            assert {"namespace/kube-node-lease", "namespace/kube-public", f"namespace/{NAMESPACE}"} <= set(namespaces)
            crds = lab.kubectl(name, "get", "crd", "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
            assert set(crds) == LAB_CRDS
            # The module's objects of every kind kube-apiserver serves, its admission policy included.
            assert lab.kubectl(name, "get", "validatingadmissionpolicy", "d8-peering-rbac-bounds").returncode == 0
            assert lab.kubectl(name, "-n", NAMESPACE, "get", "secret", DEX_CLIENT_SECRET_NAME).returncode == 0
            assert pathlib.Path(c["controlPlane"]["logs"]["kube-apiserver"]).is_file()
        assert _pids_in(d), "the lab runs processes in its directory"
    assert _pids_in(d) == [], "python -m lab down leaves no etcd, kube-apiserver or peering process behind"


def test_lab_up_real_without_the_binaries_says_how_to_build_them(tmp_path, monkeypatch):
    import subprocess
    import sys

    from lab.cluster import ROOT

    done = subprocess.run([sys.executable, "-m", "lab", "up", "--apiserver", "real", "--clusters", "a",
                           "--dir", str(tmp_path / "lab")], capture_output=True, text=True, cwd=str(ROOT),
                          env={"PATH": "/usr/bin:/bin", "PEERING_LAB_CACHE": str(tmp_path / "empty-cache"),
                               "HOME": str(tmp_path)}, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--apiserver real needs the real backend's binaries" in done.stderr
    assert "python -m lab.real build" in done.stderr


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lab(binaries, tmp_path_factory):
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["a"], peering_command=None, apiserver="real",
                            without_crds=[PROJECTS], api_front=True) as lab:
        yield lab


@pytest.mark.asyncio(loop_scope="module")
async def test_the_http_api_answers_as_the_emulators_in_process_api(lab):
    api = lab["a"].api
    assert api.get("", "configmaps", "missing", "default") is None
    with pytest.raises(ApiError) as err:
        api.get("example.com", "widgets", "x")
    assert err.value.code == 404 and "widgets.example.com" in err.value.message
    created = api.create({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "one", "namespace": "default", "labels": {"x": "y"}}})
    with pytest.raises(ApiError) as err:
        api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one", "namespace": "default"}})
    assert (err.value.code, err.value.reason) == (409, "AlreadyExists")
    # Strict field validation, as kubectl: an unknown field is refused, not dropped.
    with pytest.raises(ApiError) as err:
        api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "two", "namespace": "default"},
                    "dta": {}})
    assert err.value.code == 400 and "dta" in err.value.message
    listed = api.list("", "configmaps", "default", label_selector="x=y")
    assert [(o["apiVersion"], o["kind"], o["metadata"]["name"]) for o in listed] == [("v1", "ConfigMap", "one")]
    stale = dict(created)
    api.update({**created, "data": {"k": "v"}})
    with pytest.raises(ApiError) as err:
        api.update({**stale, "data": {"k": "w"}})
    assert err.value.code == 409
    api.delete("", "configmaps", "one", "default")
    with pytest.raises(ApiError) as err:
        api.delete("", "configmaps", "one", "default")
    assert err.value.code == 404


@pytest.mark.asyncio(loop_scope="module")
async def test_a_watch_sees_what_exists_then_every_change(lab):
    api = lab["a"].api
    api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "before", "namespace": NAMESPACE}})
    seen: list[tuple[str, str]] = []

    async def follow():
        async for event, obj in api.watch("", "configmaps", NAMESPACE):
            seen.append((event, obj["metadata"]["name"]))
            if event == "DELETED":
                return

    task = asyncio.ensure_future(follow())
    try:
        while ("ADDED", "before") not in seen:
            await asyncio.sleep(0.02)
        api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after", "namespace": NAMESPACE}})
        api.delete("", "configmaps", "after", NAMESPACE)
        await asyncio.wait_for(task, 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [e for e in seen if e[1] in ("before", "after")] == [("ADDED", "before"), ("ADDED", "after"),
                                                               ("DELETED", "after")]


@pytest.mark.asyncio(loop_scope="module")
async def test_a_crd_left_out_is_not_served_until_installed(lab):
    a = lab["a"]
    with pytest.raises(ApiError) as err:
        a.api.list("deckhouse.io", "projects")
    assert err.value.code == 404
    a.install_crd(PROJECTS)
    assert a.api.list("deckhouse.io", "projects") == []
    a.create_project("shop")
    project = a.api.get("deckhouse.io", "projects", "shop")
    assert project["apiVersion"] == "deckhouse.io/v1alpha3"
    assert project["status"]["namespaces"] == [{"name": "shop", "kind": "Main"}]


@pytest.mark.asyncio(loop_scope="module")
async def test_tokens_come_from_the_token_request_api(lab):
    a = lab["a"]
    sa = a.api.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "app", "namespace": NAMESPACE}})
    with pytest.raises(ValueError, match="at least 600"):
        a.api.sa_issuer.issue(NAMESPACE, "app", sa["metadata"]["uid"], [], 60)
    with pytest.raises(ApiError, match="re-created"):
        a.api.sa_issuer.issue(NAMESPACE, "app", "not-its-uid", [], 600)
    token, expires = a.api.sa_issuer.issue(NAMESPACE, "app", sa["metadata"]["uid"], ["someone"], 600)
    review = a.api.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token, "audiences": ["someone"]}})
    assert review["status"]["authenticated"] is True
    assert review["status"]["user"]["username"] == f"system:serviceaccount:{NAMESPACE}:app"
    assert expires.endswith("Z")
    # Without a front, the keys kube-apiserver publishes cannot be replaced: said at once, not ignored.
    from lab.real.api import HttpApi

    bare = HttpApi("a", a.control_plane.admin_kubeconfig)
    try:
        with pytest.raises(AttributeError, match="api_front=True"):
            bare.sa_issuer.jwks = lambda: {"keys": []}
    finally:
        bare.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_writes_are_counted_from_kube_apiservers_metrics(lab):
    api = lab["a"].api
    before = api.write_counts()
    api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "counted", "namespace": NAMESPACE}})
    with pytest.raises(ApiError):
        api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "counted", "namespace": NAMESPACE}})
    after = api.write_counts()
    # One POST succeeded; the refused one is not a write.
    assert after.get("POST configmaps", 0) - before.get("POST configmaps", 0) == 1


@pytest.mark.asyncio(loop_scope="module")
async def test_the_front_passes_everything_through_but_replaced_keys(lab):
    a = lab["a"]
    peering = json.loads(a.path("peering-kubeconfig").read_text())
    assert peering["clusters"][0]["cluster"]["server"] == a.front.url
    token = peering["users"][0]["user"]["token"]
    own = a.api.sa_issuer.jwks()
    ctx = certs.client_ssl_context(a.pki.public_ca.cert_pem)
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/jwk-set+json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as http:
        async with http.get(a.front.url + "/openid/v1/jwks", headers=headers) as r:
            assert r.status == 200 and await r.json(content_type=None) == own
        # kube-apiserver's own answers, refusals included: the peering process may not read Secrets of default.
        async with http.get(a.front.url + "/api/v1/namespaces/default/secrets", headers=headers) as r:
            assert r.status == 403 and (await r.json())["reason"] == "Forbidden"
        async with http.get(a.front.url + "/openid/v1/jwks", headers={**headers, "Accept": "application/json"}) as r:
            assert r.status == 406
        a.api.sa_issuer.jwks = lambda: {"keys": []}
        try:
            async with http.get(a.front.url + "/openid/v1/jwks", headers=headers) as r:
                assert r.status == 200 and await r.json(content_type=None) == {"keys": []}
        finally:
            del a.api.sa_issuer.jwks
        async with http.get(a.front.url + "/openid/v1/jwks", headers=headers) as r:
            assert await r.json(content_type=None) == own
