"""Validation of objects as kube-apiserver does it: metadata shape for every kind, and for custom resources the
CRD's structural schema (pruning, defaults, OpenAPI checks through jsonschema, CEL x-kubernetes-validations
through celpy), answering 422 Invalid with one cause per failing field."""

from __future__ import annotations

import copy
import json
import re


from lab.apiserver import errors
from lab.apiserver.resources import ResourceInfo
from lab.apiserver.cel import MISSING, SKIPPED_RULES, blocks_rules, cel_problems, cel_view, has_rules
from lab.apiserver.causes import DNS_LABEL, DNS_SUBDOMAIN, LABEL_NAME, LABEL_VALUE, cause, invalid_cause, show
from lab.apiserver.openapi import schema_problems


_SUBDOMAIN_HELP = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                   "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                   "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
_LABEL_HELP = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
               "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
               "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")



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


def decoding_prefix(info: ResourceInfo) -> str:
    """How kube-apiserver begins an error decoding a body: `ClusterPeer in version "v1alpha1" cannot be handled as
    a ClusterPeer: `."""
    return f'{info.kind} in version "{info.version}" cannot be handled as a {info.kind}: '

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
            causes += cel_problems(cel_view(obj), info.schema, cel_view(old) if old else MISSING)
        elif has_rules(info.schema):
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
