"""The consumer rule both directions apply (gateway/consumers.py)."""

from __future__ import annotations

from gateway.consumers import consumer_capabilities, service_account
from tests.gateway.support import registry_for


def test_service_accounts_are_told_from_other_users():
    assert service_account("system:serviceaccount:mod:controller") == ("mod", "controller")
    assert service_account("alice") is None and service_account(None) is None


def test_a_capability_is_granted_only_when_accepted_and_listing_the_account(pki, issuer_key):
    registry = registry_for(pki, issuer_key)
    assert consumer_capabilities(registry, ["read-pods", "unknown"], ("mod", "controller")) == {"read-pods"}
    assert consumer_capabilities(registry, ["read-pods"], ("mod", "other")) == frozenset()
    assert consumer_capabilities(registry, ["read-pods"], None) == frozenset()
    cap = registry.capabilities["read-pods"]
    import dataclasses
    refused = dataclasses.replace(registry, capabilities={"read-pods": dataclasses.replace(cap, accepted=False)})
    assert consumer_capabilities(refused, ["read-pods"], ("mod", "controller")) == frozenset()
