"""What the emulator serves: the built-in kinds the module uses and the custom resources of the loaded CRDs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

STANDARD_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
CREATE_ONLY = ("create",)


@dataclass(frozen=True)
class ResourceInfo:
    """One resource of one group version, as discovery lists it and the handlers serve it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = STANDARD_VERBS
    # subresource name -> verbs; "status" here means writes to the main resource ignore status and vice versa.
    subresources: dict = field(default_factory=dict)
    # The CRD's openAPIV3Schema for this version; None for built-ins (checked for shape only).
    schema: dict | None = None
    printer_columns: tuple[dict, ...] = ()
    custom: bool = False          # a custom resource: generation bumps on spec changes, schema validation applies
    has_generation: bool = False  # metadata.generation is kept (custom resources and CRDs)
    sensitive_paths: tuple[tuple[str, ...], ...] = ()
    storage_version: str = ""
    # The storage version's schema (served or not): what an object is pruned to when it is stored.
    storage_schema: dict | None = None
    # Where the objects live when another resource holds them (events.k8s.io events are core events).
    storage: tuple[str, str] | None = None

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        """Objects of every served version of a resource share one store, keyed by group and plural."""
        return self.storage or (self.group, self.plural)

    @property
    def converts(self) -> bool:
        """Objects are stored in another version than this one (a custom resource with several versions)."""
        return self.custom and self.version != self.storage_version

    @property
    def create_only(self) -> bool:
        return self.verbs == CREATE_ONLY

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


def _builtin(group, version, plural, kind, namespaced, short=(), verbs=STANDARD_VERBS, sub=None, categories=()):
    return ResourceInfo(
        group=group, version=version, plural=plural, kind=kind, namespaced=namespaced,
        singular=kind.lower(), short_names=tuple(short), verbs=tuple(verbs), subresources=dict(sub or {}),
        categories=tuple(categories), has_generation=(plural == "customresourcedefinitions"),
        storage_version=version,
    )


_STATUS_VERBS = ("get", "patch", "update")

