"""The emulator's rules as plain functions: selectors, patches, JSONPath and table cells, schema and CEL
validation, CRUD semantics and watch history, with no server in between."""

from __future__ import annotations

import asyncio
import pathlib

import pytest
import yaml

from lab.apiserver import errors, patch, table
from lab.apiserver.crud import Objects
from lab.apiserver.resources import Registry, resources_of_crd
from lab.apiserver.auth.sensitive import sensitive_paths
from lab.apiserver.selectors import field_predicate, label_predicate
from lab.apiserver.store import Store

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART_CRDS = ROOT / "charts" / "peering" / "crds"


def _crd(name: str) -> dict:
    return yaml.safe_load((CHART_CRDS / name).read_text())


def _objects() -> Objects:
    store, registry = Store(history=4), Registry()
    objects = Objects(store, registry)
    for f in ("clusterpeer.yaml", "peeringcapability.yaml", "projectpeer.yaml"):
        for info in resources_of_crd(_crd(f), sensitive_paths):
            registry.add(info)
    ns = registry.get("", "v1", "namespaces")
    objects.create(ns, {"metadata": {"name": "default"}})
    return objects


JOIN = {"type": "Join", "join": {"connectionString": "s"}}


def _peer(objects: Objects):
    return objects.registry.get("peering.deckhouse.io", "v1alpha1", "clusterpeers")


# ---------------------------------------------------------------- selectors

@pytest.mark.parametrize("selector, labels, expected", [
    ("a=b", {"a": "b"}, True),
    ("a==b", {"a": "c"}, False),
    ("a!=b", {}, True),
    ("a!=b", {"a": "b"}, False),
    ("a in (x, y)", {"a": "y"}, True),
    ("a in (x,y)", {"a": "z"}, False),
    ("a notin (x,y)", {}, True),
    ("a notin (x,y)", {"a": "x"}, False),
    ("a", {"a": ""}, True),
    ("!a", {"a": ""}, False),
    ("!a", {"b": "1"}, True),
    ("app.kubernetes.io/managed-by=peering,peering.deckhouse.io/clusterpeer in (p1,p2)",
     {"app.kubernetes.io/managed-by": "peering", "peering.deckhouse.io/clusterpeer": "p2"}, True),
])
def test_label_selector_operators(selector, labels, expected):
    assert label_predicate(selector)({"metadata": {"labels": labels}}) is expected


def test_malformed_label_selector_is_a_400():
    with pytest.raises(errors.ApiError) as exc:
        label_predicate("a b c = d")
    assert exc.value.code == 400


def test_field_selector_names_and_namespaces_only_for_custom_kinds():
    obj = {"metadata": {"name": "x", "namespace": "n"}}
    assert field_predicate("metadata.name=x,metadata.namespace!=m")(obj)
    assert not field_predicate("metadata.name==y")(obj)
    with pytest.raises(errors.ApiError) as exc:
        field_predicate("spec.type=Invite", "peering.deckhouse.io", "clusterpeers")
    assert exc.value.code == 400 and "spec.type" in exc.value.message


# ---------------------------------------------------------------- patches

def test_merge_patch_deletes_with_null_and_replaces_lists():
    doc = {"a": {"b": 1, "c": 2}, "l": [1, 2]}
    assert patch.merge_patch(doc, {"a": {"b": None, "d": 3}, "l": [3]}) == {"a": {"c": 2, "d": 3}, "l": [3]}
    assert doc == {"a": {"b": 1, "c": 2}, "l": [1, 2]}, "the target is not changed in place"


