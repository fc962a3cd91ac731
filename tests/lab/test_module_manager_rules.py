"""The rules of the lab's module manager as tables, without a cluster: the webhook's verdict on each ModuleConfig
write (lab/module_webhook.py) in deckhouse-controller's order and words, the Module's status
(lab/module_manager.py), and the settings errors in addon-operator's go-openapi words (lab/deckhouse_module.py)."""

from __future__ import annotations

import pytest

from lab import deckhouse_module, userauthn_module
from lab.module_manager import SETTINGS_VERSIONS, TURNED_OFF_BY_CONFIG, USER_AUTHN_DEFINITION, module_object, \
    module_status
from lab.module_webhook import DISABLE_SUFFIX, Known, review_response, values_key, verdict

PEERING = deckhouse_module.definition()
KNOWN = Known({"peering": PEERING, "user-authn": USER_AUTHN_DEFINITION},
              {"peering": deckhouse_module.config_schema(), "user-authn": userauthn_module.SETTINGS_SCHEMA},
              frozenset({"user-authn", "peering"}), frozenset({"peering", "user-authn"}), SETTINGS_VERSIONS)
CONFIRM = PEERING["disable"]["messages"]["en"].strip() + " " + DISABLE_SUFFIX


def mc(name: str = "peering", annotated: bool = False, **spec) -> dict:
    meta = {"name": name}
    if annotated:
        meta["annotations"] = {"modules.deckhouse.io/allow-disabling": "true"}
    return {"apiVersion": "deckhouse.io/v1alpha1", "kind": "ModuleConfig", "metadata": meta, "spec": spec}


@pytest.mark.parametrize(("operation", "cfg", "old", "known", "allowed", "message"), [
    ("UPDATE", mc(enabled=False), mc(enabled=True), KNOWN, False, CONFIRM),
    ("UPDATE", mc(annotated=True, enabled=False), mc(enabled=True), KNOWN, True, ""),
    ("UPDATE", mc(enabled=False), mc(annotated=True, enabled=True), KNOWN, True, ""),
    ("DELETE", mc(enabled=True), None, KNOWN, False, CONFIRM),
    ("DELETE", mc(enabled=False), None, KNOWN, True, ""),
    ("CREATE", mc(enabled=False), None, KNOWN, False, CONFIRM),              # enabled now: creating a disable
    ("CREATE", mc(enabled=False), None, Known(KNOWN.definitions, KNOWN.schemas, frozenset({"user-authn"}),
                                              KNOWN.modules), True, ""),
    # user-authn asks no confirmation.
    ("UPDATE", mc("user-authn", enabled=False), mc("user-authn", enabled=True), KNOWN, True, ""),
    # Enabling without the required module.
    ("CREATE", mc(enabled=True), None, Known(KNOWN.definitions, KNOWN.schemas, frozenset(), KNOWN.modules), False,
     "1 error occurred: 'user-authn' is not deployed"),
    ("UPDATE", mc(enabled=True), mc(enabled=False), Known(KNOWN.definitions, KNOWN.schemas, frozenset(),
                                                          KNOWN.modules), False,
     "1 error occurred: 'user-authn' is not deployed"),
    ("CREATE", mc("nothing", enabled=True), None, KNOWN, False, "the 'nothing' module not found"),
    ("UPDATE", mc(enabled=True, source="Embedded"), mc(enabled=True), KNOWN, False, "'Embedded' is a forbidden source"),
    ("UPDATE", mc(enabled=True, settings={"logLevel": "Debug"}), mc(enabled=True), KNOWN, False,
     "spec.version is required when spec.settings are specified"),
    ("UPDATE", mc(enabled=True, version=3, settings={"logLevel": "Debug"}), mc(enabled=True), KNOWN, False,
     "spec.version=3 is unsupported. Use latest version 1"),
    ("UPDATE", mc(enabled=True, version=1, settings={"logLevel": "Loud"}), mc(enabled=True), KNOWN, False,
     "spec.settings are not valid (version 1):  1 error occurred: * peering.logLevel in body should be one of "
     "[Debug Info Warning Error]  "),
    # Settings of a config that disables the module are not checked.
    ("UPDATE", mc(annotated=True, enabled=False, version=1, settings={"logLevel": "Loud"}), mc(enabled=True), KNOWN,
     True, ""),
    ("UPDATE", mc("user-authn", enabled=True, version=2, settings={"publishAPI": {"enabled": "yes"}}),
     mc("user-authn", enabled=True), KNOWN, False,
     "spec.settings are not valid (version 2):  1 error occurred: * userAuthn.publishAPI.enabled in body must be of "
     "type boolean: \"string\"  "),
    ("CONNECT", mc(), None, KNOWN, False, "operation 'CONNECT' is not applicable"),
])
def test_the_webhooks_verdict(operation, cfg, old, known, allowed, message):
    got = verdict(operation, cfg, old, known)
    assert (got.allowed, got.message) == (allowed, message)


