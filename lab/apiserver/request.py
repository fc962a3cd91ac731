"""What the emulated kube-apiserver makes of a request before serving it: its parts and verb (as
kube-apiserver's RequestInfoFactory), the media types asked for, the write it reports to the hooks; and the
constants and helpers the serving code shares."""

from __future__ import annotations

import copy
import json
import os
import pathlib
import ssl
import tempfile
from dataclasses import dataclass, field

import yaml
from aiohttp import web

from lab.apiserver import errors, table
from lab.apiserver.auth import rbac, reviews
from lab.apiserver.auth.authn import Authenticator
from lab.apiserver.auth.tokens import ServiceAccountIssuer
from lab.apiserver.auth.types import Attributes, UserInfo
from lab.apiserver.hooks import Write



LAB_CRDS = pathlib.Path(__file__).parent / "crds"
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
MAX_BODY = 3 * 1024 * 1024   # kube-apiserver's request body limit
# Health checks: the paths under these answer "ok" too (healthz/ping, readyz/etcd ...); who may read them is RBAC's.
HEALTH_PREFIXES = ("/healthz/", "/readyz/", "/livez/")
NAMESPACE_SUBRESOURCES = {"status", "finalize"}

REVIEWS = {
    ("authentication.k8s.io", "tokenreviews"): reviews.token_review,
    ("authentication.k8s.io", "selfsubjectreviews"): reviews.self_subject_review,
    ("authorization.k8s.io", "subjectaccessreviews"): reviews.subject_access_review,
    ("authorization.k8s.io", "localsubjectaccessreviews"): reviews.local_subject_access_review,
    ("authorization.k8s.io", "selfsubjectaccessreviews"): reviews.self_subject_access_review,
    ("authorization.k8s.io", "selfsubjectrulesreviews"): reviews.self_subject_rules_review,
}