def test_json_patch_operations_and_failures():
    doc = {"spec": {"x": [1, 2]}, "metadata": {"labels": {"a/b": "1"}}}
    out = patch.json_patch(doc, [
        {"op": "add", "path": "/spec/x/-", "value": 3},
        {"op": "replace", "path": "/spec/x/0", "value": 0},
        {"op": "remove", "path": "/metadata/labels/a~1b"},
        {"op": "test", "path": "/spec/x", "value": [0, 2, 3]},
        {"op": "copy", "from": "/spec/x", "path": "/spec/y"},
        {"op": "move", "from": "/spec/y", "path": "/spec/z"},
    ])
    assert out == {"spec": {"x": [0, 2, 3], "z": [0, 2, 3]}, "metadata": {"labels": {}}}
    for bad in ([{"op": "remove", "path": "/nope"}], [{"op": "test", "path": "/spec/x", "value": []}],
                [{"op": "replace", "path": "/spec/x/9", "value": 1}]):
        with pytest.raises(errors.ApiError) as exc:
            patch.json_patch(doc, bad)
        assert exc.value.code == 422


def test_strategic_merge_patch_directives_kubectl_sends():
    live = {"metadata": {"finalizers": ["a"], "ownerReferences": [{"uid": "1", "name": "x"}]},
            "data": {"k": "v", "gone": "x"}}
    out = patch.strategic_merge_patch(live, {
        "$setElementOrder/data": [{"k": 1}],
        "metadata": {"finalizers": ["b"], "ownerReferences": [{"uid": "2", "name": "y"}]},
        "data": {"gone": None, "new": "n"},
    })
    assert out["data"] == {"k": "v", "new": "n"}
    assert out["metadata"]["finalizers"] == ["a", "b"]
    assert [r["uid"] for r in out["metadata"]["ownerReferences"]] == ["1", "2"]
    assert patch.strategic_merge_patch({"a": {"b": 1}}, {"a": {"$patch": "replace", "c": 2}}) == {"a": {"c": 2}}


def test_server_side_apply_removes_only_fields_the_manager_dropped():
    live = {"metadata": {"name": "x"}, "data": {"mine": "1", "dropped": "2", "theirs": "3"}}
    previous = {"metadata": {"name": "x"}, "data": {"mine": "1", "dropped": "2"}}
    applied = {"metadata": {"name": "x"}, "data": {"mine": "9"}}
    assert patch.server_side_apply(live, applied, previous)["data"] == {"mine": "9", "theirs": "3"}


# ---------------------------------------------------------------- JSONPath and table cells

def test_printer_columns_of_clusterpeer_render_like_kube_apiserver():
    info = resources_of_crd(_crd("clusterpeer.yaml"))[0]
    obj = {"metadata": {"name": "b", "creationTimestamp": "2020-01-01T00:00:00Z"},
           "spec": {"type": "Invite"},
           "status": {"phase": "Active", "effectiveCapabilities": ["dns", "logs"],
                      "conditions": [{"type": "ServerCertOurs", "status": "False"},
                                     {"type": "Ready", "status": "True"}]}}
    names = [c["name"] for c in table.column_definitions(info)]
    assert names[:1] == ["Name"] and {"Phase", "Ready", "Effective", "Age"} <= set(names)
    cells = dict(zip(names, table.row(info, obj)["cells"]))
    assert cells["Phase"] == "Active" and cells["Ready"] == "True"
    # A list value prints as Go's compact JSON, exactly as kube-apiserver's table convertor prints it.
    assert cells["Effective"] == '["dns","logs"]'
    assert cells["Age"][0].isdigit() and "y" in cells["Age"], "a date column shows the age, as kubectl's AGE"
    empty = dict(zip(names, table.row(info, {"metadata": {"name": "c"}})["cells"]))
    assert empty["Phase"] is None and empty["Ready"] is None


@pytest.mark.parametrize("seconds, text", [(5, "5s"), (119, "119s"), (125, "2m5s"), (600, "10m"), (3 * 3600, "3h"),
                                           (9 * 3600, "9h"), (50 * 3600, "2d2h"), (400 * 86400, "400d"),
                                           (3 * 365 * 86400, "3y")])
def test_human_duration(seconds, text):
    assert table.human_duration(seconds) == text


