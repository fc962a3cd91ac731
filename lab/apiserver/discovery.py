"""Discovery documents: legacy (/api, /apis, group and group-version resource lists), aggregated discovery
(apidiscovery.k8s.io/v2, which kubectl asks for first), /version, and the OpenAPI v3 documents kubectl reads to
learn that the server validates fields itself (so it sends fieldValidation= instead of validating locally)."""

from __future__ import annotations

import base64
import hashlib
import json

from lab.apiserver.resources import Registry, ResourceInfo

KUBE_VERSION = {"major": "1", "minor": "37", "gitVersion": "v1.37.2", "gitCommit": "", "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25", "compiler": "gc",
                "platform": "linux/amd64", "emulationMajor": "1", "emulationMinor": "37",
                "minCompatibilityMajor": "1", "minCompatibilityMinor": "36"}

AGGREGATED_CONTENT_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

# Subresources whose answers are of another kind than the resource's own.
_SUBRESOURCE_KINDS = {("serviceaccounts", "token"): ("authentication.k8s.io", "v1", "TokenRequest"),
                      ("namespaces", "finalize"): ("", "v1", "Namespace")}


def wants_aggregated(accept: str) -> bool:
    return "as=APIGroupDiscoveryList" in accept and "v=v2" in accept and "g=apidiscovery.k8s.io" in accept


def _storage_hash(info: ResourceInfo) -> str:
    """kube-apiserver's storageVersionHash: the first 8 bytes of the SHA-256 of the storage version's
    `group/version/kind`, in base64 (events.k8s.io Events are stored as core v1 Events)."""
    if info.storage is not None:
        group, version = info.storage[0], "v1"
    else:
        group, version = info.group, info.storage_version or info.version
    return base64.b64encode(hashlib.sha256(f"{group}/{version}/{info.kind}".encode()).digest()[:8]).decode()


def _group_versions(registry: Registry, group: str, unavailable: dict[str, list[str]] | None = None) -> list[dict]:
    versions = registry.versions(group) or list((unavailable or {}).get(group, ()))
    return [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]


def api_versions(server_address: str) -> dict:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def api_group(registry: Registry, group: str, unavailable: dict[str, list[str]] | None = None) -> dict | None:
    """A group's versions; an unavailable aggregated API's group is listed as well (kube-aggregator knows its
    versions from the APIService objects, whether or not their backend answers)."""
    versions = _group_versions(registry, group, unavailable)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": versions,
            "preferredVersion": versions[0]}


def api_group_list(registry: Registry, unavailable: dict[str, list[str]] | None = None) -> dict:
    groups = []
    for g in registry.groups() + [g for g in (unavailable or {}) if g not in registry.groups()]:
        if g == "":
            continue
        doc = api_group(registry, g, unavailable)
        if doc:
            doc = dict(doc)
            doc.pop("kind")
            doc.pop("apiVersion")
            groups.append(doc)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def resource_list(registry: Registry, group: str, version: str) -> dict | None:
    infos = registry.resources(group, version)
    if not infos:
        return None
    out = []
    for info in sorted(infos, key=lambda i: i.plural):
        entry = {"name": info.plural, "singularName": info.singular, "namespaced": info.namespaced,
                 "kind": info.kind, "verbs": list(info.verbs)}
        if info.short_names:
            entry["shortNames"] = list(info.short_names)
        if info.categories:
            entry["categories"] = list(info.categories)
        if not info.create_only:
            entry["storageVersionHash"] = _storage_hash(info)
        out.append(entry)
        for sub, verbs in info.subresources.items():
            sub_entry = {"name": f"{info.plural}/{sub}", "singularName": "", "namespaced": info.namespaced,
                         "kind": info.kind, "verbs": list(verbs)}
            if (info.plural, sub) in _SUBRESOURCE_KINDS:
                g, v, k = _SUBRESOURCE_KINDS[(info.plural, sub)]
                sub_entry.update({"group": g, "version": v, "kind": k})
            out.append(sub_entry)
    doc = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": info.group_version if infos else "",
           "resources": out}
    if not group:
        del doc["apiVersion"]   # kube-apiserver's /api/v1 names no apiVersion
    return doc


