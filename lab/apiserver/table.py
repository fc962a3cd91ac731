"""Server-side table output (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), rendered as kube-apiserver
renders it: CRD additionalPrinterColumns through Kubernetes JSONPath, a few columns of its own for built-ins."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

from lab.apiserver.resources import ResourceInfo

NAME_DESCRIPTION = ("Name must be unique within a namespace. Is required when creating resources, although some "
                    "resources may allow a client to request the generation of an appropriate name automatically. "
                    "Name is primarily intended for creation idempotence and configuration definition. Cannot be "
                    "updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names")


class JSONPathError(ValueError):
    pass


# ---------------------------------------------------------------- Kubernetes JSONPath (the part columns use)

_TOKEN = re.compile(r"""
    \.\.(?P<rname>[A-Za-z0-9_\-$]+)       # recursive descent to a field
  | \.(?P<name>[A-Za-z0-9_\-$/]+)        # .field
  | \[\?\((?P<filter>.*?)\)\]            # [?(@.a == "x")]
  | \[(?P<quoted>'[^']*'|"[^"]*")\]      # ['field']
  | \[(?P<index>-?\d+|\*|-?\d*:-?\d*)\]  # [0] [*] [1:3]
  | \.\*(?P<star>)                         # .*
""", re.VERBOSE)

_FILTER = re.compile(r"""^\s*@(?P<path>(?:\.[A-Za-z0-9_\-$]+|\[[^\]]*\])*)\s*
    (?:(?P<op>==|!=|<=|>=|<|>)\s*(?P<lit>"[^"]*"|'[^']*'|-?\d+(?:\.\d+)?|true|false))?\s*$""", re.VERBOSE)


def parse_jsonpath(expr: str) -> list[tuple]:
    """`.status.conditions[?(@.type=="Ready")].status` or `{...}` to steps; an error says where it broke."""
    text = expr.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    if text.startswith("$"):
        text = text[1:]
    steps, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise JSONPathError(f"unrecognized JSONPath at {text[pos:]!r} in {expr!r}")
        if m.group("rname") is not None:
            steps.append(("recursive", m.group("rname")))
        elif m.group("name") is not None:
            steps.append(("field", m.group("name")))
        elif m.group("filter") is not None:
            f = _FILTER.match(m.group("filter"))
            if not f:
                raise JSONPathError(f"unsupported JSONPath filter {m.group('filter')!r} in {expr!r}")
            lit = f.group("lit")
            value = None
            if lit is not None:
                value = json.loads(lit.replace("'", '"')) if lit[0] in "'\"" else json.loads(lit)
            steps.append(("filter", parse_jsonpath(f.group("path")) if f.group("path") else [], f.group("op"), value))
        elif m.group("quoted") is not None:
            steps.append(("field", m.group("quoted")[1:-1]))
        elif m.group("index") is not None:
            idx = m.group("index")
            if idx == "*":
                steps.append(("all",))
            elif ":" in idx:
                a, b = idx.split(":")
                steps.append(("slice", int(a) if a else None, int(b) if b else None))
            else:
                steps.append(("index", int(idx)))
        else:
            steps.append(("all",))
        pos = m.end()
    return steps


