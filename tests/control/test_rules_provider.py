"""The peer's TokenExchangeProvider: name, prefix, audiences, ownership; and that a steady state writes nothing."""

from __future__ import annotations

import copy

from control.rules.grants import diff_objects
from control.rules.provider import desired_provider, provider_name

CP = {"metadata": {"name": "cluster-b", "uid": "u1"}}


def test_desired_provider():
    p = desired_provider(CP, peer_uuid="b-uuid", local_uuid="a-uuid", issuer_url="https://api.b.lab",
                         jwks='{"keys":[]}', effective=["storage", "dns"])
    assert p["apiVersion"] == "deckhouse.io/v1alpha1" and p["kind"] == "TokenExchangeProvider"
    assert p["metadata"]["name"] == "peering-cluster-b" == provider_name("cluster-b")
    assert "namespace" not in p["metadata"]
    assert p["spec"] == {
        "issuer": "https://api.b.lab",
        "jwks": '{"keys":[]}',
        "usernamePrefix": "peering:b-uuid:",
        "audiences": ["peering.deckhouse.io/a-uuid/dns", "peering.deckhouse.io/a-uuid/storage"],
    }
    assert p["metadata"]["ownerReferences"][0]["name"] == "cluster-b"


def test_provider_diff():
    p = desired_provider(CP, peer_uuid="b", local_uuid="a", issuer_url="https://i", jwks="{}", effective=[])
    stored = copy.deepcopy(p)
    stored["metadata"]["resourceVersion"] = "3"
    stored["status"] = {"conditions": []}
    assert diff_objects([p], [stored], "cluster-b").empty
    changed = desired_provider(CP, peer_uuid="b", local_uuid="a", issuer_url="https://i2", jwks="{}", effective=[])
    d = diff_objects([changed], [stored], "cluster-b")
    assert [u["spec"]["issuer"] for u in d.update] == ["https://i2"] and d.update[0]["metadata"]["resourceVersion"] == "3"
