"""The causes of a 422 as kube-apiserver words them: a value as it quotes it, Go's way of printing a list of
strings, and the name patterns its messages cite."""

from __future__ import annotations

import json
import re


DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


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

TYPE_NAMES = {str: "string", bool: "boolean", int: "integer", float: "number", dict: "object", list: "array",
               type(None): "null"}