def dump(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def json_response(obj, status: int = 200, headers=None) -> web.Response:
    return web.Response(body=dump(obj), status=status, content_type="application/json", headers=headers)


@dataclass
class ReviewContext:
    """What the auth code's review handlers get for a request."""

    user: UserInfo
    namespace: str | None
    name: str | None
    authorizer: rbac.Authorizer
    authenticator: Authenticator
    sa_issuer: ServiceAccountIssuer
    list_objects: object


@dataclass
class RequestInfo:
    """A request as kube-apiserver's RequestInfoFactory sees it."""

    resource_request: bool
    verb: str
    path: str
    group: str = ""
    version: str = ""
    plural: str = ""
    namespace: str | None = None
    name: str | None = None
    subresource: str = ""
    query: dict = field(default_factory=dict)
    # A list or watch narrowed to one name by `fieldSelector=metadata.name=x` is authorized as a request for
    # that name, so a role with resourceNames can watch its one object (kube-apiserver's RequestInfoFactory).
    selected_name: str = ""

    def attributes(self) -> Attributes:
        if not self.resource_request:
            return Attributes(verb=self.verb, resource_request=False, path=self.path)
        return Attributes(verb=self.verb, resource_request=True, api_group=self.group, resource=self.plural,
                          subresource=self.subresource, namespace=self.namespace or "",
                          name=self.name or self.selected_name)


def single_name(field_selector: str | None) -> str:
    """The name a field selector requires exactly (`metadata.name=x` or `==`), else ""."""
    found = ""
    for term in (field_selector or "").split(","):
        key, sep, value = term.partition("==") if "==" in term else term.partition("=")
        if sep and not key.endswith("!") and key.strip() == "metadata.name":
            found = value.strip()
    return found


def parse_request(method: str, path: str, query) -> RequestInfo:
    """Split /api/v1/namespaces/ns/configmaps/x/status into its parts, and name the verb."""
    http_verb = method.lower()
    parts = [p for p in path.split("/") if p]
    if not parts or parts[0] not in ("api", "apis"):
        return RequestInfo(False, http_verb, path)
    if parts[0] == "api":
        if len(parts) < 2:
            return RequestInfo(False, http_verb, path)
        group, version, rest = "", parts[1], parts[2:]
    else:
        if len(parts) < 3:
            return RequestInfo(False, http_verb, path)
        group, version, rest = parts[1], parts[2], parts[3:]
    if not rest:
        return RequestInfo(False, http_verb, path)
    watch_prefix = False
    if rest[0] == "watch":
        watch_prefix, rest = True, rest[1:]
    info = RequestInfo(True, "", path, group=group, version=version, query=dict(query))
    if len(rest) >= 2 and rest[0] == "namespaces":
        info.namespace = rest[1]
        if len(rest) > 2 and rest[2] not in NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
        else:
            rest = ["namespaces", rest[1]] + rest[2:]
    if not rest:
        raise errors.ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    info.plural = rest[0]
    if len(rest) > 1:
        info.name = rest[1]
    if len(rest) > 2:
        info.subresource = rest[2]
    if len(rest) > 3:
        raise errors.ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    watching = watch_prefix or str(query.get("watch", "")).lower() in ("true", "1")
    if http_verb == "get":
        info.verb = "watch" if watching else ("get" if info.name else "list")
    elif http_verb == "post":
        info.verb = "create"
    elif http_verb == "put":
        info.verb = "update"
    elif http_verb == "patch":
        info.verb = "patch"
    elif http_verb == "delete":
        info.verb = "delete" if info.name else "deletecollection"
    else:
        info.verb = http_verb
    if info.verb in ("list", "watch") and not info.name:
        info.selected_name = single_name(query.get("fieldSelector"))
    return info


def accepts_table(accept: str) -> bool:
    return table.table_version(accept) is not None


def prefers_yaml(accept: str) -> bool:
    first = accept.split(",")[0].split(";")[0].strip().lower() if accept else ""
    return first == "application/yaml"


def check_accept(accept: str) -> None:
    if not accept:
        return
    for part in accept.split(","):
        media = part.split(";")[0].strip().lower()
        if media in ("application/json", "*/*", "application/*", "application/yaml", "") or media.endswith("+json"):
            return
    raise errors.ApiError(406, "NotAcceptable",
                          f"only application/json is served here, not {accept}; ask for application/json")


def server_ssl(cert_pem: bytes, key_pem: bytes, client_ca_pem: bytes) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # ssl can only load a key pair from files; they live for the call only, in a private directory.
    with tempfile.TemporaryDirectory() as tmp:
        cert_file, key_file = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        with open(cert_file, "wb") as f:
            f.write(cert_pem)
        with os.fdopen(os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(key_pem)
        ctx.load_cert_chain(cert_file, key_file)
    ctx.load_verify_locations(cadata=client_ca_pem.decode())
    # Client certificates are asked for but optional: tokens authenticate the rest, as in kube-apiserver.
    ctx.verify_mode = ssl.CERT_OPTIONAL
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def load_yaml_documents(path: pathlib.Path) -> list[dict]:
    files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".json")) if path.is_dir() else [path]
    out = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            out += [d for d in yaml.load_all(fh, Loader=yaml.CSafeLoader) if d]
    return out


def copy_if(body, copied: bool):
    """The body itself for the write that counts; a deep copy for a dry run whose result admission reviews (the
    writes change the dicts they are handed)."""
    return copy.deepcopy(dict(body)) if copied else body


def write_of(info: RequestInfo, user: UserInfo, response: web.StreamResponse) -> Write:
    """The write a successful answer reports, with the object its body carries (a create names its object only
    there)."""
    obj = None
    if isinstance(response, web.Response) and isinstance(response.body, bytes) and response.body:
        try:
            parsed = json.loads(response.body)
            obj = parsed if isinstance(parsed, dict) else None
        except ValueError:
            obj = None
    name = info.name or ((obj or {}).get("metadata") or {}).get("name") or ""
    resource = info.plural + (f"/{info.subresource}" if info.subresource else "")
    return Write(info.verb, resource, info.namespace, name, user.username, obj)

