"""APIs that a cluster may not serve, or that fail: CRDs left out at start and installed later, a CRD deleted
while it is watched, and an aggregated API whose backend is down (kube-aggregator's answers)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from lab.apiserver.errors import ApiError
from lab.apiserver.testing import ADMIN_GROUPS, issue_client_cert, start_test_apiserver
from tests.lab.conftest import CHART_CRDS, Lab
from tests.lab.test_apiserver_client import _ssl
from tests.lab.test_apiserver_client import raw as _raw

PROJECTS = "projects.deckhouse.io"
PROVIDERS = "tokenexchangeproviders.deckhouse.io"
# Deckhouse's own CRDs of the group, which a bare server leaves out too.
MODULE_CRDS = ["moduleconfigs.deckhouse.io", "modules.deckhouse.io"]
AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


@pytest.fixture
async def bare(tmp_path):
    """An API server started without the Project and TokenExchangeProvider CRDs (nor ModuleConfig and Module: no
    deckhouse.io resource at all)."""
    server, kubeconfig, _c, _k, ca_pem = await start_test_apiserver(
        tmp_path, crd_paths=[CHART_CRDS], without_crds=[PROJECTS, PROVIDERS, *MODULE_CRDS])
    lab = Lab(server, kubeconfig, ca_pem, tmp_path)
    cert, key = issue_client_cert(server, "optional-admin", ADMIN_GROUPS)
    (tmp_path / "a.crt").write_bytes(cert)
    (tmp_path / "a.key").write_bytes(key)
    lab.cert_key = (str(tmp_path / "a.crt"), str(tmp_path / "a.key"))
    try:
        yield lab
    finally:
        await server.stop()


async def raw(lab, method, path, **kwargs):
    return await _raw(lab, method, path, cert_key=lab.cert_key, **kwargs)


def provider(name: str) -> dict:
    return {"apiVersion": "deckhouse.io/v1alpha1", "kind": "TokenExchangeProvider", "metadata": {"name": name},
            "spec": {"issuer": "https://kubernetes.default.svc.cluster.local", "jwks": '{"keys": []}',
                     "usernamePrefix": "peering:x:"}}


async def test_left_out_crds_are_not_served_anywhere(bare):
    status, _, body = await raw(bare, "GET", "/apis/deckhouse.io/v1alpha3/projects")
    assert status == 404, body
    status, _, body = await raw(bare, "GET", "/apis/deckhouse.io")
    assert status == 404, body
    status, _, groups = await raw(bare, "GET", "/apis")
    assert "deckhouse.io" not in [g["name"] for g in groups["groups"]]
    status, _, doc = await raw(bare, "GET", "/apis", headers={"Accept": AGGREGATED})
    assert "deckhouse.io" not in [g["metadata"].get("name") for g in doc["items"]]
    # In-process access answers as HTTP does.
    for call in (lambda: bare.server.list("deckhouse.io", "projects"),
                 lambda: bare.server.get("deckhouse.io", "tokenexchangeproviders", "x"),
                 lambda: bare.server.create(provider("x"))):
        with pytest.raises(ApiError) as err:
            call()
        assert err.value.code == 404
    code, _, err = await bare.kubectl("get", "projects")
    assert code != 0 and 'the server doesn\'t have a resource type "projects"' in err
    # The module's own CRDs are there.
    assert bare.server.crd_installed("clusterpeers.peering.deckhouse.io")


async def test_a_crd_installed_later_is_served_at_once(bare):
    assert not bare.server.crd_installed(PROVIDERS)
    bare.server.install_crd(PROVIDERS)
    assert bare.server.crd_installed(PROVIDERS)
    status, _, created = await raw(bare, "POST", "/apis/deckhouse.io/v1alpha1/tokenexchangeproviders",
                                   body=provider("p"))
    assert status == 201, created
    code, out, err = await bare.kubectl("get", "tokenexchangeproviders", "-o", "name")
    assert code == 0, err
    assert out.strip() == "tokenexchangeprovider.deckhouse.io/p"
    with pytest.raises(ApiError) as err:
        bare.server.install_crd(PROVIDERS)
    assert err.value.code == 409
    with pytest.raises(ValueError, match="no CRD 'nope.example.com' is known"):
        bare.server.install_crd("nope.example.com")


async def test_an_unknown_crd_to_leave_out_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no such CRD is loaded; name one of .*projects.deckhouse.io"):
        await start_test_apiserver(tmp_path, without_crds=["project.deckhouse.io"])


async def test_a_deleted_crd_ends_its_watches_after_the_deletions(bare):
    bare.server.install_crd(PROVIDERS)
    bare.server.create(provider("p"))
    seen: list[str] = []

    async def in_process():
        async for kind, obj in bare.server.watch("deckhouse.io", "tokenexchangeproviders"):
            seen.append(f"{kind} {obj['metadata']['name']}")

    task = asyncio.create_task(in_process())
    async with aiohttp.ClientSession() as s:
        async with s.get(bare.server.url + "/apis/deckhouse.io/v1alpha1/tokenexchangeproviders?watch=true",
                         ssl=_ssl(bare, bare.cert_key)) as r:
            first = json.loads(await asyncio.wait_for(r.content.readline(), 5))
            assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "p")
            bare.server.delete("apiextensions.k8s.io", "customresourcedefinitions", PROVIDERS)
            rest = await asyncio.wait_for(r.content.read(), 5)   # the stream ends
    events = [json.loads(line) for line in rest.splitlines() if line]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("DELETED", "p")]
    await asyncio.wait_for(task, 5)
    assert seen == ["ADDED p", "DELETED p"]
    with pytest.raises(ApiError):
        bare.server.list("deckhouse.io", "tokenexchangeproviders")


# --- an aggregated API whose backend is down ---------------------------------------------------------------

async def test_an_unavailable_aggregated_api_is_listed_and_answers_503(lab):
    server = lab.server
    server.add_unavailable_api("metrics.k8s.io", "v1beta1")
    cert, key = issue_client_cert(server, "agg-admin", ADMIN_GROUPS)
    (lab.tmp_path / "g.crt").write_bytes(cert)
    (lab.tmp_path / "g.key").write_bytes(key)
    ck = (str(lab.tmp_path / "g.crt"), str(lab.tmp_path / "g.key"))

    status, _, groups = await _raw(lab, "GET", "/apis", cert_key=ck)
    metrics = next(g for g in groups["groups"] if g["name"] == "metrics.k8s.io")
    assert metrics["preferredVersion"]["version"] == "v1beta1"
    status, _, group = await _raw(lab, "GET", "/apis/metrics.k8s.io", cert_key=ck)
    assert status == 200 and group["kind"] == "APIGroup"
    status, _, doc = await _raw(lab, "GET", "/apis", headers={"Accept": AGGREGATED}, cert_key=ck)
    item = next(g for g in doc["items"] if g["metadata"].get("name") == "metrics.k8s.io")
    assert item["versions"] == [{"version": "v1beta1", "freshness": "Stale"}]
    for path in ("/apis/metrics.k8s.io/v1beta1", "/apis/metrics.k8s.io/v1beta1/pods",
                 "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/x"):
        status, headers, body = await _raw(lab, "GET", path, cert_key=ck)
        assert (status, body) == (503, "service unavailable\n"), path
        assert headers["Content-Type"].startswith("text/plain")
    # Authorization comes first, as in kube-apiserver's handler chain: a user without rights gets 403.
    cert, key = issue_client_cert(server, "nobody")
    (lab.tmp_path / "n.crt").write_bytes(cert)
    (lab.tmp_path / "n.key").write_bytes(key)
    status, _, body = await _raw(lab, "GET", "/apis/metrics.k8s.io/v1beta1/pods",
                                 cert_key=(str(lab.tmp_path / "n.crt"), str(lab.tmp_path / "n.key")))
    assert status == 403, body
    # The rest of the API is untouched: kubectl leaves the stale group out and serves the others.
    code, out, err = await lab.kubectl("api-resources", "-o", "name")
    assert code == 0, err
    assert "configmaps" in out.split() and not [r for r in out.split() if r.endswith("metrics.k8s.io")]
    code, out, err = await lab.kubectl("get", "configmaps", "-n", "default")
    assert code == 0, err
    code, out, err = await lab.kubectl("get", "--raw", "/apis/metrics.k8s.io/v1beta1")
    assert code != 0 and "ServiceUnavailable" in err, err

    server.remove_unavailable_api("metrics.k8s.io")
    status, _, groups = await _raw(lab, "GET", "/apis", cert_key=ck)
    assert "metrics.k8s.io" not in [g["name"] for g in groups["groups"]]
    status, _, _ = await _raw(lab, "GET", "/apis/metrics.k8s.io/v1beta1", cert_key=ck)
    assert status == 404


async def test_add_unavailable_api_refuses_bad_groups(lab):
    with pytest.raises(ValueError, match="served here already"):
        lab.server.add_unavailable_api("rbac.authorization.k8s.io", "v1")
    with pytest.raises(ValueError, match="DNS name"):
        lab.server.add_unavailable_api("metrics", "v1")
