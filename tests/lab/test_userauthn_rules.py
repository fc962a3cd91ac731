"""user-authn's rules over plain provider objects: no server needed."""

from __future__ import annotations

import json

import pytest
from jwcrypto import jwk

from lab.userauthn import (
    DELAY_ANNOTATION, FAIL_ANNOTATION, Outcome, delay_seconds, forced_failure, parse_jwks, prefix_conflicts,
    spec_problem, status_patch,
)

KEY = jwk.JWK.generate(kty="EC", crv="P-256", kid="k")
JWKS = json.dumps({"keys": [KEY.export_public(as_dict=True)]})


def provider(name="p", prefix="peering:u1:", issuer="https://api.b.lab", jwks=JWKS, created="2026-01-01T00:00:00Z",
             generation=1, annotations=None, status=None, **spec_extra):
    spec = {"issuer": issuer, "jwks": jwks, "usernamePrefix": prefix, "audiences": ["kubernetes"], **spec_extra}
    obj = {"apiVersion": "deckhouse.io/v1alpha1", "kind": "TokenExchangeProvider",
           "metadata": {"name": name, "creationTimestamp": created, "generation": generation,
                        "annotations": annotations or {}},
           "spec": {k: v for k, v in spec.items() if v is not None}}
    if status is not None:
        obj["status"] = status
    return obj


def test_a_good_spec_has_no_problem_and_jwks_may_be_text_or_object():
    assert spec_problem(provider()) is None
    assert spec_problem(provider(jwks=json.loads(JWKS))) is None
    assert spec_problem(provider(jwks="")) is None  # empty: discovery decides


@pytest.mark.parametrize("obj, words", [
    (provider(issuer=None), "spec.issuer is required"),
    (provider(issuer=""), "spec.issuer is required"),
    (provider(issuer="http://api.b.lab"), "not an https URL"),
    (provider(prefix=""), "usernamePrefix is required"),
    (provider(prefix="system:serviceaccount:"), "starts with system:"),
    (provider(jwks="{not json"), "jwks is not JSON"),
    (provider(jwks='{"kty": "EC"}'), "not a JWK Set"),
    (provider(jwks='{"keys": []}'), "has no keys"),
    (provider(jwks='{"keys": [{"kty": "nope"}]}'), "keys[0] is not a valid JWK"),
    (provider(jwks=json.dumps({"keys": [KEY.export_private(as_dict=True)]})), "private key material"),
    (provider(audiences="kubernetes"), "audiences must be a list"),
])
def test_invalid_specs_say_what_is_wrong(obj, words):
    problem = spec_problem(obj)
    assert problem is not None and words in problem


def test_parse_jwks_returns_the_set():
    keys, why = parse_jwks(JWKS)
    assert why == "" and keys["keys"][0]["kid"] == "k"


def test_prefix_conflicts_blame_the_newer_provider():
    old = provider("old", prefix="peering:u1:", created="2026-01-01T00:00:00Z")
    newer = provider("newer", prefix="peering:u1:", created="2026-01-01T00:00:05Z")
    nested = provider("nested", prefix="peering:", created="2026-01-01T00:00:09Z")
    distinct = provider("distinct", prefix="peering:u2:", created="2026-01-01T00:00:01Z")
    got = prefix_conflicts([nested, newer, distinct, old])
    assert got == {"newer": "old", "nested": "old"}


def test_same_second_ties_are_broken_by_the_order_first_seen():
    a = provider("zz-first", prefix="x:")
    b = provider("aa-second", prefix="x:")
    assert prefix_conflicts([a, b], {"zz-first": 0, "aa-second": 1}) == {"aa-second": "zz-first"}


def test_a_provider_being_deleted_no_longer_blocks():
    old = provider("old", prefix="x:")
    old["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    newer = provider("newer", prefix="x:", created="2026-01-01T00:00:05Z")
    assert prefix_conflicts([old, newer]) == {}


def test_lab_annotations():
    assert forced_failure(provider(annotations={FAIL_ANNOTATION: "ApplyError"})) == "ApplyError"
    assert forced_failure(provider(annotations={FAIL_ANNOTATION: "DiscoveryFailed"})) == "DiscoveryFailed"
    assert forced_failure(provider(annotations={FAIL_ANNOTATION: "Whatever"})) is None
    assert delay_seconds(provider(annotations={DELAY_ANNOTATION: "2.5"})) == 2.5
    assert delay_seconds(provider(annotations={DELAY_ANNOTATION: "soon"})) == 0.0
    assert delay_seconds(provider(annotations={DELAY_ANNOTATION: "99999"})) == 600.0
    assert delay_seconds(provider()) == 0.0


def test_status_is_written_once_and_transition_time_kept():
    obj = provider(generation=3)
    first = status_patch(obj, Outcome(True, "ProviderReady", "ok"), "2026-01-01T00:00:00Z")
    assert first["observedGeneration"] == 3
    [cond] = first["conditions"]
    assert cond == {"type": "Ready", "status": "True", "reason": "ProviderReady", "message": "ok",
                    "observedGeneration": 3, "lastTransitionTime": "2026-01-01T00:00:00Z"}
    obj["status"] = first
    # Nothing changed: nothing to write.
    assert status_patch(obj, Outcome(True, "ProviderReady", "ok"), "2026-01-01T00:05:00Z") is None
    # A new generation with the same verdict: written, transition time kept.
    obj["metadata"]["generation"] = 4
    again = status_patch(obj, Outcome(True, "ProviderReady", "ok"), "2026-01-01T00:05:00Z")
    assert again["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert again["conditions"][0]["observedGeneration"] == 4
    # Going False moves it.
    obj["status"] = again
    failed = status_patch(obj, Outcome(False, "PrefixConflict", "overlaps"), "2026-01-01T00:06:00Z")
    assert failed["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:06:00Z"
    assert failed["conditions"][0]["status"] == "False"
