"""Sensitive CRD fields: Deckhouse's kube-apiserver hides fields marked `x-kubernetes-sensitive-data: true`.

A reader without the `<resource>/sensitive` permission for the same verb gets `"<omitted>"` in place of each such
value; a writer that sends `"<omitted>"` back keeps the stored value, so a read-modify-write by such a user never
wipes a secret it could not see. These are pure functions over plain dicts; the core decides when to apply them.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from lab.apiserver.auth.types import Attributes

OMITTED = "<omitted>"
SENSITIVE_SUBRESOURCE = "sensitive"
# A path step that stands for every element of an array or every value of a map (additionalProperties).
ANY = "*"
_MISSING = object()

Path = tuple[str, ...]


def sensitive_paths(openapi_v3_schema: dict) -> list[Path]:
    """Paths of the properties marked `x-kubernetes-sensitive-data: true`, e.g. `("spec", "join", "connectionString")`.

    Array items and map values are walked too and appear as the step `"*"`. A marked object or array is one path:
    the whole value is hidden.
    """
    found: list[Path] = []

    def walk(schema: Any, path: Path) -> None:
        if not isinstance(schema, dict):
            return
        if path and schema.get("x-kubernetes-sensitive-data") is True:
            found.append(path)
            return
        for name, sub in (schema.get("properties") or {}).items():
            walk(sub, path + (name,))
        if isinstance(schema.get("items"), dict):
            walk(schema["items"], path + (ANY,))
        if isinstance(schema.get("additionalProperties"), dict):
            walk(schema["additionalProperties"], path + (ANY,))
        for combinator in ("allOf", "anyOf", "oneOf"):
            for sub in schema.get(combinator) or ():
                walk(sub, path)

    walk(openapi_v3_schema, ())
    # Combinators can name the same property twice; keep the first occurrence's order.
    return list(dict.fromkeys(found))


def _expand(obj: Any, steps: Path) -> list[list[Any]]:
    """Concrete key/index paths that a pattern reaches in obj; the final key may be absent from its container."""
    paths: list[list[Any]] = [[]]
    nodes: list[Any] = [obj]
    for depth, step in enumerate(steps):
        last = depth == len(steps) - 1
        next_paths: list[list[Any]] = []
        next_nodes: list[Any] = []
        for trail, node in zip(paths, nodes):
            if step == ANY:
                if isinstance(node, dict):
                    keys: list[Any] = list(node)
                elif isinstance(node, list):
                    keys = list(range(len(node)))
                else:
                    keys = []
            elif isinstance(node, dict) and (step in node or last):
                keys = [step]
            else:
                keys = []
            for k in keys:
                next_paths.append(trail + [k])
                next_nodes.append(_get(node, k))
        paths, nodes = next_paths, next_nodes
    return paths


def _get(container: Any, key: Any) -> Any:
    if isinstance(container, dict):
        return container.get(key, _MISSING)
    if isinstance(container, list) and isinstance(key, int) and 0 <= key < len(container):
        return container[key]
    return _MISSING


def _lookup(obj: Any, keys: list[Any]) -> Any:
    node = obj
    for k in keys:
        node = _get(node, k)
        if node is _MISSING:
            return _MISSING
    return node


def _parent(obj: Any, keys: list[Any]) -> Any:
    return _lookup(obj, keys[:-1])



def mask(obj: dict, paths: list[Path]) -> dict:
    """A copy of obj with each present, non-null value at a sensitive path replaced by `"<omitted>"`."""
    out = copy.deepcopy(obj)
    for pattern in paths:
        for keys in _expand(out, pattern):
            value = _lookup(out, keys)
            if value is not _MISSING and value is not None:
                _parent(out, keys)[keys[-1]] = OMITTED
    return out


def restore(new_obj: dict, stored_obj: dict | None, paths: list[Path]) -> dict:
    """A copy of new_obj where each `"<omitted>"` at a sensitive path takes the stored value.

    Where the stored object has no value there (it was removed since the writer read it), the field is dropped
    (an array element becomes null): the writer never saw a value, so it cannot mean to set one, and the marker
    must never be stored as data. Array elements are matched by index, as the masked read gave them out.
    """
    out = copy.deepcopy(new_obj)
    for pattern in paths:
        for keys in _expand(out, pattern):
            if _lookup(out, keys) != OMITTED:
                continue
            parent = _parent(out, keys)
            stored = _lookup(stored_obj, keys) if stored_obj is not None else _MISSING
            if stored is not _MISSING and stored is not None and stored != OMITTED:
                parent[keys[-1]] = copy.deepcopy(stored)
            elif isinstance(parent, dict):
                del parent[keys[-1]]
            else:
                parent[keys[-1]] = None
    return out


def sensitive_attributes(attrs: Attributes) -> Attributes:
    """The request the core must authorize to show sensitive values: same verb, on `<resource>/sensitive`."""
    return replace(attrs, subresource=SENSITIVE_SUBRESOURCE)
