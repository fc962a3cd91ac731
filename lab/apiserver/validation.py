"""Validation of objects as kube-apiserver does it: metadata shape for every kind, and for custom resources the
CRD's structural schema (pruning, defaults, OpenAPI checks through jsonschema, CEL x-kubernetes-validations
through celpy), answering 422 Invalid with one cause per failing field."""

from __future__ import annotations

import base64
import binascii
import copy
import ipaddress
import json
import re
from functools import lru_cache

import celpy
import jsonschema

from lab.apiserver import errors
from lab.apiserver.resources import ResourceInfo

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

_SUBDOMAIN_HELP = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                   "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                   "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
_LABEL_HELP = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
               "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
               "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")


def show(value) -> str:
    """A value as kube-apiserver quotes it in `Invalid value: ...`."""
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    if value is None:
        return '"null"'
    return json.dumps(value)


def go_strings(values) -> str:
    """A list of strings as Go's %q prints a []string: `["a" "b"]`."""
    return "[" + " ".join(json.dumps(v) for v in values) + "]"


def cause(reason: str, field: str, message: str) -> dict:
    return {"reason": reason, "message": message, "field": field}


def invalid_cause(field: str, value, detail: str) -> dict:
    return cause("FieldValueInvalid", field, f"Invalid value: {show(value)}: {detail}")


# ---------------------------------------------------------------- metadata (every kind)

def _name_rule(info: ResourceInfo):
    if info.group == "rbac.authorization.k8s.io":
        return "path"
    if info.plural == "namespaces":
        return "label"
    return "subdomain"


def name_problems(info: ResourceInfo, name: str, field: str = "metadata.name") -> list[dict]:
    rule = _name_rule(info)
    if rule == "path":
        if name in (".", "..") or "/" in name or "%" in name:
            return [invalid_cause(field, name, "may not contain '/' or '%' and may not be '.' or '..'")]
        return []
    limit, pattern, helptext = (63, DNS_LABEL, _LABEL_HELP) if rule == "label" else (253, DNS_SUBDOMAIN,
                                                                                    _SUBDOMAIN_HELP)
    out = []
    if len(name) > limit:
        out.append(invalid_cause(field, name, f"must be no more than {limit} characters"))
    if not pattern.match(name):
        out.append(invalid_cause(field, name, helptext))
    return out


def _label_key_problems(key: str, field: str) -> list[dict]:
    prefix, _, name = key.rpartition("/")
    out = []
    if prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
        out.append(invalid_cause(field, key, "prefix part " + _SUBDOMAIN_HELP))
    if not name or len(name) > 63 or not LABEL_NAME.match(name):
        out.append(invalid_cause(field, key, "name part must consist of alphanumeric characters, '-', '_' or '.', "
                                             "and must start and end with an alphanumeric character, "
                                             "at most 63 characters"))
    return out


def metadata_problems(info: ResourceInfo, obj: dict) -> list[dict]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return [cause("FieldValueRequired", "metadata", "Required value: an object needs metadata with a name")]
    out = []
    name = meta.get("name")
    if not name:
        out.append(cause("FieldValueRequired", "metadata.name", "Required value: name or generateName is required"))
    elif not isinstance(name, str):
        out.append(invalid_cause("metadata.name", name, "must be a string"))
    else:
        out += name_problems(info, name)
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        out.append(invalid_cause("metadata.labels", labels, "must be a map of strings"))
    else:
        for k, v in labels.items():
            out += _label_key_problems(k, "metadata.labels")
            if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.match(v):
                out.append(invalid_cause("metadata.labels", v,
                                         "a valid label must be an empty string or consist of alphanumeric "
                                         "characters, '-', '_' or '.', and must start and end with an alphanumeric "
                                         "character, at most 63 characters"))
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict) or not all(isinstance(v, str) for v in annotations.values()):
        out.append(invalid_cause("metadata.annotations", annotations, "must be a map of strings"))
    elif sum(len(k) + len(v) for k, v in annotations.items()) > 256 * 1024:
        out.append(cause("FieldValueTooLong", "metadata.annotations",
                         "Too long: must have at most 262144 bytes"))
    for i, ref in enumerate(meta.get("ownerReferences") or ()):
        for key in ("apiVersion", "kind", "name", "uid"):
            if not isinstance(ref, dict) or not ref.get(key):
                out.append(cause("FieldValueRequired", f"metadata.ownerReferences[{i}].{key}",
                                 "Required value: an owner reference names apiVersion, kind, name and uid"))
    return out


