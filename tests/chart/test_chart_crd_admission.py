"""What the API server itself refuses, with the CRDs' own schema and CEL rules: the schema is applied with
jsonschema and every x-kubernetes-validations rule is evaluated with cel-python (as the lab's API server does),
after the schema's defaults are filled in (as the API server does)."""

from __future__ import annotations

import copy
import re

import celpy
import jsonschema
import pytest

UUID = "0b7c3e1a-5f2d-4c8e-9a61-2d4f8b3e7c10"


def schema_of(crd: dict) -> dict:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def with_defaults(schema: dict, value):
    """The object as stored: every absent property with a default gets it, in every object that is present."""
    value = copy.deepcopy(value)
    if isinstance(value, dict):
        for name, prop in schema.get("properties", {}).items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
            if name in value:
                value[name] = with_defaults(prop, value[name])
    elif isinstance(value, list) and "items" in schema:
        value = [with_defaults(schema["items"], item) for item in value]
    return value


_NEW = object()  # no old value: a create, or a field the update adds


def cel_errors(schema: dict, value, old=_NEW, path: str = "") -> list[str]:
    """Messages of the failing rules; a transition rule (one that reads oldSelf) applies only where there is an
    old value, as in kube-apiserver."""
    errors: list[str] = []
    env = celpy.Environment()
    for validation in schema.get("x-kubernetes-validations", []):
        if "oldSelf" in validation["rule"] and old is _NEW:
            continue
        activation = {"self": celpy.json_to_cel(value)}
        if old is not _NEW:
            activation["oldSelf"] = celpy.json_to_cel(old)
        result = None
        try:
            result = env.program(env.compile(validation["rule"])).evaluate(activation)
        except celpy.CELEvalError:
            pass
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            errors.append(f"{path}: {validation['message']}")
    if isinstance(value, dict):
        for name, prop in schema.get("properties", {}).items():
            if name in value:
                previous = old.get(name, _NEW) if isinstance(old, dict) else _NEW
                errors += cel_errors(prop, value[name], previous, f"{path}.{name}" if path else name)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += cel_errors(schema["items"], item, _NEW, f"{path}[{i}]")
    return errors


def admit(crd: dict, obj: dict, old: dict | None = None) -> list[str]:
    """The errors the API server would give for `obj` (an update of `old` when given), empty when it is stored."""
    schema = schema_of(crd)
    obj = with_defaults(schema, obj)
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}"
              for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
    return errors + cel_errors(schema, obj, _NEW if old is None else with_defaults(schema, old))


def cluster_peer(spec: dict) -> dict:
    return {"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer", "metadata": {"name": "b"},
            "spec": spec}


def seconds(duration: str) -> int:
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([hms])", duration))


def as_duration(total: int) -> str:
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    return "".join(f"{n}{u}" for n, u in ((h, "h"), (m, "m"), (s, "s")) if n) or "0s"


@pytest.fixture(scope="module")
def ttl_bounds(guide_text: str) -> tuple[str, str, str]:
    """tokenTTL's range and default as the administrator's guide states them."""
    low, high, default = re.search(r"tokenTTL is [^:]*: from (\S+) to (\S+), (\S+) by default", guide_text).groups()
    return low, high, default


def test_the_guide_states_the_ttl_range(ttl_bounds) -> None:
    assert ttl_bounds == ("10m", "24h", "24h")


def test_token_ttl_range_is_enforced_at_its_bounds(crds, ttl_bounds) -> None:
    low, high, _ = ttl_bounds
    crd = crds["ClusterPeer"]
    ok = [low, high, "1h", "90m", "1h30m", as_duration(seconds(low) + 1)]
    too_short = [as_duration(seconds(low) - 1), "1m", "0s"]
    too_long = [as_duration(seconds(high) + 1), "25h", "48h"]
    for ttl in ok:
        assert admit(crd, cluster_peer({"type": "Invite", "invite": {"tokenTTL": ttl}})) == [], ttl
    for ttl in too_short + too_long:
        errors = admit(crd, cluster_peer({"type": "Invite", "invite": {"tokenTTL": ttl}}))
        assert errors == ["spec.invite.tokenTTL: spec.invite.tokenTTL must be from 10m to 24h, such as 30m, 1h or 24h"
                          ], ttl


