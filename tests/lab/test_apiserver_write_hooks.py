"""The emulator's after-write hooks (lab/apiserver/hooks.py), on which the join's crash tests rely: a callback
runs once, on the nth write over HTTP that matches, after the write is stored and before its answer leaves."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from lab.apiserver.hooks import WriteHooks


def _cm(name: str, value: str = "1") -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"},
            "data": {"v": value}}


@pytest.mark.asyncio
async def test_the_nth_matching_write_fires_once_after_it_is_stored(lab):
    seen = []

    def record(write):
        stored = lab.server.get("", "configmaps", "target", "default")
        seen.append((write.verb, write.resource, write.namespace, write.name, write.user,
                     (write.obj or {}).get("data"), (stored or {}).get("data")))

    hook = lab.server.write_hooks.after(("update", "patch"), "configmaps", "target", record, nth=2,
                                        when=lambda w: (w.obj or {}).get("data", {}).get("v") != "skip")
    lab.server.create(_cm("in-process"))  # not over HTTP: never seen
    async with await lab.client() as api:
        core = client.CoreV1Api(api)
        await core.create_namespaced_config_map("default", _cm("target"))  # a create: another verb
        await core.create_namespaced_config_map("default", _cm("other"))
        await core.patch_namespaced_config_map("other", "default", {"data": {"v": "2"}})  # another name
        await core.patch_namespaced_config_map("target", "default", {"data": {"v": "2"}})  # the 1st
        await core.patch_namespaced_config_map("target", "default", {"data": {"v": "skip"}})  # `when` says no
        assert not hook.fired
        await core.replace_namespaced_config_map("target", "default", _cm("target", "3"))  # the 2nd: fires
        await core.patch_namespaced_config_map("target", "default", {"data": {"v": "4"}})  # fired already
    assert hook.fired
    assert seen == [("update", "configmaps", "default", "target", "lab-admin", {"v": "3"}, {"v": "3"})]


@pytest.mark.asyncio
async def test_a_create_is_named_from_its_answer_and_a_failing_callback_keeps_the_answer(lab):
    def fail(write):
        raise RuntimeError("the test's callback failed")

    hook = lab.server.write_hooks.after("create", "configmaps", "made", fail)
    async with await lab.client() as api:
        made = await client.CoreV1Api(api).create_namespaced_config_map("default", _cm("made"))
    assert hook.fired and made.metadata.name == "made"
    assert lab.server.get("", "configmaps", "made", "default") is not None


def test_a_hook_names_a_write_and_counts_from_one():
    hooks = WriteHooks()
    with pytest.raises(ValueError, match="does not write"):
        hooks.after("get", "configmaps", "x", lambda w: None)
    with pytest.raises(ValueError, match="from 1"):
        hooks.after("create", "configmaps", "x", lambda w: None, nth=0)
    hooks.after("create", "configmaps", "x", lambda w: None)
    hooks.clear()
    assert hooks.hooks == []
