"""CRUD with resourceVersion preconditions, the three patch types where the module and kubectl use them, deletes
with preconditions, and status writes, on a custom resource (ClusterPeer, ProjectPeer) and on built-ins
(ConfigMap, Namespace, Lease), the same on the emulator and on the real kube-apiserver."""

from __future__ import annotations

import pytest
from differential_support import Backend, Deliberate

pytestmark = pytest.mark.asyncio(loop_scope="module")

CP = "/apis/peering.deckhouse.io/v1alpha1/clusterpeers"
NS = "diff-crud"
CM = f"/api/v1/namespaces/{NS}/configmaps"
PP = f"/apis/peering.deckhouse.io/v1alpha1/namespaces/{NS}/projectpeers"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def invite(name: str, **spec) -> dict:
    return {"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer", "metadata": {"name": name},
            "spec": {"type": "Invite", **spec}}


def rv(answer) -> str:
    return answer.body["metadata"]["resourceVersion"]


async def namespace(b: Backend, name: str = NS) -> None:
    got = await b.call("GET", f"/api/v1/namespaces/{name}")
    if got.status == 404:
        made = await b.call("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                                 "metadata": {"name": name}})
        assert made.status == 201, made


async def test_create_get_conflicts(pair):
    async def case(b: Backend):
        s = {}
        s["create"] = await b.call("POST", CP, body=invite("crud-a", capabilities=["configmaps-read"]))
        s["create again"] = await b.call("POST", CP, body=invite("crud-a"))
        s["get"] = await b.call("GET", f"{CP}/crud-a")
        s["get missing"] = await b.call("GET", f"{CP}/crud-missing")
        current = s["get"].body
        changed = {**current, "spec": {**current["spec"], "capabilities": ["configmaps-write"]}}
        s["update"] = await b.call("PUT", f"{CP}/crud-a", body=changed)
        s["update stale"] = await b.call("PUT", f"{CP}/crud-a", body={**changed, "spec": {"type": "Invite"}})
        unconditional = {**changed, "metadata": {k: v for k, v in changed["metadata"].items()
                                                 if k != "resourceVersion"}}
        s["update without resourceVersion"] = await b.call("PUT", f"{CP}/crud-a", body=unconditional)
        s["update missing"] = await b.call("PUT", f"{CP}/crud-missing", body={
            **invite("crud-missing"), "metadata": {"name": "crud-missing", "resourceVersion": "1"}})
        s["update name mismatch"] = await b.call("PUT", f"{CP}/crud-other", body=s["update"].body)
        s["no-op update"] = await b.call("PUT", f"{CP}/crud-a", body=s["update"].body)
        s["no-op keeps resourceVersion"] = rv(s["no-op update"]) == rv(s["update"])
        return s

    await pair.run(case)


async def test_generate_name_and_bad_names(pair):
    async def case(b: Backend):
        s = {}
        made = await b.call("POST", CP, body={**invite(""), "metadata": {"generateName": "crud-gen-"}})
        s["generateName"] = made
        s["generated name form"] = made.body["metadata"]["name"].startswith("crud-gen-") and len(
            made.body["metadata"]["name"]) == len("crud-gen-") + 5
        made.body["metadata"]["name"] = "<generated>"
        s["upper-case name"] = await b.call("POST", CP, body=invite("Crud-Upper"))
        s["no name"] = await b.call("POST", CP, body={**invite(""), "metadata": {}})
        s["kind mismatch"] = await b.call("POST", CP, body={**invite("crud-kind"), "kind": "ProjectPeer"})
        return s

    await pair.run(case)


async def test_patches_of_a_custom_resource(pair):
    async def case(b: Backend):
        s = {}
        made = await b.call("POST", CP, body=invite("crud-patch", capabilities=["a"]))
        assert made.status == 201, made
        s["merge"] = await b.call("PATCH", f"{CP}/crud-patch", body={"spec": {"capabilities": ["b", "c"]}},
                                  content_type=MERGE)
        s["merge with stale resourceVersion"] = await b.call(
            "PATCH", f"{CP}/crud-patch", content_type=MERGE,
            body={"metadata": {"resourceVersion": rv(made)}, "spec": {"capabilities": ["d"]}})
        s["merge with current resourceVersion"] = await b.call(
            "PATCH", f"{CP}/crud-patch", content_type=MERGE,
            body={"metadata": {"resourceVersion": rv(s["merge"])}, "spec": {"capabilities": ["d"]}})
        s["json patch"] = await b.call("PATCH", f"{CP}/crud-patch", content_type=JSON_PATCH, body=[
            {"op": "test", "path": "/spec/capabilities/0", "value": "d"},
            {"op": "add", "path": "/spec/capabilities/-", "value": "e"}])
        s["json patch failed test"] = await b.call("PATCH", f"{CP}/crud-patch", content_type=JSON_PATCH, body=[
            {"op": "test", "path": "/spec/capabilities/0", "value": "zzz"}])
        s["json patch bad path"] = await b.call("PATCH", f"{CP}/crud-patch", content_type=JSON_PATCH, body=[
            {"op": "replace", "path": "/spec/nothing/here", "value": 1}])
        s["strategic on a custom resource"] = await b.call(
            "PATCH", f"{CP}/crud-patch", content_type=STRATEGIC, body={"spec": {"capabilities": ["x"]}})
        s["merge patch of missing"] = await b.call("PATCH", f"{CP}/crud-none", content_type=MERGE,
                                                   body={"spec": {"capabilities": []}})
        s["patch not json"] = await b.call("PATCH", f"{CP}/crud-patch", content_type=MERGE, data="{not json")
        s["unsupported patch type"] = await b.call("PATCH", f"{CP}/crud-patch", content_type="text/plain",
                                                   data="{}")
        return s

    why = ("kube-apiserver answers every failed JSON patch with a generic message; the emulator names the "
           "operation that failed")
    generic = "the server rejected our request due to an error in our request"
    await pair.run(case, deliberate=(
        Deliberate("json patch failed test", ("body", "message"),
                   'the JSON patch test of "/spec/capabilities/0" failed: the value differs', generic, why),
        Deliberate("json patch bad path", ("body", "message"),
                   'the JSON patch path "/spec/nothing/here" does not exist in the object', generic, why)))


async def test_configmap_writes_and_strategic_patch(pair):
    async def case(b: Backend):
        await namespace(b)
        s = {}
        s["create"] = await b.call("POST", CM, body={"apiVersion": "v1", "kind": "ConfigMap",
                                                     "metadata": {"name": "crud-cm", "labels": {"app": "x"}},
                                                     "data": {"a": "1"}})
        s["strategic"] = await b.call("PATCH", f"{CM}/crud-cm", content_type=STRATEGIC,
                                      body={"metadata": {"labels": {"tier": "y"}}, "data": {"b": "2"}})
        s["strategic delete key"] = await b.call("PATCH", f"{CM}/crud-cm", content_type=STRATEGIC,
                                                 body={"data": {"a": None}})
        body = dict(s["strategic delete key"].body)
        body["metadata"] = {k: v for k, v in body["metadata"].items() if k != "resourceVersion"}
        body["data"] = {"c": "3"}
        s["unconditional update"] = await b.call("PUT", f"{CM}/crud-cm", body=body)
        s["in another namespace"] = await b.call("POST", f"/api/v1/namespaces/{NS}-absent/configmaps", body={
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
        s["namespace mismatch"] = await b.call("POST", CM, body={
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "crud-ns", "namespace": "default"}})
        s["binaryData not base64"] = await b.call("POST", CM, body={
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "crud-bin"}, "binaryData": {"k": "%%%"}})
        await b.call("PATCH", f"{CM}/crud-cm", content_type=MERGE, body={"metadata": {"finalizers": ["a.b/c"]}})
        s["delete held"] = await b.call("DELETE", f"{CM}/crud-cm")
        s["add a finalizer while deleting"] = await b.call(
            "PATCH", f"{CM}/crud-cm", content_type=MERGE, body={"metadata": {"finalizers": ["a.b/c", "a.b/d"]}})
        s["unsupported patch type"] = await b.call("PATCH", f"{CM}/crud-cm", content_type="text/plain", data="{}")
        s["release"] = await b.call("PATCH", f"{CM}/crud-cm", content_type=MERGE,
                                    body={"metadata": {"finalizers": None}})
        for value in ("abc", "ab=c", "abcd=", "YQ", "YQ=", "YQ==="):
            s[f"binaryData {value}"] = await b.call("POST", CM, body={
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "crud-b64"},
                "binaryData": {"k": value}})
            await b.call("DELETE", f"{CM}/crud-b64")
        s["secret data not base64"] = await b.call("POST", f"/api/v1/namespaces/{NS}/secrets", body={
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "crud-secret"}, "data": {"k": "n0t base64"}})
        s["delete"] = await b.call("GET", f"{CM}/crud-cm")
        s["delete again"] = await b.call("DELETE", f"{CM}/crud-cm")
        return s

    await pair.run(case)


