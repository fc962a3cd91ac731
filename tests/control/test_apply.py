"""create_or_update against the emulated API server: it creates, updates with the resourceVersion it read, keeps
what the API never lets change and what others added, and writes nothing when nothing differs."""

from __future__ import annotations

import base64

import pytest

from control.apply import CREATED, DELETING, READ, UNCHANGED, UPDATED, create_or_update, merged
from control.kube import SECRETS, AlreadyExists, Conflict
from tests.control.conftest import NAMESPACE


def secret(data: dict[str, str], *, type_: str = "Opaque", labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": type_,
            "metadata": {"name": "s", "namespace": NAMESPACE, "labels": labels or {"app.kubernetes.io/managed-by":
                                                                                   "peering"}},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def writes(kube) -> int:
    return sum(n for (verb, resource), n in kube.write_counts.items() if resource == "secrets")


async def test_create_then_nothing_then_only_the_difference(kube):
    first = await create_or_update(kube, SECRETS, secret({"a": "1"}), current=READ)
    assert first.op == CREATED and first.wrote and writes(kube) == 1
    again = await create_or_update(kube, SECRETS, secret({"a": "1"}), current=READ)
    assert again.op == UNCHANGED and not again.wrote and writes(kube) == 1
    # From an informer's copy (no read at all) as well.
    assert (await create_or_update(kube, SECRETS, secret({"a": "1"}), current=first.obj)).op == UNCHANGED
    assert writes(kube) == 1
    changed = await create_or_update(kube, SECRETS, secret({"a": "2"}), current=first.obj)
    assert changed.op == UPDATED and writes(kube) == 2
    stored = await kube.get(SECRETS, "s", NAMESPACE)
    assert base64.b64decode(stored["data"]["a"]) == b"2"
    assert stored["metadata"]["resourceVersion"] != first.obj["metadata"]["resourceVersion"]


async def test_a_stale_copy_is_a_conflict_and_a_lagging_cache_an_already_exists(kube):
    first = await create_or_update(kube, SECRETS, secret({"a": "1"}), current=READ)
    await create_or_update(kube, SECRETS, secret({"a": "2"}), current=first.obj)
    with pytest.raises(Conflict):
        await create_or_update(kube, SECRETS, secret({"a": "3"}), current=first.obj)
    with pytest.raises(AlreadyExists):
        await create_or_update(kube, SECRETS, secret({"a": "3"}), current=None)
    stored = await kube.get(SECRETS, "s", NAMESPACE)
    assert base64.b64decode(stored["data"]["a"]) == b"2"


async def test_what_the_api_never_changes_and_what_others_added_stay(kube):
    theirs = secret({"tls.crt": "x"}, type_="Opaque", labels={"team": "ops"})
    await kube.create(SECRETS, theirs)
    ours = secret({"tls.crt": "y"}, type_="kubernetes.io/tls")
    applied = await create_or_update(kube, SECRETS, ours, current=READ)
    assert applied.op == UPDATED
    stored = await kube.get(SECRETS, "s", NAMESPACE)
    assert stored["type"] == "Opaque"
    assert stored["metadata"]["labels"] == {"team": "ops", "app.kubernetes.io/managed-by": "peering"}
    assert base64.b64decode(stored["data"]["tls.crt"]) == b"y"


def test_merged_replaces_owner_references_and_named_fields_only():
    current = {"metadata": {"name": "p", "resourceVersion": "7", "labels": {"a": "1"},
                            "ownerReferences": [{"name": "old"}]},
               "spec": {"x": 1}, "status": {"ready": True}}
    want = merged(current, {"apiVersion": "v9", "metadata": {"name": "p", "ownerReferences": [{"name": "new"}]},
                            "spec": {"x": 2}, "status": {"ready": False}})
    assert want == {"metadata": {"name": "p", "resourceVersion": "7", "labels": {"a": "1"},
                                 "ownerReferences": [{"name": "new"}]},
                    "spec": {"x": 2}, "status": {"ready": True}}
    assert current["spec"] == {"x": 1}  # the copy the caller holds is not touched


async def test_an_object_on_its_way_out_is_left_alone(kube):
    going = {**secret({"a": "1"}), "metadata": {**secret({})["metadata"], "resourceVersion": "1",
                                                 "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    applied = await create_or_update(kube, SECRETS, secret({"a": "2"}), current=going)
    assert applied.op == DELETING and applied.obj is going and writes(kube) == 0
