"""The one way the control loop makes an API object match what it wants (controller-runtime's CreateOrUpdate).

`create_or_update(kube, resource, desired, current=...)` creates the object when it does not exist; otherwise it
lays `desired` over the current object (labels and annotations merged, owner references and every other field
`desired` names replaced, fields the API never lets change kept) and writes the result with the current
resourceVersion as its precondition, or writes nothing at all when the result equals the current object. A
concurrent writer makes it raise the API's `Conflict` (`AlreadyExists` for a create): the caller reads again, or
requeues. An object being deleted is left alone; it is created again once it is gone.

`current` is what the caller already knows (an informer's copy, or None for "does not exist"); `READ` asks the
API server first.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from control.kube import KubeSession, Resource

READ: Any = object()
"""`current=READ`: read the object from the API server before deciding."""

#: Top-level fields that the API server refuses to change once set (a Secret's type): the current value stays.
IMMUTABLE = ("type",)
#: What `desired` never sets: the server's bookkeeping and the status subresource.
NOT_DESIRED = ("apiVersion", "kind", "metadata", "status")

CREATED, UPDATED, UNCHANGED, DELETING = "created", "updated", "unchanged", "deleting"


@dataclasses.dataclass(frozen=True)
class Applied:
    """What `create_or_update` did, and the object as the API server holds it now."""

    op: str  # CREATED, UPDATED, UNCHANGED or DELETING (nothing written: it is on its way out)
    obj: dict

    @property
    def wrote(self) -> bool:
        return self.op in (CREATED, UPDATED)


def merged(current: dict, desired: dict) -> dict:
    """`current` changed as far as `desired` says (pure)."""
    out = copy.deepcopy(current)
    meta = out.setdefault("metadata", {})
    want = desired.get("metadata") or {}
    for key in ("labels", "annotations"):
        if want.get(key):
            meta[key] = {**(meta.get(key) or {}), **want[key]}
    if "ownerReferences" in want:
        meta["ownerReferences"] = copy.deepcopy(want["ownerReferences"])
    for key, value in desired.items():
        if key in NOT_DESIRED or (key in IMMUTABLE and out.get(key)):
            continue
        out[key] = copy.deepcopy(value)
    return out


async def create_or_update(kube: KubeSession, resource: Resource, desired: dict, *,
                           current: dict | None = READ) -> Applied:
    """Make the object `desired` names match it, writing only a difference (see the module docstring)."""
    meta = desired.get("metadata") or {}
    if current is READ:
        current = await kube.get_or_none(resource, meta["name"], meta.get("namespace") if resource.namespaced
                                         else None)
    if current is None:
        return Applied(CREATED, await kube.create(resource, desired))
    if (current.get("metadata") or {}).get("deletionTimestamp"):
        return Applied(DELETING, current)
    want = merged(current, desired)
    if want == current:
        return Applied(UNCHANGED, current)
    return Applied(UPDATED, await kube.update(resource, want))
