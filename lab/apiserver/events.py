"""Events of both APIs in one store, as kube-apiserver keeps them: events.k8s.io/v1 is a view of core v1 Event
with renamed fields, so an Event the module writes through events.k8s.io shows in `kubectl get events`."""

from __future__ import annotations

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