# ---------------------------------------------------------------- structural schema: pruning and defaults

def _preserves(schema: dict) -> bool:
    return bool(schema.get("x-kubernetes-preserve-unknown-fields"))


_EMBEDDED_KEYS = ("apiVersion", "kind", "metadata")


def prune(value, schema: dict, path: str, unknown: list[str], top: bool = False):
    """Drop fields the schema does not declare (recording their paths), as kube-apiserver's pruning does.

    An object where the schema declares no properties (or a scalar) loses every field unless the schema
    preserves unknown fields, exactly as structural pruning treats it.
    """
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        addl = schema.get("additionalProperties")
        if not props and addl is None and _preserves(schema):
            return value
        embedded = top or schema.get("x-kubernetes-embedded-resource")
        out = {}
        for k, v in value.items():
            sub = f"{path}.{k}" if path else k
            if embedded and k in _EMBEDDED_KEYS:
                out[k] = v
            elif k in props:
                out[k] = prune(v, props[k], sub, unknown)
            elif isinstance(addl, dict):
                out[k] = prune(v, addl, sub, unknown)
            elif addl is True or _preserves(schema):
                out[k] = v
            else:
                unknown.append(sub)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(v, schema["items"], f"{path}[{i}]", unknown) for i, v in enumerate(value)]
    return value


def apply_defaults(value, schema: dict):
    """Fill `default`s of absent properties, in place, in every object present in the value."""
    if not isinstance(schema, dict):
        return
    if isinstance(value, dict):
        for k, sub in (schema.get("properties") or {}).items():
            if k not in value and "default" in sub:
                value[k] = copy.deepcopy(sub["default"])
            if k in value:
                apply_defaults(value[k], sub)
        addl = schema.get("additionalProperties")
        if isinstance(addl, dict):
            for v in value.values():
                apply_defaults(v, addl)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for v in value:
            apply_defaults(v, schema["items"])


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


_TYPE_NAMES = {str: "string", bool: "boolean", int: "integer", float: "number", dict: "object", list: "array",
               type(None): "null"}


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
        got = _TYPE_NAMES.get(type(inst), "unknown")
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


# ---------------------------------------------------------------- list types

def list_type_problems(value, schema: dict, field: str = "") -> list[dict]:
    """Duplicates in `x-kubernetes-list-type: set` lists and duplicate keys in `map` lists are 422s."""
    if not isinstance(schema, dict):
        return []
    out = []
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        addl = schema.get("additionalProperties")
        for k, v in value.items():
            sub = props.get(k) if k in props else (addl if isinstance(addl, dict) else None)
            if sub is not None and not (not field and k == "metadata"):
                out += list_type_problems(v, sub, f"{field}.{k}" if field else k)
    elif isinstance(value, list):
        kind = schema.get("x-kubernetes-list-type")
        keys = schema.get("x-kubernetes-list-map-keys") or ()
        seen = set()
        for i, item in enumerate(value):
            if kind == "set":
                marker = json.dumps(item, sort_keys=True)
                if marker in seen:
                    out.append(cause("FieldValueDuplicate", f"{field}[{i}]", f"Duplicate value: {show(item)}"))
                seen.add(marker)
            elif kind == "map" and isinstance(item, dict):
                marker = json.dumps({k: item.get(k) for k in keys}, sort_keys=True)
                if marker in seen:
                    shown = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(item.get(k))}" for k in keys) + "}"
                    out.append(cause("FieldValueDuplicate", f"{field}[{i}]", f"Duplicate value: {shown}"))
                seen.add(marker)
            if isinstance(schema.get("items"), dict):
                out += list_type_problems(item, schema["items"], f"{field}[{i}]")
    return out


# ---------------------------------------------------------------- CEL x-kubernetes-validations

_ENV = celpy.Environment()