def test_jsonpath_filters_indexes_and_wildcards():
    doc = {"items": [{"n": "a", "v": 1}, {"n": "b", "v": 2}]}
    assert table.find(table.parse_jsonpath('{.items[?(@.n=="b")].v}'), doc) == [2]
    assert table.find(table.parse_jsonpath(".items[*].n"), doc) == ["a", "b"]
    assert table.find(table.parse_jsonpath(".items[-1].n"), doc) == ["b"]
    assert table.find(table.parse_jsonpath(".items[?(@.v>1)].n"), doc) == ["b"]
    assert table.find(table.parse_jsonpath(".missing.deeper"), doc) == []


# ---------------------------------------------------------------- validation

def test_schema_errors_name_each_field():
    objects = _objects()
    info = _peer(objects)
    bad = {"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer", "metadata": {"name": "p"},
           "spec": {"type": "Sideways", "join": {"connectionString": "x" * 5000}}}
    with pytest.raises(errors.ApiError) as exc:
        objects.create(info, bad)
    err = exc.value
    assert err.code == 422 and err.reason == "Invalid"
    fields = {c["field"]: c for c in err.details["causes"]}
    assert fields["spec.type"]["reason"] == "FieldValueNotSupported"
    assert '"Invite", "Join"' in fields["spec.type"]["message"]
    assert fields["spec.join.connectionString"]["reason"] == "FieldValueTooLong"
    assert err.message.startswith('ClusterPeer.peering.deckhouse.io "p" is invalid: [')


def test_cel_rules_and_defaults_of_the_clusterpeer_crd():
    objects = _objects()
    info = _peer(objects)
    base = {"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer"}
    obj, _ = objects.create(info, dict(base, metadata={"name": "a"}, spec={"type": "Invite", "invite": {}}))
    assert obj["spec"]["invite"]["tokenTTL"] == "24h", "the schema default is applied"
    with pytest.raises(errors.ApiError) as exc:
        objects.create(info, dict(base, metadata={"name": "b"}, spec={"type": "Invite", "invite": {"tokenTTL": "5m"}}))
    cause = exc.value.details["causes"][0]
    assert cause["field"] == "spec.invite.tokenTTL" and "10m to 24h" in cause["message"]
    with pytest.raises(errors.ApiError) as exc:
        objects.create(info, dict(base, metadata={"name": "c"}, spec={"type": "Join", "invite": {"tokenTTL": "1h"}}))
    assert exc.value.details["causes"][0]["field"] == "spec"
    # A transition rule (self == oldSelf) applies on update only.
    changed = dict(obj, spec={"type": "Join", "join": {"connectionString": "s"}})
    with pytest.raises(errors.ApiError) as exc:
        objects.update(info, changed, None, "a")
    assert [c["field"] for c in exc.value.details["causes"]] == ["spec.type"]


def test_unknown_fields_strict_warn_ignore():
    objects = _objects()
    info = _peer(objects)
    body = {"metadata": {"name": "u"}, "spec": dict(JOIN, bogus=1)}
    with pytest.raises(errors.ApiError) as exc:
        objects.create(info, dict(body), field_validation="Strict")
    assert exc.value.code == 400 and 'unknown field "spec.bogus"' in exc.value.message
    obj, warnings = objects.create(info, dict(body), field_validation="Warn")
    assert warnings == ['unknown field "spec.bogus"'] and "bogus" not in obj["spec"]


def test_metadata_names_are_checked_for_every_kind():
    objects = _objects()
    cm = objects.registry.get("", "v1", "configmaps")
    with pytest.raises(errors.ApiError) as exc:
        objects.create(cm, {"metadata": {"name": "Bad_Name"}}, "default")
    assert exc.value.details["causes"][0]["field"] == "metadata.name"
    with pytest.raises(errors.ApiError) as exc:
        objects.create(cm, {"metadata": {"name": "x"}}, "missing")
    assert exc.value.code == 404 and exc.value.message == 'namespaces "missing" not found'


# ---------------------------------------------------------------- CRUD semantics

