"""Kubernetes protobuf request bodies, for the built-in kinds kubectl sends that way.

kubectl's typed clients (auth whoami, auth can-i, create token, create rolebinding/serviceaccount/configmap/
secret/namespace) post `application/vnd.kubernetes.protobuf` bodies and accept JSON back. This decodes the `k8s\\0`
envelope (runtime.Unknown) and those kinds' messages (the fields a create sets) into the dicts their JSON form
gives; any other kind is answered 415 so the caller knows to send JSON. Field numbers are those of the kinds'
generated.proto in k8s.io/api."""

from __future__ import annotations

import base64

from lab.apiserver.errors import ApiError

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def fields(buf: bytes) -> list[tuple[int, int, object]]:
    """(field number, wire type, value) in order; length-delimited values stay bytes."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise ValueError("truncated field")
            value, pos = buf[pos:pos + length], pos + length
        elif wire == 1:
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wire == 5:
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        out.append((number, wire, value))
    return out


# A message schema: field number -> (json name, kind), kind one of "str", "int", "bool", "strs", "strmap",
# "bytesmap" (base64 in JSON), a nested schema dict, ("list", schema), or ("map", schema) for map<string, message>.
_OWNER_REF = {1: ("kind", "str"), 3: ("name", "str"), 4: ("uid", "str"), 5: ("apiVersion", "str"),
              6: ("controller", "bool"), 7: ("blockOwnerDeletion", "bool")}
_OBJECT_META = {1: ("name", "str"), 2: ("generateName", "str"), 3: ("namespace", "str"),
                6: ("resourceVersion", "str"), 5: ("uid", "str"), 11: ("labels", "strmap"),
                12: ("annotations", "strmap"), 13: ("ownerReferences", ("list", _OWNER_REF)),
                14: ("finalizers", "strs")}
_SUBJECT = {1: ("kind", "str"), 2: ("apiGroup", "str"), 3: ("name", "str"), 4: ("namespace", "str")}
_ROLE_REF = {1: ("apiGroup", "str"), 2: ("kind", "str"), 3: ("name", "str")}
_POLICY_RULE = {1: ("verbs", "strs"), 2: ("apiGroups", "strs"), 3: ("resources", "strs"),
                4: ("resourceNames", "strs"), 5: ("nonResourceURLs", "strs")}
_LABEL_SELECTOR = {1: ("matchLabels", "strmap"), 2: ("matchExpressions", ("list", {
    1: ("key", "str"), 2: ("operator", "str"), 3: ("values", "strs")}))}
_NAME_REF = {3: ("name", "str")}
_RESOURCE_ATTRS = {1: ("namespace", "str"), 2: ("verb", "str"), 3: ("group", "str"), 4: ("version", "str"),
                   5: ("resource", "str"), 6: ("subresource", "str"), 7: ("name", "str")}
_NON_RESOURCE_ATTRS = {1: ("path", "str"), 2: ("verb", "str")}
_EXTRA_VALUE = {1: ("items", "strs")}

_SCHEMAS = {
    "SelfSubjectReview": {1: ("metadata", _OBJECT_META)},
    "SelfSubjectAccessReview": {1: ("metadata", _OBJECT_META), 2: ("spec", {
        1: ("resourceAttributes", _RESOURCE_ATTRS), 2: ("nonResourceAttributes", _NON_RESOURCE_ATTRS)})},
    "SelfSubjectRulesReview": {1: ("metadata", _OBJECT_META), 2: ("spec", {1: ("namespace", "str")})},
    "SubjectAccessReview": {1: ("metadata", _OBJECT_META), 2: ("spec", {
        1: ("resourceAttributes", _RESOURCE_ATTRS), 2: ("nonResourceAttributes", _NON_RESOURCE_ATTRS),
        3: ("user", "str"), 4: ("groups", "strs"), 5: ("extra", ("map", _EXTRA_VALUE)), 6: ("uid", "str")})},
    "LocalSubjectAccessReview": {1: ("metadata", _OBJECT_META), 2: ("spec", {
        1: ("resourceAttributes", _RESOURCE_ATTRS), 2: ("nonResourceAttributes", _NON_RESOURCE_ATTRS),
        3: ("user", "str"), 4: ("groups", "strs"), 5: ("extra", ("map", _EXTRA_VALUE)), 6: ("uid", "str")})},
    "TokenReview": {1: ("metadata", _OBJECT_META), 2: ("spec", {1: ("token", "str"), 2: ("audiences", "strs")})},
    "RoleBinding": {1: ("metadata", _OBJECT_META), 2: ("subjects", ("list", _SUBJECT)), 3: ("roleRef", _ROLE_REF)},
    "ClusterRoleBinding": {1: ("metadata", _OBJECT_META), 2: ("subjects", ("list", _SUBJECT)),
                           3: ("roleRef", _ROLE_REF)},
    "Role": {1: ("metadata", _OBJECT_META), 2: ("rules", ("list", _POLICY_RULE))},
    "ClusterRole": {1: ("metadata", _OBJECT_META), 2: ("rules", ("list", _POLICY_RULE)),
                    3: ("aggregationRule", {1: ("clusterRoleSelectors", ("list", _LABEL_SELECTOR))})},
    "ServiceAccount": {1: ("metadata", _OBJECT_META), 2: ("secrets", ("list", _NAME_REF)),
                       3: ("imagePullSecrets", ("list", {1: ("name", "str")})),
                       4: ("automountServiceAccountToken", "bool")},
    "ConfigMap": {1: ("metadata", _OBJECT_META), 2: ("data", "strmap"), 3: ("binaryData", "bytesmap"),
                  4: ("immutable", "bool")},
    "Secret": {1: ("metadata", _OBJECT_META), 2: ("data", "bytesmap"), 3: ("type", "str"),
               4: ("stringData", "strmap"), 5: ("immutable", "bool")},
    "Namespace": {1: ("metadata", _OBJECT_META), 2: ("spec", {1: ("finalizers", "strs")})},
    "TokenRequest": {1: ("metadata", _OBJECT_META), 2: ("spec", {
        1: ("audiences", "strs"), 4: ("expirationSeconds", "int"),
        3: ("boundObjectRef", {1: ("kind", "str"), 2: ("apiVersion", "str"), 3: ("name", "str"),
                               4: ("uid", "str")})})},
}


def _decode(buf: bytes, schema: dict) -> dict:
    out: dict = {}
    for number, _wire, value in fields(buf):
        if number not in schema:
            continue
        name, kind = schema[number]
        if kind == "str":
            out[name] = value.decode()
        elif kind == "int":
            out[name] = value
        elif kind == "bool":
            out[name] = bool(value)
        elif kind == "strs":
            out.setdefault(name, []).append(value.decode())
        elif kind in ("strmap", "bytesmap"):
            entry = {n: v for n, _w, v in fields(value)}
            raw = entry.get(2, b"")
            out.setdefault(name, {})[entry.get(1, b"").decode()] = (
                raw.decode() if kind == "strmap" else base64.b64encode(raw).decode())
        elif isinstance(kind, tuple) and kind[0] == "list":
            out.setdefault(name, []).append(_decode(value, kind[1]))
        elif isinstance(kind, tuple) and kind[0] == "map":
            entry = {n: v for n, _w, v in fields(value)}
            inner = _decode(entry.get(2, b""), kind[1])
            out.setdefault(name, {})[entry.get(1, b"").decode()] = inner.get("items", [])
        elif isinstance(kind, dict):
            out[name] = _decode(value, kind)
    return out


def decode(body: bytes) -> dict:
    """The JSON-equivalent dict of a protobuf-encoded review or token request; 415 for any other kind."""
    if not body.startswith(MAGIC):
        raise ApiError(400, "BadRequest", "the protobuf body lacks the k8s\\0 envelope")
    try:
        envelope = {n: v for n, _w, v in fields(body[len(MAGIC):])}
        type_meta = {n: v for n, _w, v in fields(envelope.get(1, b""))}
        api_version = type_meta.get(1, b"").decode()
        kind = type_meta.get(2, b"").decode()
        schema = _SCHEMAS.get(kind)
        if schema is None:
            raise ApiError(415, "UnsupportedMediaType",
                           f"this server does not read protobuf for {kind}; "
                           "send application/json")
        obj = _decode(envelope.get(2, b""), schema)
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"the protobuf body could not be decoded: {exc}")
    obj["apiVersion"], obj["kind"] = api_version, kind
    return obj
