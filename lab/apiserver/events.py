"""Events of both APIs in one store, as kube-apiserver keeps them: events.k8s.io/v1 is a view of core v1 Event
with renamed fields, so an Event the module writes through events.k8s.io shows in `kubectl get events`."""

from __future__ import annotations

import json
import re

EVENTS_GROUP = "events.k8s.io"
CORE_KEY = ("", "events")

# events.k8s.io/v1 field -> core v1 field (the conversion of k8s.io/kubernetes/pkg/apis/events/v1).
_RENAMES = {
    "regarding": "involvedObject",
    "note": "message",
    "reportingController": "reportingComponent",
    "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count",
}
_BACK = {v: k for k, v in _RENAMES.items()}


def to_core(obj: dict) -> dict:
    out = {_RENAMES.get(k, k): v for k, v in obj.items()}
    out["apiVersion"], out["kind"] = "v1", "Event"
    return out


def from_core(obj: dict, version: str = "v1") -> dict:
    out = {_BACK.get(k, k): v for k, v in obj.items()}
    out["apiVersion"], out["kind"] = f"{EVENTS_GROUP}/{version}", "Event"
    return out


# What kube-apiserver's validation allows an Event made through events.k8s.io/v1 (ValidateEventCreate).
_LIMITS = (("reportingInstance", 128), ("action", 128), ("reason", 128), ("message", 1024))
_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_QUALIFIED_MESSAGE = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                      "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                      "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


def creation_problems(core: dict) -> list[dict]:
    """The causes of a 422 for an Event (in its core form) created through events.k8s.io/v1; the fields are named
    as kube-apiserver names them there (`reportingController`, but `message` for the note)."""
    def cause(reason: str, field: str, message: str) -> dict:
        return {"reason": reason, "message": message, "field": field}

    out = []
    controller = core.get("reportingComponent") or ""
    if core.get("eventTime"):
        if not controller:
            out.append(cause("FieldValueInvalid", "reportingController", 'Invalid value: "": name part must be '
                                                                         "non-empty"))
        name = controller.rpartition("/")[2]
        if not _QUALIFIED.match(name) or len(name) > 63:
            out.append(cause("FieldValueInvalid", "reportingController",
                             f"Invalid value: {json.dumps(controller)}: {_QUALIFIED_MESSAGE}"))
        if not controller:
            out.append(cause("FieldValueRequired", "reportingController", "Required value"))
        for field, limit in _LIMITS:
            value = core.get(field) or ""
            if not value and field != "message":
                out.append(cause("FieldValueRequired", field, "Required value"))
            elif len(value) > limit:
                out.append(cause("FieldValueInvalid", field, f'Invalid value: "": can have at most {limit} '
                                                             "characters"))
    else:
        out.append(cause("FieldValueRequired", "eventTime", "Required value"))
    if core.get("type") not in ("Normal", "Warning"):
        out.append(cause("FieldValueInvalid", "type", f'Invalid value: "": has invalid value: {core.get("type") or ""}'))
    return out
