"""A CRD's OpenAPI checks through jsonschema, as kube-apiserver words their failures: the formats it knows,
ratcheting of unchanged values, and one cause per field and group of checks."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import re
from functools import lru_cache

import jsonschema

from lab.apiserver.causes import TYPE_NAMES, cause, invalid_cause, show


# ---------------------------------------------------------------- OpenAPI checks through jsonschema
def _to_jsonschema(schema):
    """OpenAPI v3.0 (as in CRDs) to draft 4: `nullable` becomes a null type, int-or-string an anyOf."""
    if isinstance(schema, list):
        return [_to_jsonschema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in ("properties", "patternProperties", "definitions"):
            out[k] = {pk: _to_jsonschema(pv) for pk, pv in v.items()}
        elif k in ("items", "additionalProperties", "not") or k in ("allOf", "anyOf", "oneOf"):
            out[k] = _to_jsonschema(v)
        elif k.startswith("x-kubernetes-") or k in ("default", "description", "example", "externalDocs"):
            continue
        else:
            out[k] = v
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if schema.get("nullable"):
        out.pop("nullable", None)
        if "type" in out:
            out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else out["type"] + ["null"]
        if "enum" in out:
            out["enum"] = list(out["enum"]) + [None]
    return out


# The string formats kube-apiserver checks in CRD schemas (go-openapi strfmt); other formats pass as in kube.
_FORMATS = jsonschema.FormatChecker(formats=())
_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:?\d{2})$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")


@_FORMATS.checks("date-time")
def _is_date_time(value) -> bool:
    return not isinstance(value, str) or bool(_DATE_TIME.match(value))


@_FORMATS.checks("date")
def _is_date(value) -> bool:
    return not isinstance(value, str) or bool(re.match(r"^\d{4}-\d{2}-\d{2}$", value))


@_FORMATS.checks("uuid")
def _is_uuid(value) -> bool:
    return not isinstance(value, str) or bool(_UUID.match(value))


@_FORMATS.checks("byte")
def _is_byte(value) -> bool:
    if not isinstance(value, str):
        return True
    try:
        base64.b64decode(value, validate=True)
        return True
    except (ValueError, binascii.Error):
        return False


@_FORMATS.checks("ipv4")
def _is_ipv4(value) -> bool:
    try:
        return not isinstance(value, str) or isinstance(ipaddress.ip_address(value), ipaddress.IPv4Address)
    except ValueError:
        return False


@_FORMATS.checks("ipv6")
def _is_ipv6(value) -> bool:
    try:
        return not isinstance(value, str) or isinstance(ipaddress.ip_address(value), ipaddress.IPv6Address)
    except ValueError:
        return False


@lru_cache(maxsize=256)
def _validator(schema_json: str):
    return jsonschema.Draft4Validator(_to_jsonschema(json.loads(schema_json)), format_checker=_FORMATS)


def _field(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _error_to_cause(err: jsonschema.ValidationError, strip: str = "") -> dict:
    full = _field(err.absolute_path)
    c = _error_to_cause_at(err, full[len(strip):] if strip and full.startswith(strip) else full)
    if c.get("field") is not None and strip and not c["field"].startswith(strip):
        # The field names the whole object's path; only the words "X in body" are relative to the status.
        c = dict(c, field=strip + c["field"] if c["field"] else strip.rstrip("."))
    return c


def _error_to_cause_at(err: jsonschema.ValidationError, field: str) -> dict:
    v = err.validator
    inst = err.instance
    if v == "required":
        missing = err.message.split("'")[1] if "'" in err.message else ""
        return cause("FieldValueRequired", f"{field}.{missing}" if field else missing, "Required value")
    if v == "enum":
        allowed = ", ".join(json.dumps(x) for x in err.validator_value if x is not None)
        return cause("FieldValueNotSupported", field, f"Unsupported value: {show(inst)}: supported values: {allowed}")
    if v == "type":
        got = TYPE_NAMES.get(type(inst), "unknown")
        want = err.validator_value if isinstance(err.validator_value, str) else err.validator_value[0]
        return cause("FieldValueTypeInvalid", field,
                     f'Invalid value: "{got}": {field} in body must be of type {want}: "{got}"')
    if v == "maxLength":
        return cause("FieldValueTooLong", field, f"Too long: may not be more than {err.validator_value} bytes")
    if v == "maxItems":
        return cause("FieldValueTooMany", field, f"Too many: {len(inst)}: must have at most {err.validator_value} items")
    if v == "maxProperties":
        return cause("FieldValueTooMany", field,
                     f"Too many: {len(inst)}: must have at most {err.validator_value} items")
    if v == "minLength":
        return invalid_cause(field, inst, f"{field} in body should be at least {err.validator_value} chars long")
    if v == "minItems":
        return invalid_cause(field, inst, f"{field} in body should have at least {err.validator_value} items")
    if v == "minimum":
        return invalid_cause(field, inst, f"{field} in body should be greater than or equal to {err.validator_value}")
    if v == "maximum":
        return invalid_cause(field, inst, f"{field} in body should be less than or equal to {err.validator_value}")
    if v == "pattern":
        return invalid_cause(field, inst, f"{field} in body should match '{err.validator_value}'")
    if v == "format":
        return cause("FieldValueTypeInvalid", field, f"Invalid value: {show(inst)}: {field} in body must be of type "
                                                     f"{err.validator_value}: {show(inst)}")
    return invalid_cause(field, inst, err.message)


_ABSENT = object()


def _at(value, keys):
    for k in keys:
        if not isinstance(value, dict) or k not in value:
            return _ABSENT
        value = value[k]
    return value


def _ratcheted(err: jsonschema.ValidationError, new: dict, old: dict) -> bool:
    """Validation ratcheting (on by default since Kubernetes 1.30): an error inside a value that the update left
    unchanged is not reported. Values correlate with the old object through object fields only; atomic lists
    are compared whole, so the walk stops at the first list index. `required` is always reported."""
    if err.validator == "required":
        return False
    keys = []
    for part in err.absolute_path:
        if isinstance(part, int):
            break
        keys.append(part)
    before = _at(old, keys)
    return before is not _ABSENT and before == _at(new, keys)


# kube-openapi checks a value's string, number and list keywords in this order and stops at the first that fails
# (one error per value and group); the groups' errors, and the type, enum and format checks, add up.
_FIRST_ONLY = {k: g for g, keys in (("string", ("maxLength", "minLength", "pattern")),
                                    ("number", ("multipleOf", "maximum", "exclusiveMaximum", "minimum",
                                                "exclusiveMinimum")),
                                    ("array", ("maxItems", "minItems", "uniqueItems")),
                                    ("object", ("maxProperties", "minProperties"))) for k in keys}
_ORDER = {k: i for i, k in enumerate(_FIRST_ONLY)}


def _first_of_each_group(errs: list) -> list:
    seen: dict[tuple, object] = {}
    out = []
    for e in errs:
        group = _FIRST_ONLY.get(e.validator)
        if group is None:
            out.append(e)
            continue
        key = (tuple(e.absolute_path), group)
        if key not in seen or _ORDER[e.validator] < _ORDER[seen[key].validator]:
            seen[key] = e
    return out + list(seen.values())


def schema_problems(obj: dict, schema: dict, old: dict | None = None, *, status_only: bool = False) -> list[dict]:
    """OpenAPI errors of `obj`; with `old` (an update), errors in values it did not change are ratcheted away.
    `status_only`: a write through /status, which kube-apiserver validates against the status schema alone, so
    its messages name fields from there ("conditions[0].status in body ...")."""
    body = {k: v for k, v in obj.items() if k != "metadata"}
    sch = dict(schema)
    if "properties" in sch:
        sch["properties"] = {k: v for k, v in sch["properties"].items() if k != "metadata"}
    if "required" in sch:
        sch["required"] = [r for r in sch["required"] if r != "metadata"]
        if not sch["required"]:
            del sch["required"]
    validator = _validator(json.dumps(sch, sort_keys=True))
    # kube-apiserver's own order is Go map order, not stable; this one is (by path).
    errs = sorted(_first_of_each_group(list(validator.iter_errors(body))),
                  key=lambda e: list(map(str, e.absolute_path)))
    if old is not None:
        errs = [e for e in errs if not _ratcheted(e, body, old)]
    if status_only:
        errs = [e for e in errs if list(e.absolute_path)[:1] == ["status"]]
    return [_error_to_cause(e, "status." if status_only else "") for e in errs]
