"""Masking and restoring of `x-kubernetes-sensitive-data` fields, as Deckhouse's kube-apiserver does it."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from lab.apiserver.auth.sensitive import (
    OMITTED,
    mask,
    restore,
    sensitive_attributes,
    sensitive_paths,
)
from lab.apiserver.auth.types import Attributes

# The shape of ClusterPeer's schema where it matters: both connection strings are marked, nothing else is.
CLUSTERPEER_SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "type": {"type": "string"},
                "join": {
                    "type": "object",
                    "properties": {
                        "connectionString": {"type": "string", "maxLength": 4096, "x-kubernetes-sensitive-data": True},
                        "expectedClusterUUID": {"type": "string"},
                    },
                },
            },
        },
        "status": {
            "type": "object",
            "properties": {
                "invite": {
                    "type": "object",
                    "properties": {
                        "connectionString": {"type": "string", "x-kubernetes-sensitive-data": True},
                        "tokenHash": {"type": "string"},
                    },
                },
                "phase": {"type": "string"},
            },
        },
    },
}

PATHS = [("spec", "join", "connectionString"), ("status", "invite", "connectionString")]


def _peer(join_cs: str | None = "cs-join", invite_cs: str | None = "cs-invite") -> dict:
    spec: dict = {"type": "Join", "join": {"expectedClusterUUID": "u-1"}}
    if join_cs is not None:
        spec["join"]["connectionString"] = join_cs
    status: dict = {"phase": "Active", "invite": {"tokenHash": "ab" * 32}}
    if invite_cs is not None:
        status["invite"]["connectionString"] = invite_cs
    return {"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
            "metadata": {"name": "a"}, "spec": spec, "status": status}


def test_paths_of_the_clusterpeer_schema_are_the_two_connection_strings():
    assert sensitive_paths(CLUSTERPEER_SCHEMA) == PATHS


def test_paths_walk_arrays_maps_and_stop_at_a_marked_object():
    schema = {
        "type": "object",
        "properties": {
            "list": {"type": "array", "items": {"type": "object", "properties": {
                "secret": {"type": "string", "x-kubernetes-sensitive-data": True},
                "plain": {"type": "string"}}}},
            "map": {"type": "object", "additionalProperties": {"type": "string", "x-kubernetes-sensitive-data": True}},
            "whole": {"type": "object", "x-kubernetes-sensitive-data": True,
                      "properties": {"inner": {"type": "string", "x-kubernetes-sensitive-data": True}}},
            "notMarked": {"type": "string", "x-kubernetes-sensitive-data": False},
        },
    }
    assert sensitive_paths(schema) == [("list", "*", "secret"), ("map", "*"), ("whole",)]


def test_mask_replaces_present_values_and_leaves_the_rest_untouched():
    obj = _peer()
    masked = mask(obj, PATHS)
    assert masked["spec"]["join"]["connectionString"] == OMITTED
    assert masked["status"]["invite"]["connectionString"] == OMITTED
    assert masked["status"]["invite"]["tokenHash"] == "ab" * 32
    assert masked["spec"]["join"]["expectedClusterUUID"] == "u-1"
    # The stored object is never changed by a read.
    assert obj["spec"]["join"]["connectionString"] == "cs-join"


def test_mask_does_not_invent_absent_fields():
    masked = mask(_peer(join_cs=None, invite_cs=None), PATHS)
    assert "connectionString" not in masked["spec"]["join"]
    assert "connectionString" not in masked["status"]["invite"]
    # Nor a parent object that is missing altogether.
    bare = {"metadata": {"name": "x"}, "spec": {"type": "Invite"}}
    assert mask(bare, PATHS) == bare


def test_mask_arrays_and_maps():
    paths = [("list", "*", "secret"), ("map", "*")]
    obj = {"list": [{"secret": "s1", "plain": "p"}, {"plain": "q"}], "map": {"a": "1", "b": "2"}}
    assert mask(obj, paths) == {
        "list": [{"secret": OMITTED, "plain": "p"}, {"plain": "q"}],
        "map": {"a": OMITTED, "b": OMITTED},
    }


def test_restore_keeps_the_stored_value_for_omitted_and_takes_new_values():
    stored = _peer()
    update = mask(stored, PATHS)
    update["spec"]["join"]["expectedClusterUUID"] = "u-2"
    restored = restore(update, stored, PATHS)
    assert restored["spec"]["join"]["connectionString"] == "cs-join"
    assert restored["status"]["invite"]["connectionString"] == "cs-invite"
    assert restored["spec"]["join"]["expectedClusterUUID"] == "u-2"

    update["spec"]["join"]["connectionString"] = "new-cs"
    assert restore(update, stored, PATHS)["spec"]["join"]["connectionString"] == "new-cs"


def test_restore_drops_the_marker_when_nothing_is_stored():
    update = _peer(join_cs=OMITTED)
    assert "connectionString" not in restore(update, None, PATHS)["spec"]["join"]
    stored = _peer(join_cs=None)
    assert "connectionString" not in restore(update, stored, PATHS)["spec"]["join"]


def test_restore_matches_array_elements_by_index():
    paths = [("list", "*", "secret")]
    stored = {"list": [{"secret": "s0"}, {"secret": "s1"}]}
    update = {"list": [{"secret": OMITTED}, {"secret": OMITTED}, {"secret": OMITTED}]}
    assert restore(update, stored, paths) == {"list": [{"secret": "s0"}, {"secret": "s1"}, {}]}


def test_sensitive_attributes_keep_the_verb_and_name_the_subresource():
    attrs = Attributes(verb="watch", resource_request=True, api_group="peering.deckhouse.io",
                       resource="clusterpeers", name="a")
    assert sensitive_attributes(attrs) == Attributes(verb="watch", resource_request=True,
                                                     api_group="peering.deckhouse.io", resource="clusterpeers",
                                                     subresource="sensitive", name="a")


_text = st.text(min_size=0, max_size=20)


@given(join_cs=st.one_of(st.none(), _text), invite_cs=st.one_of(st.none(), _text))
def test_masked_read_written_back_restores_the_stored_object(join_cs, invite_cs):
    assume(OMITTED not in (join_cs, invite_cs))
    stored = _peer(join_cs, invite_cs)
    assert restore(mask(stored, PATHS), stored, PATHS) == stored
