"""The module's CRDs through validation: the exact Status and causes of enum, maxLength, required, pattern, type,
format, CEL rules (with and without the old object), list-map keys, unknown fields under each fieldValidation,
on create, on update and through /status, the same on the emulator and on the real kube-apiserver."""

from __future__ import annotations

import pytest
from differential_support import Backend

pytestmark = pytest.mark.asyncio(loop_scope="module")

CP = "/apis/peering.deckhouse.io/v1alpha1/clusterpeers"
PC = "/apis/peering.deckhouse.io/v1alpha1/peeringcapabilities"
TEP = "/apis/deckhouse.io/v1alpha1/tokenexchangeproviders"
PROJECTS = "/apis/deckhouse.io/v1alpha3/projects"
UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def peer(name: str, spec: dict | None = None, **extra) -> dict:
    obj = {"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer", "metadata": {"name": name}}
    if spec is not None:
        obj["spec"] = spec
    obj.update(extra)
    return obj


def capability(name: str, spec: dict | None) -> dict:
    obj = {"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "PeeringCapability", "metadata": {"name": name}}
    if spec is not None:
        obj["spec"] = spec
    return obj


CLUSTERPEER_CASES = {
    "enum": {"type": "Sideways"},
    "required spec": None,
    "required type": {"capabilities": ["x"]},
    "maxLength of a list item": {"type": "Invite", "capabilities": ["c" * 64]},
    "maxLength and pattern": {"type": "Invite", "invite": {"expectedClusterUUID": "x" * 37}},
    "pattern": {"type": "Invite", "invite": {"expectedClusterUUID": "not-a-uuid"}},
    "type": {"type": "Invite", "capabilities": "configmaps"},
    "type of an item": {"type": "Invite", "capabilities": [1]},
    "CEL on spec": {"type": "Join"},
    "CEL across fields": {"type": "Invite", "join": {"connectionString": "x"}},
    "CEL and pattern together": {"type": "Invite", "invite": {"expectedClusterUUID": "nope"},
                                 "join": {"expectedClusterUUID": UUID}},
    "CEL on a string": {"type": "Invite", "invite": {"tokenTTL": "5m"}},
    "pattern of a defaulted field": {"type": "Invite", "invite": {"tokenTTL": "1d"}},
    "several at once": {"type": "Join", "capabilities": ["c" * 64, "ok", "d" * 70],
                        "join": {"connectionString": "x" * 4097, "expectedClusterUUID": "nope"}},
    "valid, defaulted": {"type": "Invite", "invite": {}},
}


@pytest.mark.parametrize("case_name", list(CLUSTERPEER_CASES))
async def test_clusterpeer_create(pair, case_name):
    spec = CLUSTERPEER_CASES[case_name]
    name = "val-" + case_name.lower().replace(" ", "-").replace(",", "")

    async def case(b: Backend):
        s = {"create": await b.call("POST", CP, body=peer(name, spec))}
        if s["create"].status == 201:
            await b.call("DELETE", f"{CP}/{name}")
        return s

    await pair.run(case)


async def test_clusterpeer_updates_and_transition_rules(pair):
    async def case(b: Backend):
        s = {}
        made = await b.call("POST", CP, body=peer("val-upd", {"type": "Invite", "capabilities": ["a"]}))
        assert made.status == 201, made
        obj = made.body
        s["type cannot change"] = await b.call("PUT", f"{CP}/val-upd", body={**obj, "spec": {"type": "Join",
                                                                                             "join": {"connectionString": "s"}}})
        s["remove required"] = await b.call("PUT", f"{CP}/val-upd", body={**obj, "spec": {}})
        s["merge patch to null"] = await b.call("PATCH", f"{CP}/val-upd", content_type="application/merge-patch+json",
                                                body={"spec": {"type": None}})
        s["status enum"] = await b.call("PUT", f"{CP}/val-upd/status", body={
            **obj, "status": {"conditions": [{"type": "Ready", "status": "Yes"}]}})
        s["status required key of a list map"] = await b.call("PUT", f"{CP}/val-upd/status", body={
            **obj, "status": {"conditions": [{"status": "True"}]}})
        s["status duplicate map keys"] = await b.call("PUT", f"{CP}/val-upd/status", body={
            **obj, "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Ready",
                                                                                  "status": "False"}]}})
        s["status format"] = await b.call("PUT", f"{CP}/val-upd/status", body={
            **obj, "status": {"invite": {"expiresAt": "tomorrow"}, "observedGeneration": -1}})
        s["status minimum"] = await b.call("PUT", f"{CP}/val-upd/status", body={
            **obj, "status": {"conditions": [{"type": "Ready", "status": "True", "observedGeneration": -1}]}})
        await b.call("DELETE", f"{CP}/val-upd")
        return s

    await pair.run(case)


