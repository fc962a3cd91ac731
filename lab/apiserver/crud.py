"""Create, update and delete with kube-apiserver's semantics, over the store and without HTTP or auth:
uid, creationTimestamp, generateName, resourceVersion preconditions (409), generation bumps on spec changes of
custom resources, the status subresource, finalizers and deletionTimestamp, sensitive-field restore on write,
schema validation, and the per-kind rules of the built-ins (namespaces, secrets, CRDs)."""

from __future__ import annotations

import base64
import json
import secrets
import uuid
from datetime import datetime, timezone

from lab.apiserver import cel, conversion, errors, events, validation
from lab.apiserver.auth import sensitive
from lab.apiserver.resources import Registry, ResourceInfo, resources_of_crd
from lab.apiserver.store import Store
from lab.apiserver.kinds import check_base64, lease_rules, rbac_rules

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"   # kube's utilrand alphabet: no vowels, no look-alikes
CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACE_KEY = ("", "namespaces")
FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
NAMESPACE_FINALIZER = "kubernetes"
# The namespaces that NamespaceLifecycle never lets go.
IMMORTAL_NAMESPACES = ("default", "kube-system", "kube-public")
_SERVER_META = ("uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds",
                "selfLink")


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_part(info: ResourceInfo, obj: dict) -> dict:
    """What a generation bump compares: everything but metadata (and status, when it is a subresource)."""
    return {k: v for k, v in obj.items() if k != "metadata" and not (k == "status" and info.has_status)}


