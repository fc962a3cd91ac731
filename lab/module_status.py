"""What Deckhouse's module manager writes of a module: its Module object, its conditions and status (kept
when nothing changed), and the merge of a rendered object into the stored one."""

from __future__ import annotations

import copy
import datetime
from typing import Any, Mapping

GROUP = "deckhouse.io"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def module_object(definition: Mapping) -> dict:
    """The Module deckhouse-controller writes for an embedded module, from its module.yaml."""
    props: dict[str, Any] = {"source": "Embedded"}
    for key in ("weight", "stage", "namespace", "subsystems", "requirements", "exclusiveGroup"):
        if definition.get(key) is not None:
            props[key] = copy.deepcopy(definition[key])
    disable = definition.get("disable")
    if disable:
        props["disableOptions"] = copy.deepcopy(disable)
    return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "Module", "metadata": {"name": definition["name"]},
            "properties": props}


def condition(previous: list, ctype: str, status: str, reason: str, message: str, now: str) -> dict:
    """A Module condition; lastTransitionTime moves only when its status does."""
    old = next((c for c in previous if c.get("type") == ctype), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else now
    out = {"type": ctype, "status": status, "lastProbeTime": now, "lastTransitionTime": since}
    if reason:
        out["reason"] = reason
    if message:
        out["message"] = message
    return out


def module_status(previous: Mapping | None, *, by_config: bool, enabled: bool, phase: str,
                  off: tuple[str, str] = ("", ""), error: str = "", now: str = "") -> dict:
    """A Module's status as deckhouse-controller writes it: `phase` Reconciling, Ready or Error while the module is
    enabled; when it is off, Downloaded (a module never installed stays Available) with `off`'s reason and message
    on EnabledByModuleManager and IsReady."""
    previous = previous or {}
    now = now or _now()
    conds = previous.get("conditions") or []
    out = [condition(conds, "EnabledByModuleConfig", "True" if by_config else "False", "", "", now)]
    if enabled:
        out.append(condition(conds, "EnabledByModuleManager", "True", "", "", now))
        ready = {"Ready": ("True", "", ""), "Reconciling": ("False", "Reconciling", "reconciling"),
                 "Error": ("False", "ModuleError", error)}[phase]
        out.append(condition(conds, "IsReady", *ready, now))
        return {"phase": phase, "conditions": out}
    phase = previous.get("phase") if previous.get("phase") in ("Available", "Unavailable", None) else "Downloaded"
    out += [condition(conds, "EnabledByModuleManager", "False", *off, now),
            condition(conds, "IsReady", "False", *off, now)]
    return {"phase": phase or "Available", "conditions": out}


def same_status(a: Mapping | None, b: Mapping) -> bool:
    def strip(s):
        return {"phase": (s or {}).get("phase"),
                "conditions": [{k: v for k, v in c.items() if k != "lastProbeTime"} for c in (s or {}).get("conditions")
                               or []]}
    return strip(a) == strip(b)


def merged(existing: Any, rendered: Any) -> Any:
    """`rendered` over `existing`: what an apply of the rendered object leaves (fields the server or others set,
    such as a Service's clusterIP, stay; lists are the rendered ones)."""
    if isinstance(existing, dict) and isinstance(rendered, dict):
        out = dict(existing)
        for key, value in rendered.items():
            out[key] = merged(existing.get(key), value)
        return out
    return copy.deepcopy(rendered)
