"""What this replica's gateway serves, read from a published registry: the rules that hold an announcement back."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import trustme
from jwcrypto import jwk

from control.rules.served import admits_certificate, served_capabilities
from tests.gateway.support import registry_for


def _pki():
    ca = trustme.CA()
    return {"ca": ca, "peer": ca.issue_cert("peer.example"), "other": ca.issue_cert("other.example")}


def _key():
    return jwk.JWK.generate(kty="EC", crv="P-256", kid="k")


def test_the_egress_serves_the_effective_capabilities_of_a_peer_it_can_reach():
    pki = _pki()
    key = _key()
    registry = registry_for(pki, key, effective=("read-pods",), entrance="peering-gateway.peer.lab:443")
    assert served_capabilities(registry, "peer") == {"read-pods"}
    assert served_capabilities(registry, "nobody") == frozenset()
    # The inviter before the joiner delivered our client certificate: nothing reaches the peer yet.
    peer = dataclasses.replace(registry.peers["peer"], client_cert_pem=None)
    half = dataclasses.replace(registry, peers=MappingProxyType({"peer": peer}))
    assert served_capabilities(half, "peer") == frozenset()
    no_entrance = registry_for(pki, key, effective=("read-pods",), entrance=None)
    assert served_capabilities(no_entrance, "peer") == frozenset()


def test_a_certificate_is_admitted_once_the_registry_maps_it_to_that_peering():
    pki = _pki()
    key = _key()
    registry = registry_for(pki, key)
    issued = pki["peer"].cert_chain_pems[0].bytes().decode()
    assert admits_certificate(registry, "peer", issued)
    # Another peering's name, a certificate no peering holds, and what is no certificate at all: not admitted.
    assert not admits_certificate(registry, "other", issued)
    assert not admits_certificate(registry, "peer", pki["other"].cert_chain_pems[0].bytes().decode())
    assert not admits_certificate(registry, "peer", "not a certificate")
    # A bundle is judged by its first certificate: the newest one the answer carries.
    bundle = pki["other"].cert_chain_pems[0].bytes().decode() + issued
    assert not admits_certificate(registry, "peer", bundle)