class Objects:
    """The write paths of the API server. Callers hand in dicts they own; stored dicts are never mutated."""

    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry

    # ------------------------------------------------------------ helpers

    def _check_namespace(self, info: ResourceInfo, namespace: str | None, creating: bool, name: str = "") -> None:
        if not info.namespaced:
            return
        if not namespace:
            raise errors.bad_request(f"{info.plural} is namespaced: the request must name a namespace")
        ns = self.store.get(NAMESPACE_KEY, None, namespace)
        if ns is None:
            raise errors.not_found("", "namespaces", namespace)
        if creating and ns["metadata"].get("deletionTimestamp"):
            raise errors.ApiError(
                403, "Forbidden",
                f'{errors.resource_label(info.group, info.plural)} "{name}" is forbidden: unable to create new '
                f"content in namespace {namespace} because it is being terminated",
                errors.details(name, info.group, info.plural, causes=[{
                    "reason": "NamespaceTerminating", "message": f"namespace {namespace} is being terminated",
                    "field": "metadata.namespace"}]))

    def _normalise(self, info: ResourceInfo, obj: dict, namespace: str | None) -> dict:
        if not isinstance(obj, dict):
            raise errors.bad_request("the body must be a JSON object (a Kubernetes object with apiVersion, kind "
                                     "and metadata)")
        api_version = obj.get("apiVersion") or info.group_version
        kind = obj.get("kind") or info.kind
        if kind != info.kind and info.custom and api_version.rpartition("/")[0] == info.group:
            # A custom resource's body of another kind of the same group is decoded, then refused by validation.
            name = (obj.get("metadata") or {}).get("name") or ""
            raise errors.invalid(kind, info.group, name, [validation.invalid_cause(
                "kind", kind, f"must be {info.kind}")])
        if kind != info.kind or api_version.rpartition("/")[0] != info.group:
            raise errors.bad_request(
                f"the body is a {kind} of {api_version} but the URL is for {info.kind} of {info.group_version}: "
                "send the object to the URL of its own resource")
        obj["apiVersion"], obj["kind"] = info.group_version, info.kind
        meta = obj.get("metadata")
        if meta is None:
            meta = {}
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        meta = dict(meta)
        if info.namespaced:
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise errors.bad_request("the namespace of the provided object does not match the namespace sent "
                                         "on the request")
            if namespace:
                meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        meta.pop("managedFields", None)
        # ObjectMeta's maps and lists are omitempty: kube-apiserver stores and answers no empty one.
        for key in ("labels", "annotations", "finalizers", "ownerReferences"):
            if key in meta and meta[key] in ({}, [], None):
                del meta[key]
        obj["metadata"] = meta
        if info.storage == events.CORE_KEY:
            obj = events.to_core(obj)
        return obj

    def _kind_rules(self, info: ResourceInfo, obj: dict, old: dict | None) -> dict:
        """Per-kind behaviour of the built-ins that the module relies on."""
        key = info.key
        if key == ("", "secrets"):
            obj.setdefault("type", "Opaque")
            data = dict(obj.get("data") or {})
            check_base64("Secret", data)
            for k, v in (obj.pop("stringData", None) or {}).items():
                data[k] = base64.b64encode(str(v).encode()).decode()
            if data or "data" in obj:
                obj["data"] = data
            name = obj["metadata"].get("name", "")
            if obj["type"] == "kubernetes.io/tls":
                missing = [k for k in ("tls.crt", "tls.key") if k not in data]
                if missing:
                    raise errors.invalid("Secret", "", name, [validation.cause(
                        "FieldValueRequired", f"data[{k}]",
                        "Required value: a kubernetes.io/tls Secret holds tls.crt and tls.key") for k in missing])
            if old is not None and old.get("type", "Opaque") != obj["type"]:
                raise errors.invalid("Secret", "", name, [validation.invalid_cause(
                    "type", obj["type"], "field is immutable")])
            if old is not None and old.get("immutable") and (obj.get("data") != old.get("data")):
                raise errors.invalid("Secret", "", obj["metadata"]["name"], [
                    validation.cause("FieldValueForbidden", "data", "Forbidden: field is immutable when "
                                     "`immutable` is set")])
        elif key == events.CORE_KEY:
            # Unset times and source are answered as null and {} (core names; events.k8s.io shows them renamed).
            obj.setdefault("firstTimestamp", None)
            obj.setdefault("lastTimestamp", None)
            obj.setdefault("source", {})
        elif key == ("", "configmaps"):
            check_base64("ConfigMap", obj.get("binaryData") or {})
        elif key == ("coordination.k8s.io", "leases"):
            lease_rules(obj)
        elif key[0] == "rbac.authorization.k8s.io":
            rbac_rules(info, obj, old)
        elif key == NAMESPACE_KEY:
            spec = dict(obj.get("spec") or {})
            spec.setdefault("finalizers", [NAMESPACE_FINALIZER])
            obj["spec"] = spec
            status = dict(obj.get("status") or {})
            status["phase"] = "Terminating" if obj["metadata"].get("deletionTimestamp") else "Active"
            obj["status"] = status
            labels = dict(obj["metadata"].get("labels") or {})
            labels["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
            obj["metadata"]["labels"] = labels
        elif key == CRD_KEY:
            obj = self._crd_rules(obj, old)
        return obj

    def _crd_rules(self, obj: dict, old: dict | None) -> dict:
        name = obj["metadata"].get("name", "")
        spec = obj.get("spec") or {}
        names = spec.get("names") or {}
        causes = []
        for f in ("group", "names", "scope", "versions"):
            if not spec.get(f):
                causes.append(validation.cause("FieldValueRequired", f"spec.{f}", "Required value"))
        for f in ("plural", "kind"):
            if names and not names.get(f):
                causes.append(validation.cause("FieldValueRequired", f"spec.names.{f}", "Required value"))
        if not causes and name != f"{names['plural']}.{spec['group']}":
            causes.append(validation.invalid_cause("metadata.name", name,
                                                   "must be spec.names.plural+\".\"+spec.group"))
        if spec.get("scope") not in (None, "Namespaced", "Cluster"):
            causes.append(validation.cause("FieldValueNotSupported", "spec.scope",
                                           f'Unsupported value: "{spec.get("scope")}": supported values: '
                                           '"Cluster", "Namespaced"'))
        versions = spec.get("versions") or []
        if versions and sum(1 for v in versions if v.get("storage")) != 1:
            causes.append(validation.invalid_cause("spec.versions", "array",
                                                   "must have exactly one version marked as storage version"))
        for i, v in enumerate(versions):
            schema = (v.get("schema") or {}).get("openAPIV3Schema")
            for problem in cel.rule_problems_of_crd(schema or {}):
                causes.append(validation.invalid_cause(f"spec.versions[{i}].schema.openAPIV3Schema", "object",
                                                       problem))
        if old is not None and not causes:
            if (old["spec"].get("group"), old["spec"].get("names", {}).get("plural")) != (
                    spec["group"], names["plural"]):
                causes.append(validation.invalid_cause("spec.group", spec["group"], "field is immutable"))
        if causes:
            raise errors.invalid("CustomResourceDefinition", "apiextensions.k8s.io", name, causes)
        # The CRD controllers' answer, given at once: names accepted, established, stored in the storage version.
        storage = next(v["name"] for v in versions if v.get("storage"))
        stored_versions = list((old or {}).get("status", {}).get("storedVersions") or [])
        if storage not in stored_versions:
            stored_versions.append(storage)
        ts = now_rfc3339()
        # An update keeps the conditions' transition times: they did not transition.
        old_times = {c["type"]: c.get("lastTransitionTime") for c in ((old or {}).get("status") or {}).get(
            "conditions") or ()}
        accepted = dict(names)
        accepted.setdefault("singular", names["kind"].lower())
        accepted.setdefault("listKind", names["kind"] + "List")
        obj["status"] = {
            "acceptedNames": accepted,
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": old_times.get("NamesAccepted") or ts},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted",
                 "lastTransitionTime": old_times.get("Established") or ts},
            ],
            "storedVersions": stored_versions,
        }
        obj.setdefault("spec", {}).setdefault("conversion", {"strategy": "None"})
        return obj

    def register_crd(self, crd: dict) -> None:
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        self.registry.remove_group_resource(group, plural)
        for info in resources_of_crd(crd, sensitive.sensitive_paths):
            self.registry.add(info)
        self.store.start_history((group, plural))

    def unregister_crd(self, crd: dict) -> None:
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        self.registry.remove_group_resource(group, plural)
        self.store.drop_collection((group, plural))

    # ------------------------------------------------------------ create

    def create(self, info: ResourceInfo, obj: dict, namespace: str | None = None,
               field_validation: str = "Strict", dry_run: bool = False) -> tuple[dict, list[str]]:
        obj = self._normalise(info, obj, namespace)
        meta = obj["metadata"]
        namespace = meta.get("namespace") if info.namespaced else None
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(secrets.choice(_GENERATE_ALPHABET) for _ in range(5))
        self._check_namespace(info, namespace, creating=True, name=meta.get("name") or "")
        for k in _SERVER_META + ("resourceVersion",):
            meta.pop(k, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        if info.has_generation:
            meta["generation"] = 1
        if info.custom and info.has_status:
            obj.pop("status", None)   # a create cannot set status when status is a subresource
        obj = sensitive.restore(obj, None, list(info.sensitive_paths)) if info.sensitive_paths else obj
        obj, warnings = validation.validate(info, obj, None, field_validation)
        if info.storage == events.CORE_KEY:
            problems = events.creation_problems(obj)
            if problems:
                raise errors.invalid("Event", "", meta.get("name") or "", problems)
        obj = conversion.to_storage(info, self._kind_rules(info, obj, None))
        if self.store.get(info.key, namespace, meta["name"]) is not None:
            raise errors.already_exists(info.group, info.plural, meta["name"])
        if dry_run:
            return obj, warnings
        stored = self.store.put(info.key, obj, None)
        if info.key == NAMESPACE_KEY:
            # The service account controller gives every namespace its "default" ServiceAccount.
            sa_info = self.registry.get("", "v1", "serviceaccounts")
            self.create(sa_info, {"metadata": {"name": "default"}}, meta["name"])
        return stored, warnings

    # ------------------------------------------------------------ update

    def update(self, info: ResourceInfo, obj: dict, namespace: str | None, name: str,
               subresource: str | None = None, field_validation: str = "Strict",
               dry_run: bool = False, existing: dict | None = None) -> tuple[dict, list[str]]:
        """PUT semantics (patches arrive here with the patched object). A resourceVersion in obj is a
        precondition: 409 when it is stale."""
        obj = self._normalise(info, obj, namespace)
        meta = obj["metadata"]
        if meta.get("name") and meta["name"] != name:
            raise errors.bad_request(f'the name of the object ({meta["name"]}) does not match the name on the URL '
                                     f"({name})")
        if info.namespaced:
            self._check_namespace(info, namespace, creating=False)
        stored = existing if existing is not None else self.store.get(info.key, namespace, name)
        if stored is None:
            raise errors.not_found(info.group, info.plural, name)
        # The write starts from the stored object as the version it is made through shows it.
        old = conversion.to_version(info, stored)
        rv = meta.get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise errors.conflict(info.group, info.plural, name,
                                  "the object has been modified; please apply your changes to the latest version "
                                  "and try again")
        if meta.get("uid") and meta["uid"] != old["metadata"]["uid"]:
            raise errors.conflict(info.group, info.plural, name,
                                  f'Precondition failed: UID in precondition: {meta["uid"]}, UID in object meta: '
                                  f'{old["metadata"]["uid"]}')
        old_meta = old["metadata"]
        if subresource == "status":
            # A status write changes status only: everything else comes from the stored object.
            new = {k: v for k, v in old.items() if k != "status"}
            if "status" in obj:
                new["status"] = obj["status"]
            new["metadata"] = dict(old_meta)
        else:
            new = obj
            if info.has_status:
                new.pop("status", None)
                if "status" in old:
                    new["status"] = old["status"]
            for k in _SERVER_META:
                if k in old_meta:
                    meta[k] = old_meta[k]
                else:
                    meta.pop(k, None)
            meta["name"] = name
            if info.namespaced:
                meta["namespace"] = old_meta.get("namespace")
        new["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        if old_meta.get("deletionTimestamp"):
            added = set(new["metadata"].get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
            if added:
                found = ", ".join(json.dumps(f) for f in sorted(added))
                problem = validation.cause("FieldValueForbidden", "metadata.finalizers",
                                           "Forbidden: no new finalizers can be added if the object is being "
                                           f"deleted, found new finalizers []string{{{found}}}")
                # A custom resource's metadata is validated twice on update (the generic and the CR strategy's
                # checks), and kube-apiserver reports this one twice.
                raise errors.invalid(info.kind, info.group, name, [problem, dict(problem)] if info.custom
                                     else [problem])
        if info.sensitive_paths:
            new = sensitive.restore(new, old, list(info.sensitive_paths))
        new, warnings = validation.validate(info, new, old, field_validation, status_only=subresource == "status")
        new = conversion.to_storage(info, self._kind_rules(info, new, old))
        if info.has_generation and subresource != "status" and _spec_part(info, new) != _spec_part(info, stored):
            new["metadata"]["generation"] = int(old_meta.get("generation") or 1) + 1
        if new == stored:
            return stored, warnings   # a no-op write stores nothing and sends no event, as kube-apiserver
        if dry_run:
            return new, warnings
        if old_meta.get("deletionTimestamp") and not new["metadata"].get("finalizers") and (
                info.key != NAMESPACE_KEY or not (new.get("spec") or {}).get("finalizers")):
            return self.store.remove(info.key, new), warnings
        return self.store.put(info.key, new, stored), warnings

    # ------------------------------------------------------------ delete

    def delete(self, info: ResourceInfo, namespace: str | None, name: str, propagation: str | None = None,
               preconditions: dict | None = None, dry_run: bool = False) -> tuple[dict, bool]:
        """Return (object, deleted_now). With finalizers left the object is only marked (deletionTimestamp)."""
        if propagation not in (None, "Background", "Foreground", "Orphan"):
            raise errors.invalid("DeleteOptions", "meta.k8s.io", "", [validation.cause(
                "FieldValueNotSupported", "propagationPolicy", f"Unsupported value: {json.dumps(propagation)}: "
                'supported values: "Foreground", "Background", "Orphan", "nil"')])
        if info.key == NAMESPACE_KEY and name in IMMORTAL_NAMESPACES:
            raise errors.ApiError(403, "Forbidden", f'namespaces "{name}" is forbidden: this namespace may not be '
                                                    "deleted", {"name": name, "kind": "namespaces"})
        old = self.store.get(info.key, namespace, name)
        if old is None:
            raise errors.not_found(info.group, info.plural, name)
        pre = preconditions or {}
        if pre.get("uid") and pre["uid"] != old["metadata"]["uid"]:
            raise errors.precondition_failed(info.kind, info.group, name, "UID", pre["uid"], old["metadata"]["uid"])
        if pre.get("resourceVersion") and pre["resourceVersion"] != old["metadata"]["resourceVersion"]:
            raise errors.precondition_failed(info.kind, info.group, name, "ResourceVersion", pre["resourceVersion"],
                                             old["metadata"]["resourceVersion"])
        if dry_run:
            return old, False
        finalizers = list(old["metadata"].get("finalizers") or ())
        if propagation == "Foreground" and FOREGROUND not in finalizers:
            finalizers.append(FOREGROUND)
        if propagation == "Orphan" and ORPHAN not in finalizers:
            finalizers.append(ORPHAN)
        is_namespace = info.key == NAMESPACE_KEY
        if old["metadata"].get("deletionTimestamp"):
            if finalizers != list(old["metadata"].get("finalizers") or ()):
                new = dict(old, metadata=dict(old["metadata"], finalizers=finalizers))
                return self.store.put(info.key, new, old), False
            return old, False
        if finalizers or is_namespace:
            meta = dict(old["metadata"], deletionTimestamp=now_rfc3339())
            if not is_namespace:
                meta["deletionGracePeriodSeconds"] = 0
            if finalizers:
                meta["finalizers"] = finalizers
            if info.has_generation:
                meta["generation"] = int(meta.get("generation") or 1) + 1
            new = dict(old, metadata=meta)
            if is_namespace:
                new["status"] = dict(old.get("status") or {}, phase="Terminating")
            return self.store.put(info.key, new, old), False
        return self.store.remove(info.key, old), True

    def finalize_namespace(self, name: str) -> None:
        """The namespace controller's last step: drop the `kubernetes` finalizer of an emptied namespace."""
        old = self.store.get(NAMESPACE_KEY, None, name)
        if old is None or not old["metadata"].get("deletionTimestamp"):
            return
        spec = dict(old.get("spec") or {})
        spec["finalizers"] = [f for f in spec.get("finalizers") or () if f != NAMESPACE_FINALIZER]
        new = dict(old, spec=spec)
        if not spec["finalizers"] and not old["metadata"].get("finalizers"):
            self.store.remove(NAMESPACE_KEY, new)
        elif new != old:
            self.store.put(NAMESPACE_KEY, new, old)

    def remove_finalizer(self, info: ResourceInfo, obj: dict, finalizer: str) -> None:
        """Used by the garbage collector for foregroundDeletion and orphan."""
        cur = self.store.get(info.key, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if cur is None or finalizer not in (cur["metadata"].get("finalizers") or ()):
            return
        meta = dict(cur["metadata"], finalizers=[f for f in cur["metadata"]["finalizers"] if f != finalizer])
        if not meta["finalizers"]:
            del meta["finalizers"]
        new = dict(cur, metadata=meta)
        if cur["metadata"].get("deletionTimestamp") and not meta.get("finalizers"):
            self.store.remove(info.key, new)
        else:
            self.store.put(info.key, new, cur)

    def drop_owner_reference(self, info: ResourceInfo, obj: dict, owner_uid: str) -> None:
        cur = self.store.get(info.key, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if cur is None:
            return
        refs = [r for r in cur["metadata"].get("ownerReferences") or () if r.get("uid") != owner_uid]
        meta = dict(cur["metadata"], ownerReferences=refs)
        if not refs:
            del meta["ownerReferences"]
        self.store.put(info.key, dict(cur, metadata=meta), cur)