@pytest.mark.parametrize("ttl", ["1d", "1.5h", "-1h", "1h ", "h", "10 m", "PT1H"])
def test_token_ttl_that_is_not_a_duration_is_refused(crds, ttl: str) -> None:
    errors = admit(crds["ClusterPeer"], cluster_peer({"type": "Invite", "invite": {"tokenTTL": ttl}}))
    assert any(e.startswith("spec.invite.tokenTTL: ") and "does not match" in e for e in errors), errors


def test_token_ttl_defaults_to_the_guides_value_and_the_default_is_admitted(crds, ttl_bounds) -> None:
    crd = crds["ClusterPeer"]
    obj = cluster_peer({"type": "Invite", "invite": {}})
    assert with_defaults(schema_of(crd), obj)["spec"]["invite"]["tokenTTL"] == ttl_bounds[2]
    assert admit(crd, obj) == []


def test_an_invite_needs_no_settings(crds) -> None:
    assert admit(crds["ClusterPeer"], cluster_peer({"type": "Invite"})) == []


def test_a_join_needs_a_connection_string(crds) -> None:
    crd = crds["ClusterPeer"]
    message = ("spec: a ClusterPeer of type Join needs spec.join.connectionString: set it to the connection string "
               "issued by the inviting cluster")
    assert admit(crd, cluster_peer({"type": "Join"})) == [message]
    assert admit(crd, cluster_peer({"type": "Join", "join": {}})) == [message]
    assert admit(crd, cluster_peer({"type": "Join", "join": {"connectionString": ""}})) == [message]
    assert admit(crd, cluster_peer({"type": "Join", "join": {"connectionString": "pc1.abc"}})) == []
    # A writer without clusterpeers/sensitive sends back "<omitted>", which the API server keeps as the stored
    # value: the rule must not refuse it.
    assert admit(crd, cluster_peer({"type": "Join", "join": {"connectionString": "<omitted>"}})) == []


def test_settings_of_the_other_type_are_refused(crds) -> None:
    crd = crds["ClusterPeer"]
    assert admit(crd, cluster_peer({"type": "Join", "join": {"connectionString": "x"}, "invite": {}})) == [
        "spec: spec.invite applies only to a ClusterPeer of type Invite: remove spec.invite or set spec.type to "
        "Invite"]
    assert admit(crd, cluster_peer({"type": "Invite", "join": {"connectionString": "x"}})) == [
        "spec: spec.join applies only to a ClusterPeer of type Join: remove spec.join or set spec.type to Join"]


def test_type_cannot_change_once_created(crds) -> None:
    crd = crds["ClusterPeer"]
    invite = cluster_peer({"type": "Invite"})
    join = cluster_peer({"type": "Join", "join": {"connectionString": "x"}})
    assert admit(crd, join) == []
    assert admit(crd, join, old=invite) == [
        "spec.type: spec.type cannot change: delete this ClusterPeer and create a new one of the other type"]
    assert admit(crd, cluster_peer({"type": "Invite", "capabilities": ["c"]}), old=invite) == []


def test_type_is_required_and_one_of_invite_or_join(crds) -> None:
    crd = crds["ClusterPeer"]
    assert any("'type' is a required property" in e for e in admit(crd, cluster_peer({})))
    assert any("is not one of ['Invite', 'Join']" in e for e in admit(crd, cluster_peer({"type": "Accept"})))
    assert any("'spec' is a required property" in e for e in admit(crd, {"metadata": {"name": "b"}}))


