"""A custom resource with several versions, as kube-apiserver serves it: Deckhouse's Project is served at v1alpha2
and v1alpha3 (stored), never at v1alpha1, and converted with strategy None (the same object under the other
apiVersion, pruned to what that version declares)."""

from __future__ import annotations

import asyncio
import json

import pytest

from lab.apiserver import openapi, validation
from lab.apiserver.errors import ApiError
from lab.multitenancy import add_project_namespace, create_project
from lab.apiserver.testing import ADMIN_GROUPS, issue_client_cert
from tests.lab.test_apiserver_client import _ssl
from tests.lab.test_apiserver_client import raw as _raw

AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


@pytest.fixture
def admin(lab, tmp_path):
    cert, key = issue_client_cert(lab.server, "versions-admin", ADMIN_GROUPS)
    (tmp_path / "admin.crt").write_bytes(cert)
    (tmp_path / "admin.key").write_bytes(key)
    lab.admin_cert_key = (str(tmp_path / "admin.crt"), str(tmp_path / "admin.key"))
    return lab


async def raw(lab, method: str, path: str, **kwargs):
    return await _raw(lab, method, path, cert_key=lab.admin_cert_key, **kwargs)


def project(name: str, version: str, **status) -> dict:
    obj = {"apiVersion": f"deckhouse.io/{version}", "kind": "Project", "metadata": {"name": name}, "spec": {}}
    if status:
        obj["status"] = status
    return obj


async def test_v1alpha1_is_not_served_and_not_discovered(admin):
    lab = admin
    status, _, body = await raw(lab, "GET", "/apis/deckhouse.io/v1alpha1/projects")
    assert status == 404, body
    status, _, body = await raw(lab, "POST", "/apis/deckhouse.io/v1alpha1/projects", body=project("p", "v1alpha1"))
    assert status == 404, body
    status, _, group = await raw(lab, "GET", "/apis/deckhouse.io")
    # The group has v1alpha1 for TokenExchangeProvider, ModuleConfig and Module, but Project is not among them.
    assert [v["version"] for v in group["versions"]] == ["v1alpha3", "v1alpha2", "v1alpha1"]
    assert group["preferredVersion"]["version"] == "v1alpha3"
    status, _, v1 = await raw(lab, "GET", "/apis/deckhouse.io/v1alpha1")
    assert [r["name"] for r in v1["resources"] if "/" not in r["name"]] == ["moduleconfigs", "modules",
                                                                             "tokenexchangeproviders"]
    for version in ("v1alpha2", "v1alpha3"):
        status, _, listed = await raw(lab, "GET", f"/apis/deckhouse.io/{version}")
        assert [r["name"] for r in listed["resources"]] == ["projects", "projects/status"]
    status, _, doc = await raw(lab, "GET", "/apis", headers={"Accept": AGGREGATED})
    deckhouse = next(g for g in doc["items"] if g["metadata"].get("name") == "deckhouse.io")
    served = {v["version"] for v in deckhouse["versions"] if any(r["resource"] == "projects" for r in v["resources"])}
    assert served == {"v1alpha2", "v1alpha3"}
    with pytest.raises(ApiError) as err:
        lab.server.create(project("p", "v1alpha1"))
    assert err.value.code == 404


async def test_written_at_either_version_read_at_both(admin):
    lab = admin
    status, _, created = await raw(lab, "POST", "/apis/deckhouse.io/v1alpha2/projects", body=project("a", "v1alpha2"))
    assert status == 201, created
    assert created["apiVersion"] == "deckhouse.io/v1alpha2"
    assert created["spec"] == {"projectTemplateName": "simple"}       # defaulted by the version written through
    # Stored at v1alpha3: in-process access sees the storage version.
    assert lab.server.get("deckhouse.io", "projects", "a")["apiVersion"] == "deckhouse.io/v1alpha3"
    for version in ("v1alpha2", "v1alpha3"):
        status, _, got = await raw(lab, "GET", f"/apis/deckhouse.io/{version}/projects/a")
        assert status == 200 and got["apiVersion"] == f"deckhouse.io/{version}"
        status, _, listed = await raw(lab, "GET", f"/apis/deckhouse.io/{version}/projects")
        assert listed["apiVersion"] == f"deckhouse.io/{version}"
        assert [i["apiVersion"] for i in listed["items"]] == [f"deckhouse.io/{version}"]


async def test_v1alpha3_namespaces_read_through_v1alpha2_lose_their_fields(admin):
    """Conversion None prunes to the version read: v1alpha2 declares namespaces as strings, so the v1alpha3 objects
    `{name, kind}` keep nothing. A client must read v1alpha3 to see them."""
    lab = admin
    create_project(lab.server, "shop")
    add_project_namespace(lab.server, "shop", "eu")
    status, _, v3 = await raw(lab, "GET", "/apis/deckhouse.io/v1alpha3/projects/shop")
    assert v3["status"]["namespaces"] == [{"name": "shop", "kind": "Main"}, {"name": "shop-eu", "kind": "Additional"}]
    status, _, v2 = await raw(lab, "GET", "/apis/deckhouse.io/v1alpha2/projects/shop")
    assert v2["status"]["namespaces"] == [{}, {}]
    assert v2["status"]["state"] == "Deployed"