def test_an_unknown_module_is_let_through_with_a_warning_and_versions_warn():
    got = verdict("UPDATE", mc("nothing", enabled=False), mc("nothing"), KNOWN)
    assert got.allowed and got.warnings == ("the 'nothing' module not found",)
    got = verdict("UPDATE", mc("user-authn", enabled=True, version=1, settings={"publishAPI": {"enabled": True}}),
                  mc("user-authn", enabled=True), KNOWN)
    assert got.allowed and got.warnings == ("spec.version=1 is obsolete. Please migrate spec.settings to the latest "
                                            "version 2",)


def test_the_review_answers_with_deckhouses_422():
    review = {"request": {"uid": "u1", "operation": "UPDATE", "object": mc(enabled=False),
                          "oldObject": mc(enabled=True)}}
    answer = review_response(review, KNOWN)["response"]
    assert answer == {"uid": "u1", "allowed": False,
                      "status": {"status": "Failure", "reason": "Invalid", "code": 422, "message": CONFIRM}}


def test_values_keys_are_camel_case():
    assert (values_key("peering"), values_key("user-authn"), values_key("cert-manager")) == (
        "peering", "userAuthn", "certManager")


def test_the_module_object_carries_module_yaml():
    module = module_object(PEERING)
    assert module["properties"]["source"] == "Embedded" and module["properties"]["stage"] == "General Availability"
    assert module["properties"]["requirements"]["modules"] == {"user-authn": ">= 0.0.0"}
    assert module["properties"]["disableOptions"]["confirmation"] is True


def test_the_modules_status_through_its_life():
    fresh = module_status(None, by_config=False, enabled=False, phase="", off=("Bundle", "turned off by bundle"),
                          now="t0")
    assert fresh["phase"] == "Available"
    reconciling = module_status(fresh, by_config=True, enabled=True, phase="Reconciling", now="t1")
    assert reconciling["phase"] == "Reconciling"
    conds = {c["type"]: c for c in reconciling["conditions"]}
    assert conds["IsReady"]["reason"] == "Reconciling" and conds["EnabledByModuleManager"]["status"] == "True"
    ready = module_status(reconciling, by_config=True, enabled=True, phase="Ready", now="t2")
    conds = {c["type"]: c for c in ready["conditions"]}
    assert ready["phase"] == "Ready" and conds["IsReady"] == {"type": "IsReady", "status": "True",
                                                               "lastProbeTime": "t2", "lastTransitionTime": "t2"}
    assert conds["EnabledByModuleManager"]["lastTransitionTime"] == "t1"   # moves only when its status does
    off = module_status(ready, by_config=False, enabled=False, phase="", off=TURNED_OFF_BY_CONFIG, now="t3")
    conds = {c["type"]: c for c in off["conditions"]}
    assert off["phase"] == "Downloaded"
    assert (conds["EnabledByModuleManager"]["reason"], conds["EnabledByModuleManager"]["message"]) == \
        ("ModuleConfig", "turned off by module config")
    failed = module_status(ready, by_config=True, enabled=True, phase="Error", error="boom", now="t4")
    conds = {c["type"]: c for c in failed["conditions"]}
    assert failed["phase"] == "Error" and (conds["IsReady"]["reason"], conds["IsReady"]["message"]) == (
        "ModuleError", "boom")


def test_settings_errors_in_go_openapis_words():
    schema = deckhouse_module.config_schema()
    values = deckhouse_module.with_defaults(schema, {"peerSyncIntervalSeconds": 99999, "joinTrustedProxies": ["x"],
                                                     "extra": 1})
    assert deckhouse_module.openapi_errors(schema, values, "peering") == [
        "peering.extra in body is a forbidden property",
        "peering.joinTrustedProxies.0 in body should match '^[0-9a-fA-F.:]+(/[0-9]{1,3})?$'",
        "peering.peerSyncIntervalSeconds in body should be less than or equal to 3600",
    ]
    assert deckhouse_module.multierror_text(["a", "b"]) == " 2 errors occurred: * a * b  "
