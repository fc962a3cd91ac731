"""The per-kind rules of the built-ins that kube-apiserver's validation has and a schema cannot say: Secret
data in base64 (with Go's offset of the first bad byte), RBAC rules and role references, Lease counters."""

from __future__ import annotations

import json

from lab.apiserver import errors, validation
from lab.apiserver.resources import ResourceInfo


def check_base64(kind: str, data: dict) -> None:
    """Values of Secret data and ConfigMap binaryData are base64: anything else fails the decoding of the body
    (400), as Go's decoder says it, naming the first byte that is wrong."""
    for value in data.values():
        if not isinstance(value, str):
            continue
        offset = _base64_error_offset(value)
        if offset is not None:
            raise errors.bad_request(f'{kind} in version "v1" cannot be handled as a {kind}: illegal base64 data '
                                     f"at input byte {offset}")


_B64 = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")


def _base64_error_offset(src: str) -> int | None:
    """Where Go's base64.StdEncoding decoder stops on `src` (None: it decodes), quantum by quantum as it reads:
    line breaks skipped, padding only where a quantum of two or three characters ends, nothing after it."""
    si, n = 0, len(src)
    while True:
        j = 0
        while j < 4:
            if si == n:
                return None if j == 0 else si - j
            c = src[si]
            si += 1
            if c in "\r\n":
                continue
            if c in _B64:
                j += 1
                continue
            if c != "=" or j < 2:
                return si - 1
            if j == 2:   # "==" expected: the first is read
                while si < n and src[si] in "\r\n":
                    si += 1
                if si == n:
                    return n
                if src[si] != "=":
                    return si - 1
                si += 1
            while si < n and src[si] in "\r\n":
                si += 1
            return si if si < n else None


def rbac_rules(info: ResourceInfo, obj: dict, old: dict | None) -> None:
    """rbac.authorization.k8s.io validation as far as the module writes roles and bindings."""
    name = obj["metadata"].get("name", "")
    causes = []
    if info.plural in ("roles", "clusterroles"):
        namespaced = info.plural == "roles"
        for i, rule in enumerate(obj.get("rules") or ()):
            where = f"rules[{i}]"
            if not rule.get("verbs"):
                causes.append(validation.cause("FieldValueRequired", f"{where}.verbs", "Required value"))
            if rule.get("nonResourceURLs"):
                urls = json.dumps(list(rule["nonResourceURLs"]), separators=(",", ":"))
                if namespaced:
                    causes.append(validation.cause("FieldValueInvalid", f"{where}.nonResourceURLs", f"Invalid value: "
                                                   f"{urls}: namespaced rules cannot apply to non-resource URLs"))
                if rule.get("apiGroups") or rule.get("resources") or rule.get("resourceNames"):
                    causes.append(validation.cause("FieldValueInvalid", f"{where}.nonResourceURLs", f"Invalid value: "
                                                   f"{urls}: rules cannot apply to both regular resources and "
                                                   "non-resource URLs"))
                continue
            if not rule.get("apiGroups"):
                causes.append(validation.cause("FieldValueRequired", f"{where}.apiGroups",
                                               "Required value: resource rules must supply at least one api group"))
            if not rule.get("resources"):
                causes.append(validation.cause("FieldValueRequired", f"{where}.resources",
                                               "Required value: resource rules must supply at least one resource"))
        if not obj.get("rules"):
            obj["rules"] = None   # Go's nil slice: an empty or absent list is stored and answered as null
    elif old is not None and obj.get("roleRef") != old.get("roleRef"):
        ref = old.get("roleRef") or {}
        shown = json.dumps({"APIGroup": (obj.get("roleRef") or {}).get("apiGroup", ""),
                            "Kind": (obj.get("roleRef") or {}).get("kind", ""),
                            "Name": (obj.get("roleRef") or {}).get("name", "")}, separators=(",", ":"))
        if ref:
            causes.append(validation.cause("FieldValueInvalid", "roleRef", f"Invalid value: {shown}: field is "
                                                                           "immutable"))
    if causes:
        raise errors.invalid(info.kind, info.group, name, causes)


def lease_rules(obj: dict) -> None:
    """coordination.k8s.io validation of a Lease's spec, as far as a leader election writes it."""
    spec = obj.get("spec") or {}
    name = obj["metadata"].get("name", "")
    causes = []
    for f, minimum in (("leaseDurationSeconds", 1), ("leaseTransitions", 0)):
        v = spec.get(f)
        if isinstance(v, int) and v < minimum:
            causes.append(validation.invalid_cause(
                f"spec.{f}", v, "must be greater than 0" if minimum else "must be greater than or equal to 0"))
    if causes:
        raise errors.invalid("Lease", "coordination.k8s.io", name, causes)