async def test_a_write_through_v1alpha2_keeps_the_status_as_v1alpha2_reads_it(admin):
    lab = admin
    create_project(lab.server, "shop")
    status, _, v2 = await raw(lab, "GET", "/apis/deckhouse.io/v1alpha2/projects/shop")
    v2["spec"]["description"] = "changed through v1alpha2"
    status, _, updated = await raw(lab, "PUT", "/apis/deckhouse.io/v1alpha2/projects/shop", body=v2)
    assert status == 200, updated
    stored = lab.server.get("deckhouse.io", "projects", "shop")
    assert stored["spec"]["description"] == "changed through v1alpha2"
    assert stored["status"]["namespaces"] == [{}]     # what multitenancy-manager's CRD comment warns about


async def test_v1alpha2_strings_are_stored_as_they_are(admin):
    lab = admin
    lab.server.create(project("old", "v1alpha2"))
    obj = lab.server.get("deckhouse.io", "projects", "old")
    obj.update(apiVersion="deckhouse.io/v1alpha2", status={"namespaces": ["old", "old-x"]})
    lab.server.update(obj, subresource="status")
    status, _, v3 = await raw(lab, "GET", "/apis/deckhouse.io/v1alpha3/projects/old")
    # No conversion webhook: the strings stay strings under v1alpha3.
    assert v3["status"]["namespaces"] == ["old", "old-x"]


async def test_merge_patch_through_one_version_and_watch_through_the_other(admin):
    lab = admin
    create_project(lab.server, "p")
    events: list[dict] = []

    async def watch():
        async for kind, obj in lab.server.watch("deckhouse.io", "projects"):
            events.append(obj)
            if obj.get("spec", {}).get("description") == "x":
                return

    task = asyncio.create_task(watch())
    status, _, patched = await raw(lab, "PATCH", "/apis/deckhouse.io/v1alpha2/projects/p",
                                   headers={"Content-Type": "application/merge-patch+json"},
                                   body={"spec": {"description": "x"}})
    assert status == 200 and patched["apiVersion"] == "deckhouse.io/v1alpha2", patched
    await asyncio.wait_for(task, 5)
    assert events[-1]["apiVersion"] == "deckhouse.io/v1alpha3"   # in-process watches show the stored form


async def test_http_watch_converts_every_event(admin):
    lab = admin
    create_project(lab.server, "w")
    import aiohttp

    async with aiohttp.ClientSession() as s:
        async with s.get(lab.server.url + "/apis/deckhouse.io/v1alpha2/projects?watch=true",
                         ssl=_ssl(lab, lab.admin_cert_key)) as r:
            line = await asyncio.wait_for(r.content.readline(), 5)
    event = json.loads(line)
    assert event["type"] == "ADDED"
    assert event["object"]["apiVersion"] == "deckhouse.io/v1alpha2"
    assert event["object"]["status"]["namespaces"] == [{}]


async def test_the_name_rule_of_the_crd_applies(admin):
    lab = admin
    status, _, body = await raw(lab, "POST", "/apis/deckhouse.io/v1alpha3/projects", body=project("p" * 62, "v1alpha3"))
    assert status == 422, body
    assert "61 characters" in json.dumps(body)


async def test_kubectl_reads_projects_at_the_preferred_version(admin):
    lab = admin
    create_project(lab.server, "shop")
    code, out, err = await lab.kubectl("get", "projects", "shop", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["apiVersion"] == "deckhouse.io/v1alpha3"
    code, out, err = await lab.kubectl("get", "projects.v1alpha2.deckhouse.io", "shop", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["apiVersion"] == "deckhouse.io/v1alpha2"
    code, _, err = await lab.kubectl("get", "projects.v1alpha1.deckhouse.io")
    assert code != 0


def test_pruning_drops_every_field_of_an_object_where_the_schema_has_a_scalar():
    schema = {"type": "object", "properties": {"status": {"type": "object", "properties": {
        "namespaces": {"type": "array", "items": {"type": "string"}}}},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "bare": {"type": "object"}}}
    unknown: list[str] = []
    out = validation.prune({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
                            "status": {"namespaces": [{"name": "a"}, "b"]}, "free": {"any": 1},
                            "bare": {"gone": 1}}, schema, "", unknown, top=True)
    assert out == {"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
                   "status": {"namespaces": [{}, "b"]}, "free": {"any": 1}, "bare": {}}
    assert unknown == ["status.namespaces[0].name", "bare.gone"]


def test_ratcheting_reports_only_errors_in_changed_values():
    schema = {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"size": {"type": "integer"}, "name": {"type": "string"}}},
        "status": {"type": "object", "required": ["phase"], "properties": {
            "phase": {"type": "string"}, "items": {"type": "array", "items": {"type": "string"}}}}}}
    old = {"spec": {"size": "big", "name": "a"}, "status": {"phase": "x", "items": [{}]}}
    unchanged = {"spec": {"size": "big", "name": "b"}, "status": {"phase": "x", "items": [{}]}}
    assert openapi.schema_problems(unchanged, schema, old) == []
    assert [c["field"] for c in openapi.schema_problems(unchanged, schema)] == ["spec.size", "status.items[0]"]
    # A changed list is checked whole (atomic lists do not correlate item by item); a removed required field is
    # always reported.
    changed = {"spec": {"size": "big"}, "status": {"items": [{}, "ok"]}}
    assert [c["field"] for c in openapi.schema_problems(changed, schema, old)] == ["status.phase",
                                                                                     "status.items[0]"]