def _compare(a, op, b) -> bool:
    try:
        return {"==": a == b, "!=": a != b, "<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
    except TypeError:
        return False


def _walk_recursive(value, name, out):
    if isinstance(value, dict):
        if name in value:
            out.append(value[name])
        for v in value.values():
            _walk_recursive(v, name, out)
    elif isinstance(value, list):
        for v in value:
            _walk_recursive(v, name, out)


def find(steps: list[tuple], obj) -> list:
    """All values the path selects; a missing key selects nothing (kube's allowMissingKeys)."""
    current = [obj]
    for step in steps:
        nxt = []
        for v in current:
            kind = step[0]
            if kind == "field" and isinstance(v, dict) and step[1] in v:
                nxt.append(v[step[1]])
            elif kind == "index" and isinstance(v, list) and -len(v) <= step[1] < len(v):
                nxt.append(v[step[1]])
            elif kind == "slice" and isinstance(v, list):
                nxt.extend(v[step[1]:step[2]])
            elif kind == "all":
                nxt.extend(v if isinstance(v, list) else (v.values() if isinstance(v, dict) else ()))
            elif kind == "recursive":
                _walk_recursive(v, step[1], nxt)
            elif kind == "filter" and isinstance(v, list):
                _, sub, op, lit = step
                for item in v:
                    found = find(sub, item)
                    if op is None:
                        if found:
                            nxt.append(item)
                    elif found and _compare(found[0], op, lit):
                        nxt.append(item)
        current = nxt
    return current


# ---------------------------------------------------------------- cell rendering

def go_json(value) -> str:
    """Go's json.Marshal: compact, map keys sorted, <, > and & escaped."""
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _text(value) -> str:
    if isinstance(value, (dict, list)):
        return go_json(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "<nil>"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration, which the AGE column shows."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m" if rest == 0 else f"{minutes}m{rest}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h" if rest == 0 else f"{hours}h{rest}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d" if rest == 0 else f"{hours // 24}d{rest}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        rest = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if rest == 0 else f"{hours // 24 // 365}y{rest}d"
    return f"{hours // 24 // 365}y"


def age(timestamp: str | None, now: datetime | None = None) -> str:
    if not timestamp:
        return "<unknown>"
    try:
        t = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return "<invalid>"
    now = now or datetime.now(timezone.utc)
    return human_duration((now - t).total_seconds())


def cell(column: dict, obj: dict, now: datetime | None = None):
    """One CRD column's cell, as apiextensions-apiserver's table convertor computes it."""
    try:
        results = find(parse_jsonpath(column["jsonPath"]), obj)
    except JSONPathError:
        return None
    if not results:
        return None
    value = results[0]
    kind = column.get("type", "string")
    if kind == "string":
        return _text(value)
    if value is None:
        return None
    if kind == "integer" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind == "date" and isinstance(value, str):
        return age(value, now)
    return None


# ---------------------------------------------------------------- tables

def _name_column() -> dict:
    return {"name": "Name", "type": "string", "format": "name", "description": NAME_DESCRIPTION, "priority": 0}


# The built-ins' column descriptions are their Go types' API documentation, as kube-apiserver's printers use it.
CREATION_TIMESTAMP_DESCRIPTION = (
    "CreationTimestamp is a timestamp representing the server time when this object was created. It is not "
    "guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It "
    "is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More "
    "info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata")


def _age_column() -> dict:
    return {"name": "Age", "type": "string", "format": "", "description": CREATION_TIMESTAMP_DESCRIPTION,
            "priority": 0}


# Built-in kinds show a few columns of their own before AGE, like kube-apiserver's printers: (name,
# description, cell). Every one is of type string, counts included.
_BUILTIN_COLUMNS = {
    ("", "namespaces"): [("Status", "The status of the namespace",
                          lambda o: (o.get("status") or {}).get("phase", "Active"))],
    ("", "secrets"): [("Type", "Used to facilitate programmatic handling of secret data. More info: "
                               "https://kubernetes.io/docs/concepts/configuration/secret/#secret-types",
                       lambda o: o.get("type", "Opaque")),
                      ("Data", "Data contains the secret data. Each key must consist of alphanumeric characters, "
                               "'-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, "
                               "representing the arbitrary (possibly non-string) data value here. Described in "
                               "https://tools.ietf.org/html/rfc4648#section-4",
                       lambda o: len(o.get("data") or {}))],
    ("", "configmaps"): [("Data", "Data contains the configuration data. Each key must consist of alphanumeric "
                                  "characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the "
                                  "BinaryData field. The keys stored in Data must not overlap with the keys in the "
                                  "BinaryData field, this is enforced during validation process.",
                          lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {}))],
    ("coordination.k8s.io", "leases"): [("Holder", "holderIdentity contains the identity of the holder of a "
                                                   "current lease. If Coordinated Leader Election is used, the "
                                                   "holder identity must be equal to the elected "
                                                   "LeaseCandidate.metadata.name field.",
                                         lambda o: (o.get("spec") or {}).get("holderIdentity", ""))],
}


def column_definitions(info: ResourceInfo) -> list[dict]:
    cols = [_name_column()]
    if info.custom:
        for c in info.printer_columns:
            # A column without a description is described by its JSONPath, as kube-apiserver does.
            cols.append({"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", ""),
                         "description": c.get("description") or "Custom resource definition column (in JSONPath "
                                                                f"format): {c.get('jsonPath', '')}",
                         "priority": c.get("priority", 0)})
        return cols
    for name, description, _ in _BUILTIN_COLUMNS.get(info.key, ()):
        cols.append({"name": name, "type": "string", "format": "", "description": description, "priority": 0})
    cols.append(_age_column())
    return cols


def row(info: ResourceInfo, obj: dict, include_object: str = "Metadata", now: datetime | None = None,
        version: str = "v1") -> dict:
    meta = obj.get("metadata") or {}
    cells: list = [meta.get("name", "")]
    if info.custom:
        cells += [cell(c, obj, now) for c in info.printer_columns]
    else:
        cells += [fn(obj) for _, _, fn in _BUILTIN_COLUMNS.get(info.key, ())]
        cells.append(age(meta.get("creationTimestamp"), now))
    out: dict = {"cells": cells}
    if include_object == "Object":
        out["object"] = obj
    elif include_object == "None":
        out["object"] = None
    else:
        out["object"] = {"kind": "PartialObjectMetadata", "apiVersion": f"meta.k8s.io/{version}", "metadata": meta}
    return out


INCLUDE_OBJECT = ("Metadata", "Object", "None", "")


def table_version(accept: str) -> str | None:
    """The meta.k8s.io version of Table an Accept header asks for (v1 when it names both), or None."""
    versions = []
    for part in accept.split(","):
        params = dict(p.strip().split("=", 1) for p in part.split(";")[1:] if "=" in p)
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io" and params.get("v") in ("v1",
                                                                                                    "v1beta1"):
            versions.append(params["v"])
    return "v1" if "v1" in versions else versions[0] if versions else None


def table(info: ResourceInfo, objects: list[dict], resource_version: str, include_object: str = "Metadata",
          with_columns: bool = True, version: str = "v1") -> dict:
    from lab.apiserver import errors
    if include_object not in INCLUDE_OBJECT:
        raise errors.bad_request(f"Unable to convert to Table as requested: includeObject: Invalid value: "
                                 f"\"{include_object}\": must be 'Metadata', 'Object', 'None', or empty")
    now = datetime.now(timezone.utc)
    out = {"kind": "Table", "apiVersion": f"meta.k8s.io/{version}", "metadata": {"resourceVersion": resource_version}}
    if with_columns:
        out["columnDefinitions"] = column_definitions(info)
    out["rows"] = [row(info, o, include_object or "Metadata", now, version) for o in objects]
    return out