async def test_unknown_fields_under_each_field_validation(pair):
    body = peer("val-unknown", {"type": "Invite", "colour": "blue", "invite": {"tokenTTL": "1h", "extra": 1}},
                surplus=True)

    async def case(b: Backend):
        s = {}
        s["Strict"] = await b.call("POST", CP, body=body, params={"fieldValidation": "Strict"})
        s["Warn"] = await b.call("POST", CP, body=body, params={"fieldValidation": "Warn"})
        await b.call("DELETE", f"{CP}/val-unknown")
        s["Ignore"] = await b.call("POST", CP, body=body, params={"fieldValidation": "Ignore"})
        await b.call("DELETE", f"{CP}/val-unknown")
        s["default"] = await b.call("POST", CP, body=body)
        await b.call("DELETE", f"{CP}/val-unknown")
        s["bad value"] = await b.call("POST", CP, body=body, params={"fieldValidation": "Loose"})
        s["duplicate field, Strict"] = await b.call(
            "POST", CP, params={"fieldValidation": "Strict"},
            data='{"apiVersion":"peering.deckhouse.io/v1alpha1","kind":"ClusterPeer","metadata":{"name":"val-dup"},'
                 '"spec":{"type":"Invite","type":"Join"}}')
        await b.call("DELETE", f"{CP}/val-dup")
        return s

    await pair.run(case)


async def test_peeringcapability(pair):
    cases = {
        "required version": {"rules": []},
        "consumer kind enum and defaults": {"version": "v1", "consumers": [{"kind": "User", "name": "x"},
                                                                          {"name": "sa", "namespace": "ns"}]},
        "maxLength of version": {"version": "v" * 65},
        "rule items": {"version": "v1", "rules": [{"verbs": ["get"], "resources": ["r" * 254]}]},
        "valid": {"version": "v1", "consumers": [{"name": "sa", "namespace": "ns"}],
                  "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]},
    }

    async def case(b: Backend):
        s = {}
        for label, spec in cases.items():
            s[label] = await b.call("POST", PC, body=capability("val-" + label.replace(" ", "-"), spec))
            if s[label].status == 201:
                await b.call("DELETE", f"{PC}/val-{label.replace(' ', '-')}")
        return s

    await pair.run(case)


async def test_the_labs_crds(pair):
    """TokenExchangeProvider and Project: the lab's stand-ins go through the same validation."""
    async def case(b: Backend):
        s = {}
        s["provider without spec"] = await b.call("POST", TEP, body={
            "apiVersion": "deckhouse.io/v1alpha1", "kind": "TokenExchangeProvider", "metadata": {"name": "val-tep"}})
        s["provider with wrong types"] = await b.call("POST", TEP, body={
            "apiVersion": "deckhouse.io/v1alpha1", "kind": "TokenExchangeProvider", "metadata": {"name": "val-tep"},
            "spec": {"issuer": 5, "audiences": "x"}})
        s["project v1alpha3"] = await b.call("POST", PROJECTS, body={
            "apiVersion": "deckhouse.io/v1alpha3", "kind": "Project", "metadata": {"name": "val-project"},
            "spec": {"description": "d"}})
        s["project v1alpha1 not served"] = await b.call("GET", "/apis/deckhouse.io/v1alpha1/projects")
        s["project through v1alpha2"] = await b.call("GET", "/apis/deckhouse.io/v1alpha2/projects/val-project")
        await b.call("DELETE", f"{PROJECTS}/val-project")
        return s

    await pair.run(case)