_GO_DURATION = re.compile(r"^[-+]?(0|((\d+(\.\d*)?|\.\d+)(ns|us|\u00b5s|ms|s|m|h))+)$")


def _duration(value):
    """CEL's duration() as cel-go parses it (Go's time.ParseDuration: no days), not celpy's wider reading."""
    if isinstance(value, celpy.celtypes.StringType) and not _GO_DURATION.match(str(value)):
        # Raised, not returned: an error value would turn into "no matching overload" in the && around it.
        raise celpy.CELEvalError("type conversion error from 'string' to 'google.protobuf.Duration'")
    return celpy.celtypes.DurationType(value)


@lru_cache(maxsize=1024)
def compile_rule(rule: str):
    """Compile a CEL rule once; a syntax error is the CRD author's to fix, so it is raised."""
    return _ENV.program(_ENV.compile(rule), functions={"duration": _duration})


def rule_problems_of_crd(schema: dict, path: str = "") -> list[str]:
    """Rules in a CRD schema that do not compile, as messages for the CRD's 422."""
    out = []
    if not isinstance(schema, dict):
        return out
    for rule in schema.get("x-kubernetes-validations") or ():
        try:
            compile_rule(rule["rule"])
        except Exception as exc:  # celpy raises its own parse error types
            out.append(f"{path or '<root>'}: rule {rule.get('rule')!r} does not compile: {exc}")
    for k, sub in (schema.get("properties") or {}).items():
        out += rule_problems_of_crd(sub, f"{path}.{k}" if path else k)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            out += rule_problems_of_crd(schema[key], f"{path}[*]")
    return out


_MISSING = object()


def _eval(rule_src: str, self_value, old_value):
    activation = {"self": celpy.json_to_cel(self_value)}
    if old_value is not _MISSING:
        activation["oldSelf"] = celpy.json_to_cel(old_value)
    return compile_rule(rule_src).evaluate(activation)


def _rule_cause(rule: dict, field: str, value, old) -> dict | None:
    src = rule["rule"]
    if "oldSelf" in src and old is _MISSING:
        return None  # a transition rule only applies when there was an old value
    static = rule.get("message") or f"failed rule: {src}"
    try:
        result = _eval(src, value, old)
    except Exception as exc:
        result = exc if isinstance(exc, celpy.CELEvalError) else celpy.CELEvalError(str(exc))
    if isinstance(result, celpy.CELEvalError):
        # kube-apiserver shows the value's type, not the value, for an error while evaluating a rule.
        what = result.args[0] if result.args else result
        return cause("FieldValueInvalid", field, f'Invalid value: "{_TYPE_NAMES.get(type(value), "object")}": '
                                                 f"{what} evaluating rule: {static}")
    if bool(result):
        return None
    message = static
    if rule.get("messageExpression"):
        try:
            m = _eval(rule["messageExpression"], value, old)
            if not isinstance(m, celpy.CELEvalError) and str(m).strip():
                message = str(m)
        except Exception:  # kube-apiserver falls back to the static message the same way
            pass
    if rule.get("fieldPath"):
        field = field + rule["fieldPath"] if field else rule["fieldPath"].lstrip(".")
    reason = rule.get("reason", "FieldValueInvalid")
    if reason == "FieldValueForbidden":
        return cause(reason, field, f"Forbidden: {message}")
    if reason == "FieldValueRequired":
        return cause(reason, field, f"Required value: {message}")
    if reason == "FieldValueDuplicate":
        return cause(reason, field, f"Duplicate value: {message}")
    if isinstance(value, (dict, list)):
        # A failed rule on an object or a list: kube-apiserver leaves the value out of the message.
        return cause("FieldValueInvalid", field, f"Invalid value: {message}")
    return invalid_cause(field, value, message)


def cel_problems(value, schema: dict, old=_MISSING, field: str = "") -> list[dict]:
    if not isinstance(schema, dict):
        return []
    out = []
    for rule in schema.get("x-kubernetes-validations") or ():
        c = _rule_cause(rule, field, value, old)
        if c:
            out.append(c)
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        addl = schema.get("additionalProperties")
        for k, v in value.items():
            sub = props.get(k) if k in props else (addl if isinstance(addl, dict) else None)
            if sub is None or (not field and k == "metadata"):
                continue
            o = old.get(k, _MISSING) if isinstance(old, dict) else _MISSING
            out += cel_problems(v, sub, o, f"{field}.{k}" if field else k)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            # Items correlate with old items only for list-maps and sets; keep transition rules off for items.
            out += cel_problems(v, schema["items"], _MISSING, f"{field}[{i}]")
    return out