def test_generation_status_and_conflicts():
    objects = _objects()
    info = _peer(objects)
    obj, _ = objects.create(info, {"metadata": {"name": "g"}, "spec": JOIN, "status": {"phase": "X"}})
    assert obj["metadata"]["generation"] == 1 and "status" not in obj, "create cannot set status"
    assert obj["metadata"]["uid"] and obj["metadata"]["creationTimestamp"]
    labelled = dict(obj, metadata=dict(obj["metadata"], labels={"a": "b"}))
    obj2, _ = objects.update(info, labelled, None, "g")
    assert obj2["metadata"]["generation"] == 1, "metadata changes never bump generation"
    status = dict(obj2, status={"phase": "Active"}, spec={"type": "Invite"})
    obj3, _ = objects.update(info, status, None, "g", subresource="status")
    assert obj3["status"] == {"phase": "Active"} and obj3["spec"]["type"] == "Join", "status writes ignore spec"
    assert obj3["metadata"]["generation"] == 1
    spec = dict(obj3, spec=dict(JOIN, capabilities=["x"]), status={"phase": "Pending"})
    obj4, _ = objects.update(info, spec, None, "g")
    assert obj4["metadata"]["generation"] == 2 and obj4["status"] == {"phase": "Active"}, "spec writes ignore status"
    with pytest.raises(errors.ApiError) as exc:
        objects.update(info, obj3, None, "g")     # carries the resourceVersion before obj4
    assert exc.value.code == 409 and exc.value.reason == "Conflict"
    same, _ = objects.update(info, obj4, None, "g")
    assert same["metadata"]["resourceVersion"] == obj4["metadata"]["resourceVersion"], "a no-op writes nothing"


def test_finalizers_hold_deletion_until_the_last_goes():
    objects = _objects()
    info = _peer(objects)
    obj, _ = objects.create(info, {"metadata": {"name": "f", "finalizers": ["x/y"]}, "spec": JOIN})
    marked, deleted = objects.delete(info, None, "f")
    assert not deleted and marked["metadata"]["deletionTimestamp"] and marked["metadata"]["generation"] == 2
    with pytest.raises(errors.ApiError) as exc:
        objects.update(info, dict(marked, metadata=dict(marked["metadata"], finalizers=["x/y", "z"])), None, "f")
    assert exc.value.code == 422
    objects.update(info, dict(marked, metadata=dict(marked["metadata"], finalizers=[])), None, "f")
    assert objects.store.get(info.key, None, "f") is None


def test_generate_name():
    objects = _objects()
    cm = objects.registry.get("", "v1", "configmaps")
    obj, _ = objects.create(cm, {"metadata": {"generateName": "peer-"}}, "default")
    assert obj["metadata"]["name"].startswith("peer-") and len(obj["metadata"]["name"]) == 10


async def test_watch_replays_history_and_answers_410_when_it_is_gone():
    objects = _objects()
    cm = objects.registry.get("", "v1", "configmaps")
    first, _ = objects.create(cm, {"metadata": {"name": "w0"}}, "default")
    start = int(first["metadata"]["resourceVersion"])
    w = objects.store.watch(cm.key, "default", None, start)
    for i in range(1, 3):
        objects.create(cm, {"metadata": {"name": f"w{i}"}}, "default")
    assert [(await w.queue.get())[1]["metadata"]["name"] for _ in range(2)] == ["w1", "w2"]
    for i in range(3, 8):   # history keeps 4 events: the start is now too old
        objects.create(cm, {"metadata": {"name": f"w{i}"}}, "default")
    with pytest.raises(errors.ApiError) as exc:
        objects.store.watch(cm.key, "default", None, start)
    assert exc.value.code == 410 and exc.value.reason == "Expired"
    objects.store.unwatch(cm.key, w)