async def test_deletes_with_preconditions(pair):
    async def case(b: Backend):
        s = {}
        made = await b.call("POST", CP, body=invite("crud-del"))
        s["stale resourceVersion"] = await b.call("DELETE", f"{CP}/crud-del", body={
            "kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"resourceVersion": "1"}})
        s["wrong uid"] = await b.call("DELETE", f"{CP}/crud-del", body={
            "kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}})
        s["right preconditions"] = await b.call("DELETE", f"{CP}/crud-del", body={
            "kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background",
            "preconditions": {"resourceVersion": rv(made), "uid": made.body["metadata"]["uid"]}})
        s["gone"] = await b.call("GET", f"{CP}/crud-del")
        s["bad propagation"] = await b.call("DELETE", f"{CP}/crud-missing", body={
            "kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Sideways"})
        return s

    await pair.run(case)


async def test_finalizers_hold_a_deletion(pair):
    async def case(b: Backend):
        s = {}
        await b.call("POST", CP, body={**invite("crud-fin"), "metadata": {"name": "crud-fin",
                                                                           "finalizers": ["example.com/hold"]}})
        s["delete"] = await b.call("DELETE", f"{CP}/crud-fin")
        s["get while held"] = await b.call("GET", f"{CP}/crud-fin")
        s["add a finalizer while deleting"] = await b.call(
            "PATCH", f"{CP}/crud-fin", content_type=MERGE,
            body={"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}})
        s["release"] = await b.call("PATCH", f"{CP}/crud-fin", content_type=MERGE,
                                    body={"metadata": {"finalizers": None}})
        s["gone"] = await b.call("GET", f"{CP}/crud-fin")
        return s

    await pair.run(case)


async def test_status_subresource(pair):
    async def case(b: Backend):
        s = {}
        made = await b.call("POST", CP, body=invite("crud-status"))
        status = {"phase": "Pending", "observedGeneration": 1,
                  "conditions": [{"type": "Ready", "status": "False", "reason": "Waiting", "message": "m",
                                  "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        s["status through the main resource on create"] = made
        s["put status"] = await b.call("PUT", f"{CP}/crud-status/status", body={
            **made.body, "spec": {"type": "Invite", "capabilities": ["ignored"]}, "status": status})
        s["put status stale"] = await b.call("PUT", f"{CP}/crud-status/status", body={
            **made.body, "status": {"phase": "Active"}})
        current = s["put status"].body
        s["status through the main resource"] = await b.call("PUT", f"{CP}/crud-status", body={
            **current, "status": {"phase": "Error"}})
        s["merge patch of status"] = await b.call("PATCH", f"{CP}/crud-status/status", content_type=MERGE,
                                                  body={"status": {"phase": "Active"}})
        s["invalid status"] = await b.call("PATCH", f"{CP}/crud-status/status", content_type=MERGE, body={
            "status": {"conditions": [{"type": "Ready", "status": "Maybe"}]}})
        s["get status"] = await b.call("GET", f"{CP}/crud-status/status")
        s["status of missing"] = await b.call("GET", f"{CP}/crud-none/status")
        s["unknown subresource"] = await b.call("GET", f"{CP}/crud-status/scale")
        return s

    await pair.run(case)


async def test_projectpeer_status_as_the_module_writes_it(pair):
    async def case(b: Backend):
        await namespace(b)
        s = {}
        made = await b.call("POST", PP, body={"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ProjectPeer",
                                              "metadata": {"name": "crud-pp", "labels": {"x": "y"}}})
        s["create"] = made
        s["update status"] = await b.call("PUT", f"{PP}/crud-pp/status", body={
            **made.body, "status": {"state": "Paired", "clusterUUID": "u", "remoteNamespaces": ["n"],
                                    "capabilities": [{"name": "c", "scope": ["project"], "version": "v1"}]}})
        s["bad state"] = await b.call("PUT", f"{PP}/crud-pp/status", body={
            **s["update status"].body, "status": {"state": "Sideways"}})
        return s

    await pair.run(case)


async def test_namespace_lifecycle(pair):
    """A namespace whose content is held by a finalizer stays Terminating on both (the namespace controller waits),
    so what the API answers meanwhile is the same whatever the controllers' speed."""
    async def case(b: Backend):
        s = {}
        ns = "diff-ns-life"
        s["create"] = await b.call("POST", "/api/v1/namespaces", body={
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        s["held content"] = await b.call("POST", f"/api/v1/namespaces/{ns}/configmaps", body={
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "held", "finalizers": ["example.com/x"]}})
        s["delete"] = await b.call("DELETE", f"/api/v1/namespaces/{ns}")
        s["create in terminating"] = await b.call("POST", f"/api/v1/namespaces/{ns}/configmaps", body={
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}})
        s["delete again"] = await b.call("DELETE", f"/api/v1/namespaces/{ns}")
        await b.call("PATCH", f"/api/v1/namespaces/{ns}/configmaps/held", content_type=MERGE,
                     body={"metadata": {"finalizers": None}})
        for immortal in ("default", "kube-system", "kube-public"):
            s[f"delete {immortal}"] = await b.call("DELETE", f"/api/v1/namespaces/{immortal}")
        return s

    await pair.run(case)


async def test_lease_as_the_leader_election_writes_it(pair):
    async def case(b: Backend):
        await namespace(b)
        s = {}
        spec = {"holderIdentity": "peering-0", "leaseDurationSeconds": 15, "acquireTime": "2026-01-01T00:00:00.000000Z",
                "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 0}
        s["create"] = await b.call("POST", LEASES, body={"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                                         "metadata": {"name": "crud-lease"}, "spec": spec})
        s["renew"] = await b.call("PUT", f"{LEASES}/crud-lease", body={
            **s["create"].body, "spec": {**spec, "renewTime": "2026-01-01T00:00:05.000000Z"}})
        s["renew stale"] = await b.call("PUT", f"{LEASES}/crud-lease", body={
            **s["create"].body, "spec": {**spec, "holderIdentity": "peering-1"}})
        s["bad duration"] = await b.call("POST", LEASES, body={
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "crud-lease-bad"},
            "spec": {**spec, "leaseDurationSeconds": 0}})
        return s

    await pair.run(case)


async def test_lease_as_the_uuid_claim_writes_it(pair):
    """control/uuid_claim.py: a Lease owned by a ClusterPeer, made once (the second create is AlreadyExists),
    taken over by a delete whose uid and resourceVersion preconditions must hold."""
    async def case(b: Backend):
        await namespace(b)
        s = {}
        owner = await b.call("POST", CP, body=invite("crud-claimer"))
        ref = {"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer", "name": "crud-claimer",
               "uid": owner.body["metadata"]["uid"], "controller": True, "blockOwnerDeletion": False}
        claim = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": "peer-uuid-crud", "labels": {"app.kubernetes.io/managed-by": "peering"},
                              "ownerReferences": [ref]},
                 "spec": {"holderIdentity": "crud-claimer"}}
        s["create"] = await b.call("POST", LEASES, body=claim)
        s["create again"] = await b.call("POST", LEASES, body=claim)
        made = s["create"].body["metadata"]
        s["delete stale resourceVersion"] = await b.call("DELETE", f"{LEASES}/peer-uuid-crud", body={
            "kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"uid": made["uid"], "resourceVersion": "1"}})
        s["delete wrong uid"] = await b.call("DELETE", f"{LEASES}/peer-uuid-crud", body={
            "kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"uid": "00000000-0000-0000-0000-000000000000",
                              "resourceVersion": made["resourceVersion"]}})
        s["delete"] = await b.call("DELETE", f"{LEASES}/peer-uuid-crud", body={
            "kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"uid": made["uid"], "resourceVersion": made["resourceVersion"]}})
        s["delete gone"] = await b.call("DELETE", f"{LEASES}/peer-uuid-crud", body={
            "kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"uid": made["uid"], "resourceVersion": made["resourceVersion"]}})
        s["create after"] = await b.call("POST", LEASES, body=claim)
        return s

    await pair.run(case)