def _cel_view(obj: dict) -> dict:
    """What a root rule's `self` holds: the object, with only metadata.name and generateName, as in kube."""
    view = {k: v for k, v in obj.items() if k != "metadata"}
    meta = obj.get("metadata") or {}
    view["metadata"] = {k: meta[k] for k in ("name", "generateName") if k in meta}
    return view


# ---------------------------------------------------------------- the whole check

def decoding_prefix(info: ResourceInfo) -> str:
    """How kube-apiserver begins an error decoding a body: `ClusterPeer in version "v1alpha1" cannot be handled as
    a ClusterPeer: `."""
    return f'{info.kind} in version "{info.version}" cannot be handled as a {info.kind}: '


SKIPPED_RULES = cause("FieldValueInvalid", "<nil>", "Invalid value: null: some validation rules were not checked "
                      "because the object was invalid; correct the existing errors to complete validation")


def _has_rules(schema) -> bool:
    if isinstance(schema, dict):
        return bool(schema.get("x-kubernetes-validations")) or any(_has_rules(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_rules(v) for v in schema)
    return False


# The errors after which kube-apiserver does not run a custom resource's CEL rules (hasBlockingErr): a value
# of the wrong type, size or enum, or a missing one. After any other error the rules run as well.
BLOCKING = {"FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong", "FieldValueTooMany",
            "FieldValueTypeInvalid"}


def blocks_rules(causes: list[dict]) -> bool:
    return any(c.get("reason") in BLOCKING for c in causes)


def validate(info: ResourceInfo, obj: dict, old: dict | None, field_validation: str = "Strict", *,
             status_only: bool = False) -> tuple[dict, list[str]]:
    """Return the object as it will be stored (pruned and defaulted) and warnings; raise 422/400 on failure.

    `obj` is owned by the caller (it is changed in place where that is cheaper).
    """
    warnings: list[str] = []
    name = (obj.get("metadata") or {}).get("name") or (obj.get("metadata") or {}).get("generateName") or ""
    causes = metadata_problems(info, obj)
    if info.custom and info.schema is not None:
        unknown: list[str] = []
        obj = prune(obj, info.schema, "", unknown, top=True)
        if unknown:
            if field_validation == "Strict":
                raise errors.bad_request(f"{decoding_prefix(info)}strict decoding error: " + ", ".join(
                    f'unknown field "{u}"' for u in unknown))
            if field_validation == "Warn":
                warnings += [f'unknown field "{u}"' for u in unknown]
        apply_defaults(obj, info.schema)
        causes += schema_problems(obj, info.schema, old, status_only=status_only)
        causes += list_type_problems(obj, info.schema)
        if not blocks_rules(causes):
            causes += cel_problems(_cel_view(obj), info.schema, _cel_view(old) if old else _MISSING)
        elif _has_rules(info.schema):
            causes.append(dict(SKIPPED_RULES))
    if causes:
        if info.sensitive_paths:
            causes = [_redact(c, obj, info.sensitive_paths) for c in causes]
        raise errors.invalid(info.kind, info.group, name, causes)
    return obj, warnings


def _field_parts(field: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", field)]


def _redact(c: dict, obj: dict, sensitive_paths) -> dict:
    """A cause about a sensitive field never repeats its value (the 422 may reach a log or a user without the
    permission to read it)."""
    parts = _field_parts(c.get("field", ""))
    for pattern in sensitive_paths:
        if len(parts) >= len(pattern) and all(p == "*" or p == q for p, q in zip(pattern, parts)):
            value = obj
            for q in parts:
                try:
                    value = value[q]
                except (KeyError, IndexError, TypeError):
                    value = None
                    break
            if isinstance(value, str) and value:
                return dict(c, message=c["message"].replace(json.dumps(value), '"<omitted>"').replace(
                    value, "<omitted>"))
    return c