async def test_selector_watch_sees_objects_move_in_and_out():
    objects = _objects()
    cm = objects.registry.get("", "v1", "configmaps")
    w = objects.store.watch(cm.key, None, label_predicate("app=x"), objects.store.current_rv)
    obj, _ = objects.create(cm, {"metadata": {"name": "m"}}, "default")
    obj, _ = objects.update(cm, dict(obj, metadata=dict(obj["metadata"], labels={"app": "x"})), "default", "m")
    objects.update(cm, dict(obj, metadata=dict(obj["metadata"], labels={"app": "y"})), "default", "m")
    got = [await asyncio.wait_for(w.queue.get(), 1) for _ in range(2)]
    assert [t for t, _ in got] == ["ADDED", "DELETED"]
    assert w.queue.empty()
    objects.store.unwatch(cm.key, w)


def test_slow_watcher_is_dropped_not_waited_for():
    store = Store(watch_queue=2)
    objects = Objects(store, Registry())
    objects.create(objects.registry.get("", "v1", "namespaces"), {"metadata": {"name": "default"}})
    cm = objects.registry.get("", "v1", "configmaps")
    w = store.watch(cm.key, None, None, store.current_rv)
    for i in range(4):
        objects.create(cm, {"metadata": {"name": f"s{i}"}}, "default")
    assert w.overflowed and w not in store.collection(cm.key).watchers


# ---------------------------------------------------------------- authentication cache

def test_auth_cache_never_outlives_the_token():
    import base64
    import json as _json

    from lab.apiserver.auth.types import UserInfo
    from lab.apiserver.authcache import AuthCache

    now = [1000.0]
    cache = AuthCache(ttl=10, clock=lambda: now[0])
    payload = base64.urlsafe_b64encode(_json.dumps({"exp": 1004}).encode()).decode().rstrip("=")
    headers = {"Authorization": f"Bearer h.{payload}.s"}
    key = cache.key(headers, None)
    assert token_free(key[:2], "h.")
    cache.put(key, UserInfo("u"))
    assert cache.get(cache.key(headers, None)) == UserInfo("u")
    assert cache.get(cache.key({"Authorization": "Bearer other"}, None)) is None
    now[0] = 1004.5   # past the token's exp, well within the ttl
    assert cache.get(key) is None
    cache.put(key, UserInfo("u"))
    cache.clear()
    assert cache.get(key) is None


def token_free(stored_key: tuple, token_prefix: str) -> bool:
    """The cache keeps a digest of the token, never the token."""
    return not any(isinstance(part, str) and part.startswith(token_prefix) for part in stored_key)


