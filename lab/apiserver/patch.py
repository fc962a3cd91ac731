"""The patch formats kube-apiserver accepts, as pure functions over JSON values:
JSON merge patch (RFC 7386), JSON patch (RFC 6902), the part of strategic merge patch `kubectl apply` sends for the
kinds served here, and server-side apply with the fields each manager applied."""

from __future__ import annotations

import copy

from lab.apiserver.errors import ApiError

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY_YAML = "application/apply-patch+yaml"
APPLY_CBOR = "application/apply-patch+cbor"


def _bad(message: str) -> ApiError:
    # kube-apiserver answers a patch that does not apply to the object with 422, as this does.
    return ApiError(422, "Invalid", message, {})


# ---------------------------------------------------------------- JSON merge patch

def merge_patch(target, patch):
    """RFC 7386: objects merge key by key, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# ---------------------------------------------------------------- JSON patch

def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise _bad(f'the JSON patch path "{path}" must start with "/"')
    return [_unescape(t) for t in path[1:].split("/")]


def _index(container: list, token: str, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise _bad(f'the JSON patch index "{token}" is not a non-negative integer')
    i = int(token)
    if i > len(container) or (i == len(container) and not allow_end):
        raise _bad(f"the JSON patch index {i} is out of bounds for an array of {len(container)}")
    return i


def _walk(doc, tokens: list[str], path: str):
    """The value the tokens lead to; an error naming `path` when a step does not exist."""
    cur = doc
    for t in tokens:
        if isinstance(cur, dict) and t in cur:
            cur = cur[t]
        elif isinstance(cur, list):
            cur = cur[_index(cur, t, False)]
        else:
            raise _bad(f'the JSON patch path "{path}" does not exist in the object')
    return cur


def _parent(doc, tokens: list[str], path: str):
    return _walk(doc, tokens[:-1], path)


def _get(doc, path: str):
    return _walk(doc, _pointer(path), path)


def _remove(doc, path: str):
    tokens = _pointer(path)
    if not tokens:
        raise _bad("the JSON patch cannot remove the whole object")
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _bad(f'the JSON patch path "{path}" does not exist in the object: nothing to remove')
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, False))
    raise _bad(f'the JSON patch path "{path}" does not exist in the object')


def _add(doc, path: str, value):
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, True), value)
    else:
        raise _bad(f'the JSON patch path "{path}" does not exist in the object')
    return doc


def json_patch(target, operations):
    """RFC 6902 on a copy of target; a failed `test` or a missing path is a 400 naming the operation."""
    if not isinstance(operations, list):
        raise _bad("a JSON patch is an array of operations like "
                   '[{"op": "replace", "path": "/spec/x", "value": 1}]')
    doc = copy.deepcopy(target)
    for i, op in enumerate(operations):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise _bad(f"JSON patch operation {i} needs 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise _bad(f"JSON patch operation {i} ({kind} {path}) needs a 'value'")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            tokens = _pointer(path)
            if not tokens:
                doc = copy.deepcopy(op["value"])
            else:
                parent = _parent(doc, tokens, path)
                if isinstance(parent, list):
                    parent[_index(parent, tokens[-1], False)] = copy.deepcopy(op["value"])
                else:
                    parent[tokens[-1]] = copy.deepcopy(op["value"])
        elif kind == "move":
            value = _remove(doc, op.get("from", ""))
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op.get("from", ""))))
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise ApiError(422, "Invalid", f'the JSON patch test of "{path}" failed: the value differs', {})
        else:
            raise _bad(f'JSON patch operation {i} has an unknown op "{kind}"')
    return doc


# ---------------------------------------------------------------- strategic merge patch

# Lists that merge by a key instead of being replaced, for the kinds this server stores
# (patchMergeKey of the Go types); a key of None merges a list of scalars as a set.
MERGE_LISTS: dict[tuple[str, ...], str | None] = {
    ("metadata", "ownerReferences"): "uid",
    ("metadata", "finalizers"): None,
    ("secrets",): "name",
    ("imagePullSecrets",): "name",
    ("spec", "finalizers"): None,
}


def strategic_merge_patch(target, patch, path: tuple[str, ...] = ()):
    """Strategic merge: like a merge patch, plus the directives kubectl sends ($patch, $retainKeys,
    $setElementOrder, $deleteFromPrimitiveList) and keyed merging of the lists above."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    out = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for k, v in patch.items():
        if k.startswith("$setElementOrder/") or k in ("$retainKeys", "$patch"):
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            field = k.split("/", 1)[1]
            if isinstance(out.get(field), list):
                out[field] = [x for x in out[field] if x not in v]
            continue
        sub = path + (k,)
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and sub in MERGE_LISTS and isinstance(out.get(k), list):
            out[k] = _merge_list(out[k], v, MERGE_LISTS[sub])
        elif isinstance(v, dict):
            merged = strategic_merge_patch(out.get(k), v, sub)
            if merged is None:
                out.pop(k, None)
            else:
                out[k] = merged
        else:
            out[k] = copy.deepcopy(v)
    if isinstance(retain, list):
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _merge_list(current: list, patch: list, key: str | None) -> list:
    if key is None:
        return list(current) + [x for x in patch if x not in current]
    out = list(current)
    for item in patch:
        if not isinstance(item, dict):
            continue
        idx = next((i for i, c in enumerate(out) if isinstance(c, dict) and c.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
        elif idx is None:
            out.append({k: v for k, v in item.items() if not k.startswith("$")})
        else:
            out[idx] = strategic_merge_patch(out[idx], item)
    return out


# ---------------------------------------------------------------- server-side apply

def _fields_removed(previous, applied):
    """The parts of a manager's previous apply that its new apply no longer names (as a merge patch of nulls)."""
    if not isinstance(previous, dict) or not isinstance(applied, dict):
        return None
    out = {}
    for k, v in previous.items():
        if isinstance(v, dict) and v and isinstance(applied.get(k, {}), dict):
            # Ownership is per field: only the leaves this manager set go, others' keys in the map stay.
            sub = _fields_removed(v, applied.get(k, {}))
            if sub:
                out[k] = sub
        elif k not in applied:
            out[k] = None
    return out


def server_side_apply(live: dict | None, applied: dict, previous: dict | None) -> dict:
    """Merge an applied configuration into the live object: the fields named in `applied` take its values
    (lists are atomic), fields this manager applied before and dropped now are removed, others' fields stay."""
    base = live or {}
    removals = _fields_removed(previous, applied) or {}
    for meta_key in ("name", "namespace", "uid", "resourceVersion"):
        (removals.get("metadata") or {}).pop(meta_key, None)
    merged = merge_patch(base, removals) if removals else dict(base)
    return _apply_merge(merged, applied)


def _apply_merge(target, applied):
    if not isinstance(applied, dict) or not isinstance(target, dict):
        return copy.deepcopy(applied)
    out = dict(target)
    for k, v in applied.items():
        out[k] = _apply_merge(out.get(k), v) if isinstance(v, dict) else copy.deepcopy(v)
    return out


# Fields an apply never conflicts on: they name the object rather than set it.
_IDENTITY = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace"),
             ("metadata", "resourceVersion"), ("metadata", "uid")}


def leaf_paths(config, prefix: tuple = ()) -> dict[tuple, object]:
    """The fields an applied configuration sets: maps are walked, lists and scalars are leaves (atomic)."""
    out: dict[tuple, object] = {}
    if isinstance(config, dict) and config:
        for k, v in config.items():
            out.update(leaf_paths(v, prefix + (k,)))
    elif prefix and prefix not in _IDENTITY:
        out[prefix] = config
    return out


def _value_at(obj, path: tuple):
    cur = obj
    for part in path:
        if not isinstance(cur, dict) or part not in cur:
            return _ABSENT
        cur = cur[part]
    return cur


_ABSENT = object()


def apply_conflicts(live: dict, applied: dict, others: dict[str, dict]) -> list[tuple[str, str]]:
    """(field, manager) for each field the apply would change that another manager applied: kube-apiserver
    refuses such an apply with 409 unless it is forced."""
    out = []
    for path, value in leaf_paths(applied).items():
        if _value_at(live, path) == value:
            continue
        for manager, config in sorted(others.items()):
            if path in leaf_paths(config):
                out.append(("." + ".".join(path), manager))
    return out


def drop_fields(config: dict, fields: list[str]) -> dict:
    """A manager's applied configuration without the fields another manager took over by force; maps left
    empty by that go too (they held only the fields taken over)."""
    out = copy.deepcopy(config)
    for field in fields:
        parts = field.lstrip(".").split(".")
        chain = [out]
        for part in parts[:-1]:
            nxt = chain[-1].get(part) if isinstance(chain[-1], dict) else None
            if not isinstance(nxt, dict):
                break
            chain.append(nxt)
        else:
            chain[-1].pop(parts[-1], None)
            for depth in range(len(chain) - 1, 0, -1):
                if chain[depth]:
                    break
                chain[depth - 1].pop(parts[depth - 1], None)
    return out
