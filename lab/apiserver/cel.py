"""CEL x-kubernetes-validations of the emulator's CRD schemas, as kube-apiserver evaluates them (cel-go's
readings where celpy's are wider), and when they are skipped."""

from __future__ import annotations

import re
from functools import lru_cache

import celpy

from lab.apiserver.causes import TYPE_NAMES, cause, invalid_cause


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


MISSING = object()


def _eval(rule_src: str, self_value, old_value):
    activation = {"self": celpy.json_to_cel(self_value)}
    if old_value is not MISSING:
        activation["oldSelf"] = celpy.json_to_cel(old_value)
    return compile_rule(rule_src).evaluate(activation)


def _rule_cause(rule: dict, field: str, value, old) -> dict | None:
    src = rule["rule"]
    if "oldSelf" in src and old is MISSING:
        return None  # a transition rule only applies when there was an old value
    static = rule.get("message") or f"failed rule: {src}"
    try:
        result = _eval(src, value, old)
    except Exception as exc:
        result = exc if isinstance(exc, celpy.CELEvalError) else celpy.CELEvalError(str(exc))
    if isinstance(result, celpy.CELEvalError):
        # kube-apiserver shows the value's type, not the value, for an error while evaluating a rule.
        what = result.args[0] if result.args else result
        return cause("FieldValueInvalid", field, f'Invalid value: "{TYPE_NAMES.get(type(value), "object")}": '
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


def cel_problems(value, schema: dict, old=MISSING, field: str = "") -> list[dict]:
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
            o = old.get(k, MISSING) if isinstance(old, dict) else MISSING
            out += cel_problems(v, sub, o, f"{field}.{k}" if field else k)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            # Items correlate with old items only for list-maps and sets; keep transition rules off for items.
            out += cel_problems(v, schema["items"], MISSING, f"{field}[{i}]")
    return out


def cel_view(obj: dict) -> dict:
    """What a root rule's `self` holds: the object, with only metadata.name and generateName, as in kube."""
    view = {k: v for k, v in obj.items() if k != "metadata"}
    meta = obj.get("metadata") or {}
    view["metadata"] = {k: meta[k] for k in ("name", "generateName") if k in meta}
    return view


# ---------------------------------------------------------------- the whole check


SKIPPED_RULES = cause("FieldValueInvalid", "<nil>", "Invalid value: null: some validation rules were not checked "
                      "because the object was invalid; correct the existing errors to complete validation")


def has_rules(schema) -> bool:
    if isinstance(schema, dict):
        return bool(schema.get("x-kubernetes-validations")) or any(has_rules(v) for v in schema.values())
    if isinstance(schema, list):
        return any(has_rules(v) for v in schema)
    return False


# The errors after which kube-apiserver does not run a custom resource's CEL rules (hasBlockingErr): a value
# of the wrong type, size or enum, or a missing one. After any other error the rules run as well.
BLOCKING = {"FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong", "FieldValueTooMany",
            "FieldValueTypeInvalid"}


def blocks_rules(causes: list[dict]) -> bool:
    return any(c.get("reason") in BLOCKING for c in causes)