BUILTINS: tuple[ResourceInfo, ...] = (
    _builtin("", "v1", "namespaces", "Namespace", False, ("ns",),
             verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
             sub={"status": _STATUS_VERBS, "finalize": ("update",)}),
    _builtin("", "v1", "configmaps", "ConfigMap", True, ("cm",)),
    _builtin("", "v1", "secrets", "Secret", True),
    _builtin("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",), sub={"token": ("create",)}),
    _builtin("", "v1", "events", "Event", True, ("ev",)),
    dataclasses.replace(_builtin("events.k8s.io", "v1", "events", "Event", True, ("ev",)), storage=("", "events")),
    _builtin("coordination.k8s.io", "v1", "leases", "Lease", True),
    _builtin("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    _builtin("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    _builtin("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    _builtin("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _builtin("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False, verbs=CREATE_ONLY),
    _builtin("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview", False, verbs=CREATE_ONLY),
    _builtin("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False, verbs=CREATE_ONLY),
    _builtin("authorization.k8s.io", "v1", "localsubjectaccessreviews", "LocalSubjectAccessReview", True,
             verbs=CREATE_ONLY),
    _builtin("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False,
             verbs=CREATE_ONLY),
    _builtin("authorization.k8s.io", "v1", "selfsubjectrulesreviews", "SelfSubjectRulesReview", False,
             verbs=CREATE_ONLY),
    _builtin("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
             "ValidatingWebhookConfiguration", False, categories=("api-extensions",)),
    _builtin("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
             ("crd", "crds"), sub={"status": _STATUS_VERBS}, categories=("api-extensions",)),
)

# The order kube-apiserver lists its groups in; custom groups follow in the order their CRDs arrived.
BUILTIN_GROUP_ORDER = ("", "events.k8s.io", "authentication.k8s.io", "authorization.k8s.io",
                       "rbac.authorization.k8s.io", "admissionregistration.k8s.io", "apiextensions.k8s.io",
                       "coordination.k8s.io")
# A custom resource's verbs, in the order kube-apiserver lists them.
CUSTOM_VERBS = ("delete", "deletecollection", "get", "list", "patch", "create", "update", "watch")


_BUILTIN_GROUPS = {info.group for info in BUILTINS}


def default_printer_columns(crd_version: dict) -> tuple[dict, ...]:
    cols = crd_version.get("additionalPrinterColumns")
    if cols:
        return tuple(cols)
    # kube-apiserver defaults a CRD without columns to an Age column.
    return ({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},)


def resources_of_crd(crd: dict, sensitive_paths=None) -> list[ResourceInfo]:
    """The served versions of a CRD as resources. `sensitive_paths(schema)` finds masked fields, if given."""
    spec = crd["spec"]
    names = spec["names"]
    storage = next((v["name"] for v in spec["versions"] if v.get("storage")), spec["versions"][0]["name"])
    open_schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    schemas = {v["name"]: (v.get("schema") or {}).get("openAPIV3Schema") or open_schema for v in spec["versions"]}
    out = []
    for v in spec["versions"]:
        if not v.get("served", True):
            continue
        schema = schemas[v["name"]]
        subs = {}
        if "status" in (v.get("subresources") or {}):
            subs["status"] = _STATUS_VERBS
        if "scale" in (v.get("subresources") or {}):
            subs["scale"] = _STATUS_VERBS
        out.append(ResourceInfo(
            group=spec["group"], version=v["name"], plural=names["plural"], kind=names["kind"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            singular=names.get("singular") or names["kind"].lower(),
            short_names=tuple(names.get("shortNames") or ()), categories=tuple(names.get("categories") or ()),
            verbs=CUSTOM_VERBS, subresources=subs, schema=schema, printer_columns=default_printer_columns(v),
            custom=True,
            has_generation=True,
            sensitive_paths=tuple(tuple(p) for p in (sensitive_paths(schema) if sensitive_paths else ())),
            storage_version=storage, storage_schema=schemas[storage],
        ))
    return out


class Registry:
    """Lookup of resources by group/version/plural, by short name and by kind; changes as CRDs come and go."""

    def __init__(self) -> None:
        self._by_gvr: dict[tuple[str, str, str], ResourceInfo] = {}
        self._group_order: list[str] = []
        for info in BUILTINS:
            self.add(info)

    def add(self, info: ResourceInfo) -> None:
        self._by_gvr[(info.group, info.version, info.plural)] = info
        if info.group not in self._group_order:
            self._group_order.append(info.group)

    def remove_group_resource(self, group: str, plural: str) -> None:
        for key in [k for k in self._by_gvr if k[0] == group and k[2] == plural]:
            del self._by_gvr[key]
        if not any(k[0] == group for k in self._by_gvr):
            self._group_order = [g for g in self._group_order if g != group]

    def get(self, group: str, version: str, plural: str) -> ResourceInfo | None:
        return self._by_gvr.get((group, version, plural))

    def any_version(self, group: str, plural: str) -> ResourceInfo | None:
        """The storage version's resource, else any served one (in-process access names no version)."""
        found = [i for (g, _, p), i in self._by_gvr.items() if g == group and p == plural]
        for info in found:
            if info.version == info.storage_version:
                return info
        return found[0] if found else None

    def by_kind(self, api_version: str, kind: str) -> ResourceInfo | None:
        group, _, version = api_version.rpartition("/")
        for info in self._by_gvr.values():
            if info.group == group and info.version == version and info.kind == kind:
                return info
        return None

    def groups(self) -> list[str]:
        """The built-in groups in kube-apiserver's order, then the custom ones by name (all of equal priority)."""
        builtin = [g for g in BUILTIN_GROUP_ORDER if g in self._group_order]
        builtin += [g for g in self._group_order if g not in builtin and g in _BUILTIN_GROUPS]
        return builtin + sorted(g for g in self._group_order if g not in builtin)

    def versions(self, group: str) -> list[str]:
        seen: list[str] = []
        for g, v, _ in self._by_gvr:
            if g == group and v not in seen:
                seen.append(v)
        return sorted(seen, key=_version_priority)

    def resources(self, group: str, version: str) -> list[ResourceInfo]:
        return [i for (g, v, _), i in self._by_gvr.items() if g == group and v == version]

    def all(self) -> list[ResourceInfo]:
        return list(self._by_gvr.values())


def _version_priority(v: str) -> tuple:
    """Kubernetes version order: GA before beta before alpha, higher numbers first."""
    import re
    m = re.match(r"^v(\d+)(?:(alpha|beta)(\d+))?$", v)
    if not m:
        return (3, 0, 0, v)
    rank = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    return (rank, -int(m.group(1)), -int(m.group(3) or 0), v)