@pytest.mark.parametrize("where", ["invite", "join"])
def test_expected_cluster_uuid_looks_like_a_uuid(crds, where: str) -> None:
    crd = crds["ClusterPeer"]
    base = {"invite": {"type": "Invite", "invite": {}},
            "join": {"type": "Join", "join": {"connectionString": "x"}}}[where]

    def spec(uuid: str) -> dict:
        out = copy.deepcopy(base)
        out[where]["expectedClusterUUID"] = uuid
        return out

    assert admit(crd, cluster_peer(spec(UUID))) == []
    assert admit(crd, cluster_peer(spec(UUID.upper()))) == []
    for bad in ("cluster-a", UUID + "0", UUID.replace("-", ""), "g" * 8 + UUID[8:], ""):
        errors = admit(crd, cluster_peer(spec(bad)))
        assert any(e.startswith(f"spec.{where}.expectedClusterUUID: ") for e in errors), bad


def test_connection_string_is_bounded(crds) -> None:
    crd = crds["ClusterPeer"]
    assert admit(crd, cluster_peer({"type": "Join", "join": {"connectionString": "x" * 4096}})) == []
    errors = admit(crd, cluster_peer({"type": "Join", "join": {"connectionString": "x" * 4097}}))
    assert any(e.startswith("spec.join.connectionString: ") and "is too long" in e for e in errors)


def test_capability_names_are_bounded(crds) -> None:
    crd = crds["ClusterPeer"]
    assert admit(crd, cluster_peer({"type": "Invite", "capabilities": ["a" * 63]})) == []
    assert admit(crd, cluster_peer({"type": "Invite", "capabilities": ["a" * 64]})) != []


def test_status_enums_and_limits(crds) -> None:
    crd = crds["ClusterPeer"]
    good = cluster_peer({"type": "Invite"}) | {"status": {
        "phase": "Active",
        "conditions": [{"type": "Ready", "status": "True", "reason": "Synced", "observedGeneration": 1,
                        "lastTransitionTime": "2026-01-01T00:00:00Z", "message": ""}],
        "invite": {"tokenID": "a" * 16, "tokenHash": "0" * 64, "used": False},
    }}
    assert admit(crd, good) == []
    for status in ({"phase": "Done"}, {"conditions": [{"type": "Ready", "status": "Yes"}]},
                   {"conditions": [{"status": "True"}]}, {"conditions": [{"type": "Ready", "observedGeneration": -1}]},
                   {"invite": {"tokenID": "a" * 17}}, {"invite": {"tokenHash": "0" * 65}}):
        assert admit(crd, cluster_peer({"type": "Invite"}) | {"status": status}) != [], status


def test_peering_capability_consumers_default_to_service_accounts(crds) -> None:
    crd = crds["PeeringCapability"]
    obj = {"metadata": {"name": "c"}, "spec": {"version": "v1", "consumers": [{"name": "ctl", "namespace": "d8-x"}],
                                              "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}}
    assert with_defaults(schema_of(crd), obj)["spec"]["consumers"][0]["kind"] == "ServiceAccount"
    assert admit(crd, obj) == []
    bad_kind = copy.deepcopy(obj)
    bad_kind["spec"]["consumers"][0]["kind"] = "User"
    assert any("is not one of ['ServiceAccount']" in e for e in admit(crd, bad_kind))
    assert any("'version' is a required property" in e for e in admit(crd, {"spec": {}}))
    assert admit(crd, {"spec": {"version": "v" * 65}}) != []
    assert admit(crd, {"spec": {"version": "v1", "consumers": [{"namespace": "n" * 64}]}}) != []


def test_project_peer_state_is_one_of_the_two(crds) -> None:
    crd = crds["ProjectPeer"]
    assert admit(crd, {"status": {"state": "Paired"}}) == []
    assert admit(crd, {"status": {"state": "PeerUnreachable", "reason": "SyncFailed"}}) == []
    assert admit(crd, {"status": {"state": "Unpaired"}}) != []