def _aggregated_resource(info: ResourceInfo) -> dict:
    entry = {"resource": info.plural,
             "responseKind": {"group": info.group, "version": info.version, "kind": info.kind},
             "scope": "Namespaced" if info.namespaced else "Cluster",
             "singularResource": info.singular, "verbs": list(info.verbs)}
    if info.short_names:
        entry["shortNames"] = list(info.short_names)
    if info.categories:
        entry["categories"] = list(info.categories)
    subs = []
    for sub, verbs in info.subresources.items():
        g, v, k = _SUBRESOURCE_KINDS.get((info.plural, sub), (info.group, info.version, info.kind))
        subs.append({"subresource": sub, "responseKind": {"group": g, "version": v, "kind": k},
                     "verbs": list(verbs)})
    if subs:
        entry["subresources"] = subs
    return entry


def aggregated(registry: Registry, legacy: bool, unavailable: dict[str, list[str]] | None = None) -> dict:
    """apidiscovery.k8s.io/v2 APIGroupDiscoveryList: for /api (core only) or /apis (every other group).

    An unavailable aggregated API is listed with freshness Stale and no resources, as kube-aggregator's
    discovery manager publishes a version whose backend it could not reach; clients report that group version
    as failed and keep the rest."""
    items = []
    unavailable = {} if legacy else (unavailable or {})
    groups = [""] if legacy else [g for g in registry.groups() if g != ""]
    groups += [g for g in unavailable if g not in groups]
    for g in groups:
        versions = []
        for v in registry.versions(g):
            versions.append({"version": v, "freshness": "Current",
                             "resources": [_aggregated_resource(i) for i in
                                           sorted(registry.resources(g, v), key=lambda i: i.plural)]})
        for v in unavailable.get(g, ()):
            versions.append({"version": v, "freshness": "Stale"})
        if versions:
            meta = {"name": g} if g else {}
            items.append({"metadata": meta, "versions": versions})
    return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {},
            "items": items}


# ---------------------------------------------------------------- OpenAPI v3

_QUERY_PARAMS = [
    {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
    {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
    {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
]


def _schema_name(info: ResourceInfo) -> str:
    group = ".".join(reversed(info.group.split("."))) if info.group else "io.k8s.api.core"
    return f"{group}.{info.version}.{info.kind}"


def _operation(info: ResourceInfo, action: str, op_id: str, with_body: bool, params: list | None = None) -> dict:
    op = {"operationId": op_id, "tags": [f"{info.group or 'core'}_{info.version}"],
          "x-kubernetes-action": action,
          "x-kubernetes-group-version-kind": {"group": info.group, "version": info.version, "kind": info.kind},
          "parameters": list(params if params is not None else _QUERY_PARAMS),
          "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {
              "$ref": f"#/components/schemas/{_schema_name(info)}"}}}}}}
    if with_body:
        # A custom resource takes no strategic merge patch, and says so: kubectl's apply then sends a merge patch.
        content_types = ["application/json"] if action != "patch" else [
            "application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"] + (
            [] if info.custom else ["application/strategic-merge-patch+json"])
        op["requestBody"] = {"content": {ct: {"schema": {"$ref": f"#/components/schemas/{_schema_name(info)}"}}
                                         for ct in content_types}, "required": True}
    return op


OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_STRINGS = {"type": "array", "items": {"type": "string", "default": ""}}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string", "default": ""}}
# ObjectMeta as kube-apiserver publishes it, the fields a client patches: kubectl's client-side apply computes
# its patch of a custom resource's metadata (annotations, labels, finalizers, ownerReferences) from it.
OBJECT_META_SCHEMA = {
    "type": "object",
    "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects "
                   "users must create.",
    "properties": {
        "annotations": _STRING_MAP, "labels": _STRING_MAP,
        "creationTimestamp": {"type": "string", "format": "date-time"},
        "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
        "deletionTimestamp": {"type": "string", "format": "date-time"},
        "finalizers": {**_STRINGS, "x-kubernetes-list-type": "set", "x-kubernetes-patch-strategy": "merge"},
        "generateName": {"type": "string"}, "generation": {"type": "integer", "format": "int64"},
        "managedFields": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        "name": {"type": "string"}, "namespace": {"type": "string"},
        "ownerReferences": {"type": "array", "items": {
            "type": "object", "required": ["apiVersion", "kind", "name", "uid"],
            "properties": {"apiVersion": {"type": "string", "default": ""},
                           "blockOwnerDeletion": {"type": "boolean"}, "controller": {"type": "boolean"},
                           "kind": {"type": "string", "default": ""}, "name": {"type": "string", "default": ""},
                           "uid": {"type": "string", "default": ""}},
            "x-kubernetes-map-type": "atomic"},
            "x-kubernetes-list-map-keys": ["uid"], "x-kubernetes-list-type": "map",
            "x-kubernetes-patch-merge-key": "uid", "x-kubernetes-patch-strategy": "merge"},
        "resourceVersion": {"type": "string"}, "selfLink": {"type": "string"}, "uid": {"type": "string"},
    },
}


def _info_schema(info: ResourceInfo) -> dict:
    schema = dict(info.schema) if info.schema else {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    props = dict(schema.get("properties") or {})
    props.setdefault("apiVersion", {"type": "string"})
    props.setdefault("kind", {"type": "string"})
    props["metadata"] = {"allOf": [{"$ref": f"#/components/schemas/{OBJECT_META}"}], "default": {}}
    schema["properties"] = props
    schema["x-kubernetes-group-version-kind"] = [{"group": info.group, "version": info.version, "kind": info.kind}]
    return schema


def openapi_v3_document(registry: Registry, group: str, version: str) -> dict | None:
    infos = registry.resources(group, version)
    if not infos:
        return None
    paths: dict[str, dict] = {}
    schemas: dict[str, dict] = {}
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    for info in infos:
        base = f"{prefix}/namespaces/{{namespace}}/{info.plural}" if info.namespaced else f"{prefix}/{info.plural}"
        name = info.kind
        if info.create_only:
            # kube-apiserver has no PATCH for these, so kubectl falls back to validating them itself against
            # /openapi/v2 in protobuf, which this server does not serve. It validates what it receives anyway, so
            # it states the fieldValidation support kubectl looks for on a PATCH operation; a real PATCH gets 405.
            paths[base] = {"post": _operation(info, "post", f"create{name}", True)}
            paths[base + "/{name}"] = {"patch": _operation(info, "patch", f"patch{name}", True)}
        else:
            paths[base] = {"get": _operation(info, "list", f"list{name}", False, []),
                           "post": _operation(info, "post", f"create{name}", True)}
            paths[base + "/{name}"] = {"get": _operation(info, "get", f"read{name}", False, []),
                                       "put": _operation(info, "put", f"replace{name}", True),
                                       "patch": _operation(info, "patch", f"patch{name}", True),
                                       "delete": _operation(info, "delete", f"delete{name}", False, [])}
            if info.has_status:
                paths[base + "/{name}/status"] = {
                    "get": _operation(info, "get", f"read{name}Status", False, []),
                    "put": _operation(info, "put", f"replace{name}Status", True),
                    "patch": _operation(info, "patch", f"patch{name}Status", True)}
        if info.custom:
            schemas[_schema_name(info)] = _info_schema(info)
            schemas[OBJECT_META] = OBJECT_META_SCHEMA
        else:
            # Built-in schemas are left out on purpose: without them kubectl builds strategic merge patches from
            # its compiled-in types, which are exactly the real server's.
            schemas[_schema_name(info)] = {"type": "object", "description": f"{info.kind} (schema not published)"}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": KUBE_VERSION["gitVersion"]},
            "paths": paths, "components": {"schemas": schemas}}


def openapi_v3_root(registry: Registry) -> dict:
    paths = {}
    for g in registry.groups():
        for v in registry.versions(g):
            doc = openapi_v3_document(registry, g, v)
            digest = hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest().upper()[:128]
            rel = f"apis/{g}/{v}" if g else f"api/{v}"
            paths[rel] = {"serverRelativeURL": f"/openapi/v3/{rel}?hash={digest}"}
    return {"paths": paths}
