"""Label and field selectors: parsed once per request into plain predicates over object dicts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from lab.apiserver.errors import bad_request

_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        return not present


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside the parentheses of an `in (...)` set."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _check_key(key: str, selector: str) -> str:
    if not _KEY.match(key) or len(key.split("/")[-1]) > 63:
        raise bad_request(f'unable to parse requirement: invalid label key "{key}" in selector "{selector}": '
                          "a label key is an optional DNS prefix and '/' then a name of letters, digits, '-', '_', '.'")
    return key


def parse_label_selector(selector: str | None) -> tuple[Requirement, ...]:
    """Parse `a=b,c!=d,e in (f,g),h notin (i),j,!k` as kube-apiserver does; 400 on malformed input."""
    if not selector or not selector.strip():
        return ()
    reqs = []
    for part in _split_top_level(selector):
        m = re.match(r"^(\S+)\s+(in|notin)\s*\((.*)\)$", part)
        if m:
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(_check_key(m.group(1), selector), m.group(2), values))
            continue
        if part.startswith("!"):
            reqs.append(Requirement(_check_key(part[1:].strip(), selector), "!exists"))
            continue
        for op, norm in (("!=", "!="), ("==", "="), ("=", "=")):
            if op in part:
                key, value = part.split(op, 1)
                reqs.append(Requirement(_check_key(key.strip(), selector), norm, (value.strip(),)))
                break
        else:
            reqs.append(Requirement(_check_key(part, selector), "exists"))
    return tuple(reqs)


def label_predicate(selector: str | None) -> Callable[[dict], bool] | None:
    reqs = parse_label_selector(selector)
    if not reqs:
        return None

    def match(obj: dict) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(r.matches(labels) for r in reqs)

    return match


def _field_value(obj: dict, path: str) -> str | None:
    cur = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    if cur is None:
        return ""
    return cur if isinstance(cur, str) else str(cur)


# Fields every resource supports; built-ins add a few of their own (kube-apiserver rejects the rest).
_COMMON_FIELDS = {"metadata.name", "metadata.namespace"}
_EXTRA_FIELDS = {
    ("", "secrets"): {"type"},
    ("", "events"): {"involvedObject.kind", "involvedObject.name", "involvedObject.namespace",
                     "involvedObject.uid", "reason", "type", "source"},
    ("", "namespaces"): {"status.phase"},
}


def field_predicate(selector: str | None, group: str = "", plural: str = "",
                    custom: bool = False) -> Callable[[dict], bool] | None:
    """Parse `metadata.name=x,metadata.namespace!=y`; an unsupported field is a 400 like kube-apiserver's (whose
    words differ between custom resources and built-ins)."""
    if not selector or not selector.strip():
        return None
    allowed = _COMMON_FIELDS | _EXTRA_FIELDS.get((group, plural), set())
    reqs: list[tuple[str, bool, str]] = []
    for part in _split_top_level(selector):
        for op, positive in (("!=", False), ("==", True), ("=", True)):
            if op in part:
                key, value = part.split(op, 1)
                key = key.strip()
                if key not in allowed and custom:
                    raise bad_request(f'field label not supported: {key}')
                if key not in allowed:
                    known = ", ".join(f'"{f}"' for f in sorted(allowed))
                    raise bad_request(f'"{key}" is not a known field selector: only {known}')
                reqs.append((key, positive, value.strip()))
                break
        else:
            raise bad_request(f"invalid selector: '{selector}'; can't understand '{part}'")

    def match(obj: dict) -> bool:
        return all((_field_value(obj, k) == v) == positive for k, positive, v in reqs)

    return match
