"""OwnerReferencesPermissionEnforcement, the admission plugin Deckhouse's kube-apiserver runs: who changes an
object's ownerReferences must be allowed to delete it (not on create: who could not create it owns nothing), and
who sets a new blockOwnerDeletion must be allowed to update the owner's finalizers. The refusals are 403s in
kube-apiserver's words (its reason, then the authorizer's error, `<nil>`)."""

from __future__ import annotations

from typing import Callable

from lab.apiserver import errors
from lab.apiserver.auth.types import Attributes, Decision
from lab.apiserver.resources import Registry, ResourceInfo


def admit(res: ResourceInfo, obj, old: dict | None, namespace: str | None, registry: Registry,
          authorize: Callable[[Attributes], Decision]) -> None:
    """Raise the 403 for a write of `obj` (replacing `old`, None on create) that its writer may not make."""
    if not isinstance(obj, dict):
        return
    refs = list((obj.get("metadata") or {}).get("ownerReferences") or ())
    old_refs = list(((old or {}).get("metadata") or {}).get("ownerReferences") or ())
    if refs == old_refs:
        return
    name = (obj.get("metadata") or {}).get("name") or ""
    ns = (namespace or "") if res.namespaced else ""

    def refuse(why: str) -> errors.ApiError:
        return errors.ApiError(403, "Forbidden", f'{errors.resource_label(res.group, res.plural)} "{name}" is '
                                                 f"forbidden: {why}", errors.details(name, res.group, res.plural))

    if old is not None:
        decision = authorize(Attributes(verb="delete", resource_request=True, api_group=res.group,
                                        resource=res.plural, namespace=ns, name=name))
        if not decision.allowed:
            raise refuse(f"cannot set an ownerRef on a resource you can't delete: {decision.reason}, <nil>")
    blocking_before = [r for r in old_refs if r.get("blockOwnerDeletion")]
    for ref in refs:
        if not ref.get("blockOwnerDeletion") or ref in blocking_before:
            continue
        owner = registry.by_kind(ref.get("apiVersion", ""), ref.get("kind", ""))
        if owner is None:
            raise refuse("cannot set blockOwnerDeletion in this case because cannot find RESTMapping for "
                         f"APIVersion {ref.get('apiVersion')} Kind {ref.get('kind')}")
        decision = authorize(Attributes(verb="update", resource_request=True, api_group=owner.group,
                                        resource=owner.plural, subresource="finalizers",
                                        namespace=ns if owner.namespaced else "", name=ref.get("name", "")))
        if not decision.allowed:
            raise refuse("cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set "
                         f"finalizers on: {decision.reason}, <nil>")
