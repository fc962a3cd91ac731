"""Grants: the RBAC objects that let the peer's consumers do here what the effective capabilities allow.

Project scope: a Role and a RoleBinding in every namespace of every paired project. Cluster scope: a ClusterRole
and a ClusterRoleBinding. Subjects are the users Dex puts into exchanged tokens:
`peering:<identity>:system:serviceaccount:<ns>:<name>` for each consumer of the local capability, where the
identity is the uid of our ClusterPeer of the peering (`contract.names.peering_identity`), never the peer's claim.
Every object is labelled and owned by the ClusterPeer, so deleting the ClusterPeer removes the grants at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from contract.names import username_prefix
from control.rules import ownership
from control.rules.capabilities import ValidatedCapability
from control.rules.effective import EffectiveCapability

RBAC_API_VERSION = "rbac.authorization.k8s.io/v1"
RBAC_GROUP = "rbac.authorization.k8s.io"
NAME_PREFIX = "d8:peering:"


def grant_name(clusterpeer: str, capability: str) -> str:
    """`d8:peering:<clusterpeer>:<capability>`, shortened with a hash when over 253 characters."""
    return ownership.bounded_name(f"{NAME_PREFIX}{clusterpeer}:{capability}")


def subjects(identity: str, consumers: Iterable[tuple[str, str]]) -> list[dict]:
    prefix = username_prefix(identity)
    return [
        {"kind": "User", "apiGroup": RBAC_GROUP, "name": f"{prefix}system:serviceaccount:{ns}:{name}"}
        for ns, name in sorted(set(consumers))
    ]


@dataclass(frozen=True)
class Grants:
    objects: list[dict] = field(default_factory=list)
    #: status.grants: [{capability, namespaces}] ([] namespaces for a cluster-scoped-only capability).
    status: list[dict] = field(default_factory=list)


def _meta(name: str, clusterpeer: dict, capability: str, namespace: str | None = None) -> dict:
    cp_name = clusterpeer["metadata"]["name"]
    meta = {
        "name": name,
        "labels": ownership.labels(cp_name, capability),
        "ownerReferences": [ownership.owner_reference(clusterpeer)],
    }
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def desired_grants(
    clusterpeer: dict,
    identity: str,
    effective: Iterable[EffectiveCapability],
    local: Mapping[str, ValidatedCapability],
    paired_namespaces: Iterable[str],
) -> Grants:
    """Every RBAC object one ClusterPeer should have, and its status.grants."""
    cp_name = clusterpeer["metadata"]["name"]
    namespaces = sorted(set(paired_namespaces))
    objects: list[dict] = []
    status: list[dict] = []
    for cap in sorted(effective, key=lambda c: c.name):
        mine = local.get(cap.name)
        if mine is None or not mine.accepted:
            continue
        name = grant_name(cp_name, cap.name)
        subs = subjects(identity, mine.consumers)
        granted_ns: list[str] = []
        project_rules = mine.rules_for("project")
        if project_rules and namespaces:
            granted_ns = namespaces
            for ns in namespaces:
                objects.append(
                    {
                        "apiVersion": RBAC_API_VERSION,
                        "kind": "Role",
                        "metadata": _meta(name, clusterpeer, cap.name, ns),
                        "rules": project_rules,
                    }
                )
                objects.append(
                    {
                        "apiVersion": RBAC_API_VERSION,
                        "kind": "RoleBinding",
                        "metadata": _meta(name, clusterpeer, cap.name, ns),
                        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": name},
                        "subjects": subs,
                    }
                )
        cluster_rules = mine.rules_for("cluster")
        if cluster_rules:
            objects.append(
                {
                    "apiVersion": RBAC_API_VERSION,
                    "kind": "ClusterRole",
                    "metadata": _meta(name, clusterpeer, cap.name),
                    "rules": cluster_rules,
                }
            )
            objects.append(
                {
                    "apiVersion": RBAC_API_VERSION,
                    "kind": "ClusterRoleBinding",
                    "metadata": _meta(name, clusterpeer, cap.name),
                    "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
                    "subjects": subs,
                }
            )
        status.append({"capability": cap.name, "namespaces": granted_ns})
    return Grants(objects, status)


# --- the difference to write ---------------------------------------------------------------------------------

#: Top-level fields that carry the meaning of each kind; the rest (status, managedFields...) is the server's.
CONTENT_FIELDS = ("rules", "roleRef", "subjects", "spec", "data", "stringData", "type")
#: Fields that cannot change in place: a change means delete and create.
IMMUTABLE_FIELDS = ("roleRef",)


@dataclass(frozen=True)
class Diff:
    create: list[dict] = field(default_factory=list)
    #: Desired objects carrying the existing metadata.resourceVersion, for an update with a precondition.
    update: list[dict] = field(default_factory=list)
    delete: list[dict] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)


def object_key(obj: dict) -> tuple[str, str, str, str]:
    meta = obj.get("metadata") or {}
    return (obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace") or "", meta.get("name", ""))


def _differs(desired: dict, existing: dict) -> bool:
    for f in CONTENT_FIELDS:
        if f in desired and desired[f] != existing.get(f):
            return True
    d_meta, e_meta = desired.get("metadata") or {}, existing.get("metadata") or {}
    e_labels = e_meta.get("labels") or {}
    if any(e_labels.get(k) != v for k, v in (d_meta.get("labels") or {}).items()):
        return True
    return (d_meta.get("ownerReferences") or []) != (e_meta.get("ownerReferences") or [])


def diff_objects(desired: Iterable[dict], existing: Iterable[dict], clusterpeer: str) -> Diff:
    """What to create, update and delete so that `existing` becomes `desired`.

    Only objects labelled as written for this ClusterPeer are ever deleted; objects of others are left alone even
    when the caller passes them in. Equal objects produce no write, so a steady state makes no API calls.
    """
    want = {object_key(o): o for o in desired}
    have = {object_key(o): o for o in existing if ownership.belongs_to(o, clusterpeer)}
    create, update, delete = [], [], []
    for key, obj in want.items():
        cur = have.get(key)
        if cur is None:
            create.append(obj)
        elif any(f in obj and obj[f] != cur.get(f) for f in IMMUTABLE_FIELDS):
            delete.append(cur)
            create.append(obj)
        elif _differs(obj, cur):
            rv = (cur.get("metadata") or {}).get("resourceVersion")
            meta = dict(obj["metadata"])
            if rv:
                meta["resourceVersion"] = rv
            update.append({**obj, "metadata": meta})
    for key, cur in have.items():
        if key not in want:
            delete.append(cur)
    return Diff(create, update, delete)
