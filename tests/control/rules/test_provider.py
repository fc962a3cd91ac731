"""The peer's TokenExchangeProvider: name, prefix, audiences, ownership; and that a steady state writes nothing."""

from __future__ import annotations

import base64
import copy

import trustme

from contract.names import peer_secret_name
from gateway.registry import Registry

from control.rules.grants import diff_objects
from control.rules.provider import desired_provider, provider_name

CP = {"metadata": {"name": "cluster-b", "uid": "u1"}}


def test_desired_provider():
    p = desired_provider(CP, local_uuid="a-uuid", issuer_url="https://api.b.lab",
                         jwks='{"keys":[]}', effective=["storage", "dns"])
    assert p["apiVersion"] == "deckhouse.io/v1alpha1" and p["kind"] == "TokenExchangeProvider"
    assert p["metadata"]["name"] == "peering-cluster-b" == provider_name("cluster-b")
    assert "namespace" not in p["metadata"]
    assert p["spec"] == {
        "issuer": "https://api.b.lab",
        "jwks": '{"keys":[]}',
        "usernamePrefix": "peering:u1:",  # the uid of our ClusterPeer: the identity this cluster assigned
        "audiences": ["peering.deckhouse.io/a-uuid/dns", "peering.deckhouse.io/a-uuid/storage"],
    }
    assert p["metadata"]["ownerReferences"][0]["name"] == "cluster-b"
    assert p["metadata"]["labels"]["peering.deckhouse.io/clusterpeer"] == "cluster-b"


def test_the_provider_is_written_at_the_served_version_and_its_name_is_the_dex_connector():
    from contract.names import provider_name as contract_provider_name

    p = desired_provider(CP, local_uuid="a", issuer_url="https://i", jwks="{}", effective=[],
                         api_version="deckhouse.io/v1beta1")
    assert p["apiVersion"] == "deckhouse.io/v1beta1"
    # A long ClusterPeer name: the provider's bounded name and the gateway's connector id are one name (they
    # used to differ, and every exchange of such a peering named a connector Dex did not have).
    long = "x" * 250
    assert len(provider_name(long)) == 253 and provider_name(long) == contract_provider_name(long)
    cert = trustme.CA().issue_cert("peer").cert_chain_pems[0].bytes()
    secret = {"metadata": {"name": peer_secret_name(long)}, "data": {"issued.crt": base64.b64encode(cert).decode()}}
    registry = Registry.from_objects(cluster_uuid="a", clusterpeers=[{"metadata": {"name": long, "uid": "u"}}],
                                     peer_secrets=[secret], capabilities=[], generation=1)
    assert registry.peers[long].connector_id == provider_name(long)


def test_provider_diff():
    p = desired_provider(CP, local_uuid="a", issuer_url="https://i", jwks="{}", effective=[])
    stored = copy.deepcopy(p)
    stored["metadata"]["resourceVersion"] = "3"
    stored["status"] = {"conditions": []}
    assert diff_objects([p], [stored], "cluster-b").empty
    changed = desired_provider(CP, local_uuid="a", issuer_url="https://i2", jwks="{}", effective=[])
    d = diff_objects([changed], [stored], "cluster-b")
    assert [u["spec"]["issuer"] for u in d.update] == ["https://i2"] and d.update[0]["metadata"]["resourceVersion"] == "3"
