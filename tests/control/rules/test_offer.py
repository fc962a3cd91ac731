"""Offers: building status.offer, every bound of a received offer, and status.peer."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from jwcrypto import jwk

from control.rules import offer as of

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def _jwks(*keys: jwk.JWK, private: bool = False) -> str:
    s = jwk.JWKSet()
    for k in keys:
        s.add(k)
    return s.export(private_keys=private)


EC = jwk.JWK.generate(kty="EC", crv="P-256", kid="a")
RSA = jwk.JWK.generate(kty="RSA", size=2048, kid="b")
JWKS = _jwks(EC, RSA)


def good() -> dict:
    return of.build_offer(
        issuer_url="https://api.a.lab",
        jwks=JWKS,
        projects={"p2": ["p2"], "p1": ["p1-x", "p1", "p1"]},
        capabilities=[{"name": "storage", "version": "v1", "scope": ["project"]}, {"name": "dns", "version": "v2", "scope": ["cluster"]}],
        peering_version="0.1.0",
    )


def test_build_offer_is_sorted_and_complete():
    o = good()
    assert o["issuer"] == {"url": "https://api.a.lab", "jwks": JWKS}
    assert o["projects"] == [{"name": "p1", "namespaces": ["p1", "p1-x"]}, {"name": "p2", "namespaces": ["p2"]}]
    assert [c["name"] for c in o["capabilities"]] == ["dns", "storage"]
    assert o["peeringVersion"] == "0.1.0"
    assert of.validate_offer(o).ok


def test_offer_without_issuer_yet_is_valid():
    o = good()
    o["issuer"] = {"url": "", "jwks": ""}
    assert of.validate_offer(o).ok
    del o["issuer"]
    assert of.validate_offer(o).ok


def _with(path: str, value) -> dict:
    o = good()
    target = o
    keys = path.split(".")
    for k in keys[:-1]:
        target = target[int(k)] if k.isdigit() else target[k]
    last = keys[-1]
    if last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value
    return o


@pytest.mark.parametrize(
    ("offer", "reason", "words"),
    [
        ("string", "OfferInvalid", "not an object"),
        (_with("issuer", "x"), "OfferInvalid", "issuer"),
        (_with("issuer.url", "ftp://x"), "OfferInvalid", "issuer.url"),
        (_with("issuer.url", 7), "OfferInvalid", "issuer.url"),
        (_with("issuer.jwks", "not json"), "OfferInvalid", "not JSON"),
        (_with("issuer.jwks", "[]"), "OfferInvalid", "not a JWK Set"),
        (_with("issuer.jwks", '{"keys": []}'), "OfferInvalid", "no keys"),
        (_with("issuer.jwks", _jwks(EC, private=True)), "OfferInvalid", "private members (d)"),
        (_with("issuer.jwks", json.dumps({"keys": [{"kty": "oct", "k": "YWJj"}]})), "OfferInvalid", "'oct'"),
        (_with("issuer.jwks", json.dumps({"keys": [{"kty": "EC", "crv": "P-256", "x": "!", "y": "!"}]})), "OfferInvalid", "not a valid EC key"),
        (_with("issuer.jwks", json.dumps({"keys": [json.loads(EC.export_public())] * 17})), "OfferInvalid", "more than 16"),
        (_with("issuer.jwks", json.dumps({"keys": ["x"]})), "OfferInvalid", "not an object"),
        (_with("projects", "x"), "OfferInvalid", "projects"),
        (_with("projects.0", {"namespaces": []}), "OfferInvalid", "no name"),
        (_with("projects.0.name", "n" * 254), "OfferInvalid", "longer than 253"),
        (_with("projects.1.name", "p1"), "OfferInvalid", "twice"),
        (_with("projects.0.namespaces", [""]), "OfferInvalid", "namespaces"),
        (_with("projects.0.namespaces", [f"n{i}" for i in range(1001)]), "OfferTooLarge", "more than 1000"),
        (_with("projects", [{"name": f"p{i}"} for i in range(10_001)]), "OfferTooLarge", "more than 10000"),
        (_with("capabilities", {}), "OfferInvalid", "capabilities"),
        (_with("capabilities", [{"name": f"c{i}", "version": "v1"} for i in range(257)]), "OfferTooLarge", "more than 256"),
        (_with("capabilities.0.name", ""), "OfferInvalid", "capability has no name"),
        (_with("capabilities.1.name", "dns"), "OfferInvalid", "twice"),
        (_with("capabilities.0.version", "v" * 65), "OfferInvalid", "version"),
        (_with("capabilities.0.version", None), "OfferInvalid", "version"),
        (_with("capabilities.0.scope", ["everything"]), "OfferInvalid", "scope"),
        (_with("peeringVersion", "v" * 65), "OfferInvalid", "peeringVersion"),
        (_with("peeringVersion", 3), "OfferInvalid", "peeringVersion"),
    ],
)
def test_refused_offers(offer, reason, words):
    check = of.validate_offer(offer)
    assert (check.ok, check.reason) == (False, reason)
    assert words in check.message


def test_total_size_bound():
    o = good()
    assert not of.validate_offer(o, size=256 * 1024 + 1).ok
    assert of.validate_offer(o, size=256 * 1024).ok
    o["projects"] = [{"name": f"project-{i:05d}", "namespaces": [f"project-{i:05d}-ns-{j}" for j in range(3)]} for i in range(3000)]
    check = of.validate_offer(o)
    assert check.reason == "OfferTooLarge" and "262144" in check.message


def test_unserialisable_offer():
    assert of.validate_offer({"x": object()}).reason == "OfferInvalid"


def test_jwks_problem_accepts_public_sets():
    assert of.jwks_problem(JWKS) is None
    assert of.jwks_problem(_jwks(jwk.JWK.generate(kty="OKP", crv="Ed25519"))) is None
    assert of.jwks_problem(None) == "the JWKS is empty"


def test_peer_status():
    o = good()
    st = of.peer_status(o, alias="cluster-b", cluster_uuid="a-uuid", endpoint="peering-gateway.a.lab", last_sync=NOW)
    assert st["alias"] == "cluster-b" and st["clusterUUID"] == "a-uuid"
    assert st["endpoint"] == "peering-gateway.a.lab"
    assert st["lastSyncTime"] == "2026-11-30T12:00:00Z"
    assert st["issuer"] == o["issuer"] and st["projects"] == o["projects"]
    assert st["capabilities"] == o["capabilities"] and st["peeringVersion"] == "0.1.0"
    assert of.offer_of_peer(st) == o
    assert of.offer_of_peer(None) is None


def test_a_pull_that_learnt_nothing_keeps_the_stored_peer():
    o = good()
    stored = of.peer_status(o, alias="b", cluster_uuid="u", endpoint="e", last_sync=NOW)
    later = of.peer_status(o, alias="b", cluster_uuid="u", endpoint="e", last_sync=NOW + timedelta(hours=1))
    assert of.same_peer(stored, later)
    assert not of.same_peer(None, later)
    assert not of.same_peer(stored, of.peer_status({**o, "peeringVersion": "0.2.0"}, alias="b", cluster_uuid="u",
                                                   endpoint="e", last_sync=NOW))
    assert not of.same_peer(stored, of.peer_status(o, alias="renamed", cluster_uuid="u", endpoint="e",
                                                   last_sync=NOW))
    assert not of.same_peer(stored, of.peer_status(o, alias="b", cluster_uuid="u", endpoint="moved:8443",
                                                   last_sync=NOW))


def test_a_peer_publishing_our_own_keys_is_refused_whatever_the_kid_or_issuer_url():
    """Every default Deckhouse cluster signs as https://kubernetes.default.svc.cluster.local: the issuer URL tells
    nothing, the keys everything. Our public keys are in our offer, so a hostile peer could republish them."""
    ours = of.build_offer(issuer_url="https://kubernetes.default.svc.cluster.local", jwks=JWKS, projects={},
                          capabilities=[], peering_version="v1")
    other = jwk.JWK.generate(kty="EC", crv="P-256", kid="c")
    same_key_new_kid = jwk.JWK(**{**json.loads(EC.export_public()), "kid": "renamed"})
    copied = {**ours, "issuer": {"url": ours["issuer"]["url"], "jwks": _jwks(other, same_key_new_kid)}}
    assert "own ServiceAccount signing keys" in of.own_keys_problem(copied, ours)
    # Same issuer URL, keys of its own: a peer like any other.
    distinct = {**ours, "issuer": {"url": ours["issuer"]["url"], "jwks": _jwks(other)}}
    assert of.own_keys_problem(distinct, ours) is None
    assert of.own_keys_problem({"issuer": {"url": "x", "jwks": ""}}, ours) is None
    assert of.own_keys_problem("garbage", ours) is None and of.own_keys_problem(distinct, None) is None
