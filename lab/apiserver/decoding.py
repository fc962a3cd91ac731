"""Decoding a create's or update's JSON body as kube-apiserver's strict decoder does: a field named twice is an
error under Strict field validation and a warning under Warn (the last value wins either way)."""

from __future__ import annotations

import json

from lab.apiserver import errors, validation
from lab.apiserver.resources import ResourceInfo


class Body(dict):
    """A decoded object with the warnings its decoding gave."""

    def __init__(self, obj: dict, warnings: list[str]) -> None:
        super().__init__(obj)
        self._warnings = list(warnings)

    def pop_warnings(self) -> list[str]:
        out, self._warnings = self._warnings, []
        return out


class _Pairs(dict):
    """A JSON object as decoded, with the keys it named more than once."""

    repeated: tuple[str, ...] = ()


def _pairs_hook(pairs):
    obj = _Pairs(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        obj.repeated = tuple(dict.fromkeys(k for k, _ in pairs if k in seen or seen.add(k)))
    return obj


def _duplicate_paths(value, path: str = "") -> list[str]:
    out = []
    if isinstance(value, dict):
        out += [f"{path}.{k}" if path else k for k in getattr(value, "repeated", ())]
        for k, v in value.items():
            out += _duplicate_paths(v, f"{path}.{k}" if path else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _duplicate_paths(v, f"{path}[{i}]")
    return out


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def strict_json(raw: bytes, res: ResourceInfo, field_validation: str) -> Body | None:
    """The object in `raw`, or None when `raw` is not a JSON object (the caller's own decoding says why)."""
    try:
        body = json.loads(raw, object_pairs_hook=_pairs_hook)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    found = [f'duplicate field "{d}"' for d in _duplicate_paths(body)]
    if found and field_validation == "Strict":
        raise errors.bad_request(f"{validation.decoding_prefix(res)}strict decoding error: " + ", ".join(found))
    return Body(_plain(body), found if field_validation == "Warn" else [])
