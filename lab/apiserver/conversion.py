"""Conversion between the served versions of a custom resource, as kube-apiserver does it with conversion
strategy None (no webhook): the same object under the other apiVersion, pruned to the fields that version's
schema declares.

Objects are stored in the CRD's storage version (pruned to its schema); every read, watch event and write
answer is converted to the version the client asked for, and a write starts from the stored object converted
to the version it is written through. So a field one version lacks is lost when the object is written through
that version, exactly as on a real cluster (multitenancy-manager's Project documents this for v1alpha2 and
v1alpha3). Built-ins and single-version resources pass through unchanged.
"""

from __future__ import annotations

import copy

from lab.apiserver import validation
from lab.apiserver.resources import ResourceInfo


def _convert(obj: dict, group_version: str, schema: dict | None) -> dict:
    out = copy.deepcopy(obj)
    out["apiVersion"] = group_version
    if schema is not None:
        out = validation.prune(out, schema, "", [], top=True)
    return out


def to_storage(info: ResourceInfo, obj: dict) -> dict:
    """The object as it is stored: the storage version, pruned to its schema."""
    if not info.converts:
        return obj
    storage_gv = f"{info.group}/{info.storage_version}"
    return _convert(obj, storage_gv, info.storage_schema)


def to_version(info: ResourceInfo, obj: dict) -> dict:
    """A stored object as the version of `info` shows it; the stored dict itself when nothing changes."""
    if not info.custom or obj.get("apiVersion") in (None, info.group_version):
        return obj
    return _convert(obj, info.group_version, info.schema)