def test_root_cel_rules_see_the_name_and_crd_updates_keep_condition_times():
    from lab.apiserver.crud import CRD_KEY

    objects = _objects()
    crd_info = objects.registry.get(CRD_KEY[0], "v1", CRD_KEY[1])
    crd = {"metadata": {"name": "things.example.com"},
           "spec": {"group": "example.com", "scope": "Cluster",
                    "names": {"plural": "things", "kind": "Thing"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-validations": [{"rule": "self.metadata.name.startsWith('t-')",
                                                      "message": "names start with t-"}],
                        "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}]}}
    made, _ = objects.create(crd_info, crd)
    for info in resources_of_crd(made):
        objects.registry.add(info)
    thing = objects.registry.get("example.com", "v1", "things")
    objects.create(thing, {"metadata": {"name": "t-1"}, "spec": {"a": 1}})
    with pytest.raises(errors.ApiError) as exc:
        objects.create(thing, {"metadata": {"name": "x-1"}})
    assert "names start with t-" in exc.value.message
    again, _ = objects.update(crd_info, dict(made, metadata=dict(made["metadata"], labels={"l": "v"})), None,
                              made["metadata"]["name"])
    assert again["status"]["conditions"] == made["status"]["conditions"]
    with pytest.raises(errors.ApiError) as exc:
        bad = dict(crd, metadata={"name": "bad.example.com"})
        objects.create(crd_info, bad)
    assert exc.value.code == 422 and exc.value.details["causes"][0]["field"] == "metadata.name"


def test_formats_and_list_types_are_checked_as_kube_does():
    objects = _objects()
    info = _peer(objects)
    obj, _ = objects.create(info, {"metadata": {"name": "lt"}, "spec": JOIN})
    cond = {"type": "Ready", "status": "True", "reason": "R", "message": "", "lastTransitionTime": "yesterday"}
    with pytest.raises(errors.ApiError) as exc:
        objects.update(info, dict(obj, status={"conditions": [cond]}), None, "lt", subresource="status")
    c = exc.value.details["causes"][0]
    assert c["field"] == "status.conditions[0].lastTransitionTime" and "date-time" in c["message"]
    good = dict(cond, lastTransitionTime="2026-01-01T00:00:00Z")
    with pytest.raises(errors.ApiError) as exc:
        objects.update(info, dict(obj, status={"conditions": [good, dict(good, status="False")]}), None, "lt",
                       subresource="status")
    c = exc.value.details["causes"][0]
    assert c["reason"] == "FieldValueDuplicate" and c["field"] == "status.conditions[1]"
    objects.update(info, dict(obj, status={"conditions": [good]}), None, "lt", subresource="status")


def test_apply_conflicts_and_field_level_ownership():
    live = {"metadata": {"name": "x"}, "data": {"k": "1", "theirs": "t"}}
    others = {"first": {"metadata": {"name": "x"}, "data": {"k": "1"}}}
    assert patch.apply_conflicts(live, {"metadata": {"name": "x"}, "data": {"k": "2"}}, others) == [
        (".data.k", "first")]
    assert patch.apply_conflicts(live, {"metadata": {"name": "x"}, "data": {"k": "1"}}, others) == []
    assert patch.drop_fields(others["first"], [".data.k"]) == {"metadata": {"name": "x"}}
    # A manager that stops applying a map removes only its own keys of it.
    previous = {"metadata": {"name": "x"}, "data": {"k": "1"}}
    assert patch.server_side_apply(live, {"metadata": {"name": "x"}}, previous)["data"] == {"theirs": "t"}


def test_422_about_a_sensitive_field_does_not_repeat_its_value():
    crd = {"spec": {"group": "example.com", "scope": "Cluster", "names": {"plural": "vaults", "kind": "Vault"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "properties": {"spec": {"type": "object", "properties": {
                            "key": {"type": "string", "pattern": "^k-", "x-kubernetes-sensitive-data": True},
                            "other": {"type": "string", "pattern": "^o-"}}}}}}}]}}
    objects = _objects()
    info = resources_of_crd(crd, sensitive_paths)[0]
    objects.registry.add(info)
    with pytest.raises(errors.ApiError) as exc:
        objects.create(info, {"metadata": {"name": "v"}, "spec": {"key": "hunter2-secret", "other": "plain"}})
    fields = {c["field"]: c["message"] for c in exc.value.details["causes"]}
    assert "hunter2-secret" not in exc.value.message and "hunter2-secret" not in fields["spec.key"]
    assert '"<omitted>"' in fields["spec.key"]
    assert '"plain"' in fields["spec.other"], "other fields still show what was wrong"


def test_secret_rules_kube_applies():
    objects = _objects()
    secret = objects.registry.get("", "v1", "secrets")
    with pytest.raises(errors.ApiError) as exc:
        objects.create(secret, {"metadata": {"name": "t"}, "type": "kubernetes.io/tls", "data": {"tls.crt": "eA=="}},
                       "default")
    assert [c["field"] for c in exc.value.details["causes"]] == ["data[tls.key]"]
    made, _ = objects.create(secret, {"metadata": {"name": "o"}, "stringData": {"k": "v"}}, "default")
    assert made["type"] == "Opaque" and made["data"] == {"k": "dg=="} and "stringData" not in made
    with pytest.raises(errors.ApiError) as exc:
        objects.update(secret, dict(made, type="kubernetes.io/tls", data={"tls.crt": "eA==", "tls.key": "eA=="}),
                       "default", "o")
    assert exc.value.details["causes"][0]["field"] == "type"
    with pytest.raises(errors.ApiError) as exc:
        objects.create(secret, {"metadata": {"name": "b"}, "data": {"k": "not base64!"}}, "default")
    assert "not base64!" not in exc.value.message, "secret contents never echo in errors"
