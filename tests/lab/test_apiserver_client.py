"""Conformance of the emulated kube-apiserver through kubernetes-asyncio and raw HTTPS: CRUD, conflicts,
generation, the status subresource, watch (resume, 410, bookmarks, selectors, timeouts), garbage collection,
namespace deletion, 422s from schema and CEL, tables, authentication, RBAC and sensitive fields."""

from __future__ import annotations

import asyncio
import io
import json
import ssl

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

GROUP, VERSION = "peering.deckhouse.io", "v1alpha1"
# kubernetes-asyncio picks json-patch for custom objects unless told; a real server would refuse a dict then too.
MERGE = {"_content_type": "application/merge-patch+json"}


def peer(name: str, **spec) -> dict:
    body = {"type": "Join", "join": {"connectionString": "secret-connection-string"}}
    body.update(spec)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterPeer", "metadata": {"name": name}, "spec": body}


async def until(predicate, timeout: float = 5.0):
    """Poll a condition of the server's controllers (they act after the write, like kube-controller-manager)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if loop.time() > deadline:
            pytest.fail("condition not reached in time")
        await asyncio.sleep(0.02)


def _ssl(lab, cert_key=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=lab.ca_pem.decode())
    if cert_key:
        ctx.load_cert_chain(*cert_key)
    return ctx


async def raw(lab, method: str, path: str, *, headers=None, body=None, cert_key=None, token=None):
    """One HTTPS request outside kubernetes-asyncio, to see status codes, headers and bodies as sent."""
    headers = dict(headers or {})
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = io.BytesIO(json.dumps(body).encode()) if body is not None else None
    async with aiohttp.ClientSession() as s:
        async with s.request(method, lab.server.url + path, ssl=_ssl(lab, cert_key), headers=headers,
                             data=data) as r:
            text = await r.text()
            return r.status, r.headers, (json.loads(text) if text.startswith("{") else text)


@pytest.fixture
def admin_files(lab, tmp_path):
    from lab.apiserver.testing import ADMIN_GROUPS, issue_client_cert
    cert, key = issue_client_cert(lab.server, "other-admin", ADMIN_GROUPS)
    (tmp_path / "a.crt").write_bytes(cert)
    (tmp_path / "a.key").write_bytes(key)
    return str(tmp_path / "a.crt"), str(tmp_path / "a.key")


# ---------------------------------------------------------------- CRUD

async def test_configmap_crud_conflict_and_not_found(api):
    v1 = client.CoreV1Api(api)
    cm = await v1.create_namespaced_config_map("default", {"metadata": {"name": "c", "labels": {"a": "1"}},
                                                           "data": {"k": "v"}})
    assert cm.metadata.uid and cm.metadata.resource_version and cm.metadata.creation_timestamp
    cm.data["k"] = "w"
    updated = await v1.replace_namespaced_config_map("c", "default", cm)
    assert int(updated.metadata.resource_version) > int(cm.metadata.resource_version)
    cm.data["k"] = "stale"
    with pytest.raises(ApiException) as exc:
        await v1.replace_namespaced_config_map("c", "default", cm)   # still carries the old resourceVersion
    assert exc.value.status == 409
    assert json.loads(exc.value.body)["reason"] == "Conflict"
    with pytest.raises(ApiException) as exc:
        await v1.create_namespaced_config_map("default", {"metadata": {"name": "c"}})
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "AlreadyExists"
    await v1.delete_namespaced_config_map("c", "default")
    with pytest.raises(ApiException) as exc:
        await v1.read_namespaced_config_map("c", "default")
    body = json.loads(exc.value.body)
    assert exc.value.status == 404 and body["reason"] == "NotFound" and body["message"] == 'configmaps "c" not found'


async def test_secret_string_data_and_patches(api):
    v1 = client.CoreV1Api(api)
    await v1.create_namespaced_secret("default", {"metadata": {"name": "s"}, "stringData": {"a": "hello"}})
    got = await v1.read_namespaced_secret("s", "default")
    assert got.data == {"a": "aGVsbG8="} and got.type == "Opaque"
    await v1.patch_namespaced_secret("s", "default", {"metadata": {"labels": {"x": "y"}}})
    json_patched = await v1.patch_namespaced_secret(
        "s", "default", [{"op": "add", "path": "/data/b", "value": "Yg=="}])
    assert json_patched.data == {"a": "aGVsbG8=", "b": "Yg=="} and json_patched.metadata.labels == {"x": "y"}


async def test_custom_resource_generation_and_status_subresource(api):
    co = client.CustomObjectsApi(api)
    obj = await co.create_cluster_custom_object(GROUP, VERSION, "clusterpeers", peer("p"))
    assert obj["metadata"]["generation"] == 1
    obj = await co.patch_cluster_custom_object(GROUP, VERSION, "clusterpeers", "p",
                                               {"metadata": {"annotations": {"note": "x"}}}, **MERGE)
    assert obj["metadata"]["generation"] == 1, "metadata changes do not bump generation"
    obj = await co.patch_cluster_custom_object_status(GROUP, VERSION, "clusterpeers", "p",
                                                      {"status": {"phase": "Active"}, "spec": {"capabilities": ["x"]}}, **MERGE)
    assert obj["status"]["phase"] == "Active" and "capabilities" not in obj["spec"]
    assert obj["metadata"]["generation"] == 1, "status writes do not bump generation"
    obj = await co.patch_cluster_custom_object(GROUP, VERSION, "clusterpeers", "p",
                                               {"spec": {"capabilities": ["dns"]}, "status": {"phase": "Error"}}, **MERGE)
    assert obj["metadata"]["generation"] == 2 and obj["status"]["phase"] == "Active"
    stale = dict(obj, metadata=dict(obj["metadata"], resourceVersion="1"))
    with pytest.raises(ApiException) as exc:
        await co.replace_cluster_custom_object_status(GROUP, VERSION, "clusterpeers", "p", stale)
    assert exc.value.status == 409


async def test_422_names_the_fields_from_schema_and_cel(api):
    co = client.CustomObjectsApi(api)
    with pytest.raises(ApiException) as exc:
        await co.create_cluster_custom_object(GROUP, VERSION, "clusterpeers", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterPeer", "metadata": {"name": "bad"},
            "spec": {"type": "Invite", "invite": {"tokenTTL": "48h"}}})
    status = json.loads(exc.value.body)
    assert exc.value.status == 422 and status["reason"] == "Invalid"
    assert [c["field"] for c in status["details"]["causes"]] == ["spec.invite.tokenTTL"]
    assert "10m to 24h" in status["message"]
    cap = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PeeringCapability", "metadata": {"name": "cap"},
           "spec": {"version": "v1", "consumers": [{"name": "ctrl", "namespace": "d8-x"}]}}
    made = await co.create_cluster_custom_object(GROUP, VERSION, "peeringcapabilities", cap)
    assert made["spec"]["consumers"][0]["kind"] == "ServiceAccount", "the schema default is applied"


async def test_generate_name_and_dry_run(lab, admin_files):
    status, _, body = await raw(lab, "POST", "/api/v1/namespaces/default/configmaps", cert_key=admin_files,
                                headers={"Content-Type": "application/json"},
                                body={"metadata": {"generateName": "gen-"}})
    assert status == 201 and body["metadata"]["name"].startswith("gen-")
    status, _, body = await raw(lab, "POST", "/api/v1/namespaces/default/configmaps?dryRun=All",
                                cert_key=admin_files, headers={"Content-Type": "application/json"},
                                body={"metadata": {"name": "dry"}})
    assert status == 201 and lab.server.get("", "configmaps", "dry", "default") is None


# ---------------------------------------------------------------- list and watch

async def test_label_and_field_selectors_on_list(api):
    v1 = client.CoreV1Api(api)
    for name, labels in (("a", {"tier": "x", "env": "prod"}), ("b", {"tier": "y"}), ("c", {})):
        await v1.create_namespaced_config_map("default", {"metadata": {"name": name, "labels": labels}})

    async def names(**kw):
        return sorted(i.metadata.name for i in (await v1.list_namespaced_config_map("default", **kw)).items)

    assert await names(label_selector="tier=x") == ["a"]
    assert await names(label_selector="tier!=x") == ["b", "c"]
    assert await names(label_selector="tier in (x,y)") == ["a", "b"]
    assert await names(label_selector="tier notin (x)") == ["b", "c"]
    assert await names(label_selector="env") == ["a"]
    assert await names(label_selector="!tier") == ["c"]
    assert await names(field_selector="metadata.name=b") == ["b"]
    everywhere = await v1.list_config_map_for_all_namespaces(field_selector="metadata.namespace=default")
    assert {i.metadata.name for i in everywhere.items} >= {"a", "b", "c"}


async def test_watch_resumes_from_a_resource_version(api):
    v1 = client.CoreV1Api(api)
    listed = await v1.list_namespaced_config_map("default")
    await v1.create_namespaced_config_map("default", {"metadata": {"name": "w1"}})
    await v1.patch_namespaced_config_map("w1", "default", {"data": {"a": "b"}})
    await v1.delete_namespaced_config_map("w1", "default")
    seen = []
    w = watch.Watch()
    async for ev in w.stream(v1.list_namespaced_config_map, "default",
                             resource_version=listed.metadata.resource_version, timeout_seconds=5):
        seen.append((ev["type"], ev["object"].metadata.name))
        if len(seen) == 3:
            w.stop()
    await w.close()
    assert seen == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]


async def test_watch_with_a_too_old_resource_version_gets_410(lab, api):
    v1 = client.CoreV1Api(api)
    first = await v1.create_namespaced_config_map("default", {"metadata": {"name": "old"}})
    for i in range(60):   # the fixture keeps 50 events of history per resource
        await v1.patch_namespaced_config_map("old", "default", {"data": {"i": str(i)}})
    w = watch.Watch()
    with pytest.raises(ApiException) as exc:
        async for _ in w.stream(v1.list_namespaced_config_map, "default",
                                resource_version=first.metadata.resource_version, timeout_seconds=5):
            pass
    await w.close()
    assert exc.value.status == 410


async def test_watch_bookmarks_and_timeout(lab, admin_files):
    url = "/api/v1/namespaces/default/configmaps?watch=true&allowWatchBookmarks=true&timeoutSeconds=1"
    listed = lab.server.store.current_rv
    async with aiohttp.ClientSession() as s:
        async with s.get(lab.server.url + url + f"&resourceVersion={listed}", ssl=_ssl(lab, admin_files)) as r:
            assert r.status == 200
            lines = [json.loads(line) async for line in r.content if line.strip()]
    # The stream ended by itself after timeoutSeconds, with bookmarks every 0.2 s carrying the current version.
    bookmarks = [e for e in lines if e["type"] == "BOOKMARK"]
    assert len(bookmarks) >= 2
    assert bookmarks[0]["object"]["kind"] == "ConfigMap"
    assert int(bookmarks[-1]["object"]["metadata"]["resourceVersion"]) >= listed


async def test_watch_initial_events_and_label_selector(lab, api):
    v1 = client.CoreV1Api(api)
    await v1.create_namespaced_config_map("default", {"metadata": {"name": "pre", "labels": {"w": "yes"}}})
    w = watch.Watch()
    seen = []
    stream = w.stream(v1.list_namespaced_config_map, "default", label_selector="w=yes", timeout_seconds=5)
    async for ev in stream:
        seen.append((ev["type"], ev["object"].metadata.name))
        if len(seen) == 1:
            await v1.create_namespaced_config_map("default", {"metadata": {"name": "no"}})
            await v1.create_namespaced_config_map("default", {"metadata": {"name": "post", "labels": {"w": "yes"}}})
        if len(seen) == 2:
            w.stop()
    await w.close()
    assert seen == [("ADDED", "pre"), ("ADDED", "post")]


# ---------------------------------------------------------------- garbage collection and namespaces

async def test_owned_objects_are_collected_in_the_background(api):
    v1 = client.CoreV1Api(api)
    co = client.CustomObjectsApi(api)
    owner = await co.create_cluster_custom_object(GROUP, VERSION, "clusterpeers", peer("owner"))
    ref = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterPeer", "name": "owner",
           "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": False}
    await v1.create_namespaced_secret("default", {"metadata": {"name": "peer-owner", "ownerReferences": [ref]}})
    other = await v1.create_namespaced_config_map("default", {"metadata": {"name": "keep"}})
    other_ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "keep", "uid": other.metadata.uid}
    await v1.create_namespaced_config_map("default", {"metadata": {"name": "two-owners",
                                                                    "ownerReferences": [ref, other_ref]}})
    await co.delete_cluster_custom_object(GROUP, VERSION, "clusterpeers", "owner")

    async def secret_gone():
        try:
            await v1.read_namespaced_secret("peer-owner", "default")
            return False
        except ApiException as exc:
            return exc.status == 404

    await until(secret_gone)
    survivor = await v1.read_namespaced_config_map("two-owners", "default")
    assert [r.uid for r in survivor.metadata.owner_references] == [other.metadata.uid]


async def test_foreground_and_orphan_propagation(lab, api):
    v1 = client.CoreV1Api(api)
    for policy in ("Foreground", "Orphan"):
        owner = await v1.create_namespaced_config_map("default", {"metadata": {"name": f"o-{policy.lower()}"}})
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name, "uid": owner.metadata.uid,
               "blockOwnerDeletion": True}
        await v1.create_namespaced_config_map("default", {"metadata": {"name": f"d-{policy.lower()}",
                                                                        "ownerReferences": [ref]}})
        await v1.delete_namespaced_config_map(owner.metadata.name, "default", propagation_policy=policy)
        await until(lambda: lab.server.get("", "configmaps", owner.metadata.name, "default") is None)
        dependent = lab.server.get("", "configmaps", f"d-{policy.lower()}", "default")
        if policy == "Foreground":
            assert dependent is None, "the owner went only after its dependent"
        else:
            assert dependent is not None and not dependent["metadata"].get("ownerReferences")


async def test_namespace_deletion_removes_its_contents(lab, api):
    v1 = client.CoreV1Api(api)
    await v1.create_namespace({"metadata": {"name": "doomed"}})
    await v1.create_namespaced_config_map("doomed", {"metadata": {"name": "held", "finalizers": ["lab/hold"]}})
    await v1.create_namespaced_secret("doomed", {"metadata": {"name": "s"}})
    await v1.delete_namespace("doomed")
    ns = await v1.read_namespace("doomed")
    assert ns.status.phase == "Terminating"
    with pytest.raises(ApiException) as exc:
        await v1.create_namespaced_config_map("doomed", {"metadata": {"name": "late"}})
    assert exc.value.status == 403 and json.loads(exc.value.body)["message"] == (
        'configmaps "late" is forbidden: unable to create new content in namespace doomed because it is being '
        "terminated")
    await until(lambda: lab.server.get("", "secrets", "s", "doomed") is None)
    await v1.patch_namespaced_config_map("held", "doomed", {"metadata": {"finalizers": None}})
    await until(lambda: lab.server.get("", "namespaces", "doomed") is None)


# ---------------------------------------------------------------- tables

async def test_table_output_with_clusterpeer_columns(lab, api, admin_files):
    co = client.CustomObjectsApi(api)
    await co.create_cluster_custom_object(GROUP, VERSION, "clusterpeers", peer("t"))
    await co.patch_cluster_custom_object_status(GROUP, VERSION, "clusterpeers", "t", {"status": {
        "phase": "Active", "effectiveCapabilities": ["a", "b"],
        "conditions": [{"type": "Ready", "status": "True", "reason": "Ok", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}, **MERGE)
    status, _, tbl = await raw(lab, "GET", f"/apis/{GROUP}/{VERSION}/clusterpeers", cert_key=admin_files,
                               headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"})
    assert status == 200 and tbl["kind"] == "Table"
    names = [c["name"] for c in tbl["columnDefinitions"]]
    row = dict(zip(names, tbl["rows"][0]["cells"]))
    assert (row["Name"], row["Phase"], row["Ready"], row["Effective"]) == ("t", "Active", "True", '["a","b"]')
    assert tbl["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    status, _, tbl = await raw(lab, "GET", "/api/v1/namespaces", cert_key=admin_files,
                               headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    assert [c["name"] for c in tbl["columnDefinitions"]] == ["Name", "Status", "Age"]


# ---------------------------------------------------------------- authentication, authorization, sensitive fields

async def test_unauthenticated_requests(lab, admin_files):
    # No credentials: the anonymous user, refused by RBAC (403) except what system:public-info-viewer grants, as
    # kube-apiserver with anonymous requests on (the differential test compares them).
    status, _, body = await raw(lab, "GET", "/api/v1/namespaces")
    assert status == 403 and body["reason"] == "Forbidden" and 'User "system:anonymous"' in body["message"]
    status, _, body = await raw(lab, "GET", "/api/v1/namespaces", token="not-a-token")
    assert status == 401 and body["reason"] == "Unauthorized" and body["kind"] == "Status"
    for path in ("/version", "/healthz", "/readyz"):
        status, _, _ = await raw(lab, "GET", path)
        assert status == 200, path
    for path in ("/.well-known/openid-configuration", "/openid/v1/jwks"):   # for ServiceAccounts, by default
        status, _, _ = await raw(lab, "GET", path)
        assert status == 403, path
    _, _, doc = await raw(lab, "GET", "/.well-known/openid-configuration", cert_key=admin_files)
    assert doc["issuer"] == lab.server.url


async def test_the_service_account_keys_are_served_as_a_jwk_set_only(lab, admin_files):
    # As kube-apiserver: application/jwk-set+json or */*; application/json alone (or application/*) is a 406 Status.
    for accept in ("application/jwk-set+json", "*/*", "application/json, application/jwk-set+json"):
        status, headers, body = await raw(lab, "GET", "/openid/v1/jwks", cert_key=admin_files,
                                          headers={"Accept": accept})
        assert status == 200 and headers["Content-Type"].startswith("application/jwk-set+json"), accept
        assert body["keys"], accept
    for accept in ("application/json", "application/*"):
        status, _, body = await raw(lab, "GET", "/openid/v1/jwks", cert_key=admin_files, headers={"Accept": accept})
        assert (status, body["kind"], body["reason"]) == (406, "Status", "NotAcceptable"), accept
        assert body["message"] == "406: Not Acceptable\n\nAvailable representations: application/jwk-set+json"


async def test_discovery_documents(lab, admin_files):
    status, _, root = await raw(lab, "GET", "/", cert_key=admin_files)
    assert status == 200 and "/apis/peering.deckhouse.io/v1alpha1" in root["paths"]
    _, headers, agg = await raw(lab, "GET", "/apis", cert_key=admin_files, headers={
        "Accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"})
    assert "as=APIGroupDiscoveryList" in headers["Content-Type"]
    peering = next(i for i in agg["items"] if i["metadata"]["name"] == "peering.deckhouse.io")
    cp = next(r for r in peering["versions"][0]["resources"] if r["resource"] == "clusterpeers")
    assert cp["scope"] == "Cluster" and cp["shortNames"] == ["cpeer"]
    assert cp["subresources"][0]["subresource"] == "status"
    _, _, legacy = await raw(lab, "GET", "/api/v1", cert_key=admin_files)
    sa = {r["name"]: r for r in legacy["resources"]}
    assert sa["serviceaccounts/token"]["kind"] == "TokenRequest" and sa["configmaps"]["shortNames"] == ["cm"]
    _, _, oa = await raw(lab, "GET", "/openapi/v3", cert_key=admin_files)
    url = oa["paths"]["apis/peering.deckhouse.io/v1alpha1"]["serverRelativeURL"]
    _, _, doc = await raw(lab, "GET", url, cert_key=admin_files)
    patch_op = doc["paths"]["/apis/peering.deckhouse.io/v1alpha1/clusterpeers/{name}"]["patch"]
    assert {"name": "fieldValidation", "in": "query"}.items() <= patch_op["parameters"][2].items()


async def test_forbidden_message_and_sensitive_masking(lab, api, tmp_path):
    co = client.CustomObjectsApi(api)
    rbac = client.RbacAuthorizationV1Api(api)
    await co.create_cluster_custom_object(GROUP, VERSION, "clusterpeers", peer("s"))
    await rbac.create_cluster_role({"metadata": {"name": "peer-editor"}, "rules": [
        {"apiGroups": [GROUP], "resources": ["clusterpeers"], "verbs": ["get", "list", "watch", "update"]}]})
    await rbac.create_cluster_role_binding({
        "metadata": {"name": "peer-editor"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "peer-editor"},
        "subjects": [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}]})
    async with await lab.client(lab.user_kubeconfig("alice", ["team"])) as alice_api:
        alice = client.CustomObjectsApi(alice_api)
        seen = await alice.get_cluster_custom_object(GROUP, VERSION, "clusterpeers", "s")
        assert seen["spec"]["join"]["connectionString"] == "<omitted>"
        listed = await alice.list_cluster_custom_object(GROUP, VERSION, "clusterpeers")
        assert listed["items"][0]["spec"]["join"]["connectionString"] == "<omitted>"
        # Writing the masked value back keeps the stored one.
        seen["metadata"].setdefault("labels", {})["touched"] = "yes"
        await alice.replace_cluster_custom_object(GROUP, VERSION, "clusterpeers", "s", seen)
        with pytest.raises(ApiException) as exc:
            await client.CoreV1Api(alice_api).list_namespaced_secret("default")
        assert exc.value.status == 403
        assert json.loads(exc.value.body)["message"] == (
            'secrets is forbidden: User "alice" cannot list resource "secrets" in API group "" '
            'in the namespace "default"')
        # Granting more than one holds is refused (RBAC escalation prevention).
        with pytest.raises(ApiException):
            await client.RbacAuthorizationV1Api(alice_api).create_cluster_role(
                {"metadata": {"name": "more"}, "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]})
    stored = await co.get_cluster_custom_object(GROUP, VERSION, "clusterpeers", "s")
    assert stored["spec"]["join"]["connectionString"] == "secret-connection-string"
    assert stored["metadata"]["labels"]["touched"] == "yes"


async def test_token_request_and_review(lab, api):
    v1 = client.CoreV1Api(api)
    await v1.create_namespaced_service_account("default", {"metadata": {"name": "robot"}})
    tr = await v1.create_namespaced_service_account_token("robot", "default", {
        "spec": {"audiences": ["peering.deckhouse.io/u/c"], "expirationSeconds": 600}})
    token = tr.status.token
    review = await client.AuthenticationV1Api(api).create_token_review(
        {"spec": {"token": token, "audiences": ["peering.deckhouse.io/u/c"]}})
    assert review.status.authenticated and review.status.user.username == "system:serviceaccount:default:robot"
    # An API-audience token of the ServiceAccount authenticates as it, and RBAC applies to it.
    api_token = (await v1.create_namespaced_service_account_token("robot", "default", {"spec": {}})).status.token
    status, _, body = await raw(lab, "GET", "/api/v1/namespaces/default/configmaps", token=api_token)
    assert status == 403 and 'User "system:serviceaccount:default:robot"' in body["message"]


async def test_crd_created_at_run_time_is_discovered_and_served(lab, api):
    ext = client.ApiextensionsV1Api(api)
    await ext.create_custom_resource_definition({
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "properties": {"spec": {"type": "object", "properties": {
                         "size": {"type": "integer", "maximum": 10}}}}}}}]}})
    groups = await client.ApisApi(api).get_api_versions()
    assert "example.com" in [g.name for g in groups.groups]
    co = client.CustomObjectsApi(api)
    made = await co.create_namespaced_custom_object("example.com", "v1", "default", "widgets", {
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 3}})
    assert made["metadata"]["generation"] == 1
    with pytest.raises(ApiException) as exc:
        await co.create_namespaced_custom_object("example.com", "v1", "default", "widgets", {
            "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "x"}, "spec": {"size": 30}})
    assert exc.value.status == 422 and json.loads(exc.value.body)["details"]["causes"][0]["field"] == "spec.size"
    await ext.delete_custom_resource_definition("widgets.example.com")
    await until(lambda: lab.server.registry.get("example.com", "v1", "widgets") is None)


async def test_list_and_watch_of_one_name_are_authorized_by_resource_names(lab, api):
    rbac = client.RbacAuthorizationV1Api(api)
    await rbac.create_namespaced_role("kube-system", {"metadata": {"name": "uuid-reader"}, "rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"],
         "resourceNames": ["d8-cluster-uuid"]}]})
    await rbac.create_namespaced_role_binding("kube-system", {
        "metadata": {"name": "uuid-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "uuid-reader"},
        "subjects": [{"kind": "User", "name": "reader", "apiGroup": "rbac.authorization.k8s.io"}]})
    await client.CoreV1Api(api).create_namespaced_config_map("kube-system", {
        "metadata": {"name": "d8-cluster-uuid"}, "data": {"cluster-uuid": "u"}})
    async with await lab.client(lab.user_kubeconfig("reader")) as reader_api:
        v1 = client.CoreV1Api(reader_api)
        one = await v1.list_namespaced_config_map("kube-system", field_selector="metadata.name=d8-cluster-uuid")
        assert [i.metadata.name for i in one.items] == ["d8-cluster-uuid"]
        with pytest.raises(ApiException) as exc:
            await v1.list_namespaced_config_map("kube-system")
        assert exc.value.status == 403


async def test_events_of_both_apis_are_one_store(lab, api):
    ev = client.EventsV1Api(api)
    await ev.create_namespaced_event("default", {
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e1"},
        "eventTime": "2026-01-01T00:00:00.000000Z", "reason": "PeerJoined", "type": "Normal", "action": "Join",
        "note": "cluster b joined", "reportingController": "peering", "reportingInstance": "peering-0",
        "regarding": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterPeer", "name": "b"}})
    core = await client.CoreV1Api(api).read_namespaced_event("e1", "default")
    assert core.message == "cluster b joined" and core.involved_object.name == "b"
    assert core.reporting_component == "peering"
    patched = await ev.patch_namespaced_event("e1", "default", {"note": "again", "deprecatedCount": 2},
                                              _content_type="application/merge-patch+json")
    assert patched.note == "again" and patched.deprecated_count == 2
    assert (await client.CoreV1Api(api).read_namespaced_event("e1", "default")).count == 2
    code, out, err = await lab.kubectl("get", "events", "-n", "default", "-o", "jsonpath={.items[*].message}")
    assert code == 0 and out == "again", err


async def test_access_ends_as_soon_as_the_binding_goes(lab, api):
    rbac = client.RbacAuthorizationV1Api(api)
    await rbac.create_namespaced_role_binding("default", {
        "metadata": {"name": "carol-view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "User", "name": "carol", "apiGroup": "rbac.authorization.k8s.io"}]})
    async with await lab.client(lab.user_kubeconfig("carol")) as carol_api:
        v1 = client.CoreV1Api(carol_api)
        for _ in range(3):   # repeated requests are answered from the decision cache
            await v1.list_namespaced_config_map("default")
        await rbac.delete_namespaced_role_binding("carol-view", "default")
        with pytest.raises(ApiException) as exc:
            await v1.list_namespaced_config_map("default")
        assert exc.value.status == 403


async def test_in_process_access_validates_watches_and_ends_on_stop(lab):
    server = lab.server
    events = []

    async def consume():
        async for kind, obj in server.watch("", "configmaps", "default"):
            events.append((kind, obj["metadata"]["name"]))

    task = asyncio.get_running_loop().create_task(consume())
    await until(lambda: server._watchers)   # the watch is registered once the task has started
    made = server.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ip", "namespace": "default"}})
    made["data"] = {"a": "b"}
    server.update(made)
    with pytest.raises(Exception) as exc:
        server.update(made)   # the resourceVersion it carries is now stale
    assert getattr(exc.value, "code", None) == 409
    assert [o["metadata"]["name"] for o in server.list("", "configmaps", "default")] == ["ip"]
    server.delete("", "configmaps", "ip", "default")
    await until(lambda: len(events) == 3)
    assert events == [("ADDED", "ip"), ("MODIFIED", "ip"), ("DELETED", "ip")]
    await server.stop()
    await asyncio.wait_for(task, 5)


async def test_paged_lists_are_consistent_snapshots(lab, api):
    v1 = client.CoreV1Api(api)
    for i in range(5):
        await v1.create_namespaced_config_map("default", {"metadata": {"name": f"pg{i}", "labels": {"pg": "1"}}})
    first = await v1.list_namespaced_config_map("default", label_selector="pg=1", limit=2)
    assert [i.metadata.name for i in first.items] == ["pg0", "pg1"]
    # With a selector kube-apiserver cannot count what is left: no remainingItemCount (the differential test).
    assert first.metadata.remaining_item_count is None and first.metadata._continue
    unselected = await v1.list_namespaced_config_map("default", limit=2)
    assert unselected.metadata.remaining_item_count == len(
        (await v1.list_namespaced_config_map("default")).items) - 2
    await v1.delete_namespaced_config_map("pg3", "default")   # after the first page: the snapshot still has it
    names = [i.metadata.name for i in first.items]
    token = first.metadata._continue
    while token:
        page = await v1.list_namespaced_config_map("default", label_selector="pg=1", limit=2, _continue=token)
        names += [i.metadata.name for i in page.items]
        assert page.metadata.resource_version == first.metadata.resource_version
        token = page.metadata._continue
    assert names == ["pg0", "pg1", "pg2", "pg3", "pg4"]
    with pytest.raises(ApiException) as exc:
        await v1.list_namespaced_config_map("default", limit=2, _continue="eyJpZCI6ICJub3BlIiwgIm9mZnNldCI6IDJ9")
    assert exc.value.status == 410


async def test_bodies_over_3_mib_are_refused_with_a_status(lab, admin_files):
    body = {"metadata": {"name": "big"}, "data": {"x": "a" * (3 * 1024 * 1024)}}
    status, _, answer = await raw(lab, "POST", "/api/v1/namespaces/default/configmaps", cert_key=admin_files,
                                  headers={"Content-Type": "application/json"}, body=body)
    assert status == 413 and answer["reason"] == "RequestEntityTooLarge"


async def test_custom_resources_refuse_an_unconditional_update(api):
    co = client.CustomObjectsApi(api)
    obj = await co.create_cluster_custom_object(GROUP, VERSION, "clusterpeers", peer("u"))
    del obj["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as exc:
        await co.replace_cluster_custom_object(GROUP, VERSION, "clusterpeers", "u", obj)
    status = json.loads(exc.value.body)
    assert exc.value.status == 422 and status["details"]["causes"][0]["field"] == "metadata.resourceVersion"
    v1 = client.CoreV1Api(api)   # built-ins allow it
    await v1.create_namespaced_config_map("default", {"metadata": {"name": "uu"}})
    await v1.replace_namespaced_config_map("uu", "default", {"metadata": {"name": "uu"}, "data": {"a": "b"}})


async def test_a_watcher_that_falls_behind_is_dropped_with_410(tmp_path):
    from lab.apiserver.testing import start_test_apiserver
    server, _kubeconfig, cert, key, ca_pem = await start_test_apiserver(tmp_path, watch_queue=2)
    try:
        (tmp_path / "c.pem").write_bytes(cert)
        (tmp_path / "k.pem").write_bytes(key)
        ctx = ssl.create_default_context(cadata=ca_pem.decode())
        ctx.load_cert_chain(str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))
        url = f"{server.url}/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={server.store.current_rv}"
        async with aiohttp.ClientSession() as s:
            async with s.get(url, ssl=ctx) as r:
                await until(lambda: server._watchers)
                for i in range(10):   # written without yielding: the watcher's queue of 2 overflows
                    server.create({"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"name": f"f{i}", "namespace": "default"}})
                lines = [json.loads(line) async for line in r.content if line.strip()]
        assert lines[-1]["type"] == "ERROR" and lines[-1]["object"]["code"] == 410
        assert len(lines) <= 3, "the stream ends at the error instead of catching up"
        assert len(server.list("", "configmaps", "default")) == 10, "writers never waited for the watcher"
    finally:
        await server.stop()
