"""What kubectl reads to print and to find resources: server-side Tables for the module's CRDs (their printer
columns) and for the built-ins the guide lists, Tables in a watch (`kubectl get -w`), and discovery of the groups
the module uses (legacy and aggregated), the same on the emulator and on the real kube-apiserver."""

from __future__ import annotations

import pytest
import pytest_asyncio
from differential_support import Backend

pytestmark = pytest.mark.asyncio(loop_scope="module")

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
TABLE_KUBECTL = f"{TABLE},application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
CP = "/apis/peering.deckhouse.io/v1alpha1/clusterpeers"
PC = "/apis/peering.deckhouse.io/v1alpha1/peeringcapabilities"
NS = "diff-table"
PP = f"/apis/peering.deckhouse.io/v1alpha1/namespaces/{NS}/projectpeers"
CM = f"/api/v1/namespaces/{NS}/configmaps"
MERGE = "application/merge-patch+json"
# The module's groups and the built-in resources it and the guide use: discovery is compared for these.
GROUPS = ("peering.deckhouse.io", "deckhouse.io", "rbac.authorization.k8s.io", "coordination.k8s.io",
          "authentication.k8s.io", "authorization.k8s.io", "events.k8s.io", "apiextensions.k8s.io")
CORE_RESOURCES = ("configmaps", "secrets", "namespaces", "serviceaccounts", "serviceaccounts/token", "events")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def seeded(pair):
    for b in (pair.emulator, pair.real):
        made = await b.call("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                                 "metadata": {"name": NS}})
        assert made.status == 201, made
        for name, spec, status in (
                ("tbl-a", {"type": "Invite", "capabilities": ["c1"]},
                 {"phase": "Active", "effectiveCapabilities": ["c1", "c2"],
                  "conditions": [{"type": "Ready", "status": "True", "reason": "Ok", "message": "",
                                  "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
                ("tbl-b", {"type": "Join", "join": {"connectionString": "d8peer1.x"}}, {"phase": "Pending"}),
                ("tbl-c", {"type": "Invite"}, None)):
            made = await b.call("POST", CP, body={"apiVersion": "peering.deckhouse.io/v1alpha1",
                                                  "kind": "ClusterPeer", "metadata": {"name": name}, "spec": spec})
            assert made.status == 201, made
            if status:
                done = await b.call("PATCH", f"{CP}/{name}/status", content_type=MERGE, body={"status": status})
                assert done.status == 200, done
        made = await b.call("POST", PC, body={"apiVersion": "peering.deckhouse.io/v1alpha1",
                                              "kind": "PeeringCapability", "metadata": {"name": "tbl-cap"},
                                              "spec": {"version": "v2"}})
        assert made.status == 201, made
        made = await b.call("POST", PP, body={"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ProjectPeer",
                                              "metadata": {"name": "tbl-pp"}})
        assert made.status == 201, made
        await b.call("PATCH", f"{PP}/tbl-pp/status", content_type=MERGE,
                     body={"status": {"state": "Paired", "reason": "Both"}})
        made = await b.call("POST", CM, body={"apiVersion": "v1", "kind": "ConfigMap",
                                              "metadata": {"name": "tbl-cm"}, "data": {"a": "1", "b": "2"}})
        assert made.status == 201, made
        made = await b.call("POST", f"/api/v1/namespaces/{NS}/secrets", body={
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tbl-secret"}, "stringData": {"a": "1"}})
        assert made.status == 201, made
        made = await b.call("POST", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", body={
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "tbl-lease"},
            "spec": {"holderIdentity": "peering-0", "leaseDurationSeconds": 15}})
        assert made.status == 201, made
    return pair


def without_age(table: dict) -> dict:
    """A Table with its Age cells (a duration since creation, in whole seconds) reduced to their form."""
    if not isinstance(table, dict) or table.get("kind") != "Table":
        return table
    ages = [i for i, c in enumerate(table.get("columnDefinitions") or []) if c.get("name") == "Age"]
    for row in table.get("rows") or []:
        for i in ages:
            row["cells"][i] = "<age>" if isinstance(row["cells"][i], str) and row["cells"][i][-1:] in "smhd" \
                else row["cells"][i]
    return table


async def test_tables_of_the_modules_resources(seeded):
    async def case(b: Backend):
        s = {}
        for label, path, params in (("clusterpeers", CP, {}), ("one clusterpeer", f"{CP}/tbl-a", {}),
                                    ("peeringcapabilities", PC, {}), ("projectpeers", PP, {}),
                                    ("includeObject None", CP, {"includeObject": "None"}),
                                    ("includeObject Object", f"{CP}/tbl-b", {"includeObject": "Object"}),
                                    ("configmaps", CM, {}), ("a namespace", f"/api/v1/namespaces/{NS}", {}),
                                    ("secrets", f"/api/v1/namespaces/{NS}/secrets", {}),
                                    ("leases", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", {}),
                                    ("paged", CP, {"limit": "2"})):
            answer = await b.call("GET", path, params=params, accept=TABLE_KUBECTL)
            without_age(answer.body)
            s[label] = answer
        s["includeObject bad"] = await b.call("GET", CP, params={"includeObject": "All"}, accept=TABLE)
        s["v1beta1 only"] = await b.call("GET", CP, accept="application/json;as=Table;v=v1beta1;g=meta.k8s.io")
        without_age(s["v1beta1 only"].body)
        s["as YAML"] = await b.call("GET", CP, accept="application/yaml;as=Table;v=v1;g=meta.k8s.io")
        without_age(s["as YAML"].body)
        s["an object as YAML"] = await b.call("GET", f"{CP}/tbl-a", accept="application/yaml")
        return s

    await seeded.run(case)


async def test_a_watch_as_tables(seeded):
    """kubectl get -w: the watch asks for Tables with the list's Accept header."""
    async def case(b: Backend):
        async def write():
            await b.call("POST", CM, body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tbl-w"},
                                           "data": {"k": "v"}})

        listed = await b.call("GET", CM, accept=TABLE)
        head, events = await b.watch(CM, params={"resourceVersion": listed.body["metadata"]["resourceVersion"],
                                                 "timeoutSeconds": "20"}, during=write,
                                     until=lambda ev: bool(ev), accept=TABLE)
        for e in events:
            without_age(e.get("object"))
        return {"watch": head, "events": events}

    await seeded.run(case)


def by_name(resources: list | None, key: str = "name") -> None:
    """A group version's resources in name order: kube-apiserver lists a CRD group's in an order of its own that
    changes from one start to the next."""
    if resources:
        resources.sort(key=lambda r: r.get(key, ""))


def pick(body: dict, key: str, names) -> list:
    return [x for x in body.get(key) or [] if x.get("name") in names]


async def test_discovery_of_the_modules_groups(seeded):
    async def case(b: Backend):
        s = {}
        groups = await b.call("GET", "/apis")
        s["/apis groups"] = pick(groups.body, "groups", GROUPS)
        s["/apis kind"] = {k: v for k, v in groups.body.items() if k != "groups"}
        for g in GROUPS:
            s[f"/apis/{g}"] = await b.call("GET", f"/apis/{g}")
        for gv in ("peering.deckhouse.io/v1alpha1", "deckhouse.io/v1alpha1", "deckhouse.io/v1alpha2",
                   "deckhouse.io/v1alpha3", "rbac.authorization.k8s.io/v1", "coordination.k8s.io/v1",
                   "authentication.k8s.io/v1", "authorization.k8s.io/v1", "events.k8s.io/v1"):
            listed = await b.call("GET", f"/apis/{gv}")
            by_name(listed.body.get("resources"))
            s[f"/apis/{gv}"] = listed
        s["/apis/deckhouse.io/v1alpha1 projects"] = [r["name"] for r in s["/apis/deckhouse.io/v1alpha1"].body.get(
            "resources", []) if r["name"].startswith("project")]
        core = await b.call("GET", "/api/v1")
        s["/api/v1 resources"] = pick(core.body, "resources", CORE_RESOURCES)
        s["/api/v1 kind"] = {k: v for k, v in core.body.items() if k != "resources"}
        legacy = await b.call("GET", "/api")
        s["/api"] = legacy
        aggregated = await b.call("GET", "/apis", accept=AGGREGATED)
        s["aggregated content type"] = aggregated.content_type
        s["aggregated groups"] = [i for i in aggregated.body.get("items", [])
                                  if i["metadata"]["name"] in ("peering.deckhouse.io", "deckhouse.io")]
        for item in s["aggregated groups"]:
            for version in item.get("versions") or []:
                by_name(version.get("resources"), key="resource")
        return s

    await seeded.run(case)
