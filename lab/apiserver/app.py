"""The emulated kube-apiserver: an aiohttp TLS server that authenticates and authorizes every request, routes it
as kube-apiserver's request-info parser does, and answers with the store's objects, tables, watch streams and
Status errors. The rules live in the other modules of this package; this file moves data in and out."""

from __future__ import annotations

import asyncio
import base64
import collections
import dataclasses
import copy
import json
import logging
import os
import pathlib
import secrets
import ssl
import tempfile
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterable

import yaml
from aiohttp import web
from multidict import CIMultiDict

from lab.apiserver import admission, conversion, decoding, discovery, errors, events, patch, protobuf, table, validation
from lab.apiserver.authcache import AuthCache
from lab.apiserver.auth import impersonation, ownerrefs, rbac, reviews, sensitive
from lab.apiserver.auth.authn import ANONYMOUS, Authenticator, bearer_token
from lab.apiserver.auth.tokens import ServiceAccountIssuer
from lab.apiserver.auth.types import Attributes, UserInfo
from lab.apiserver.crud import CRD_KEY, Objects
from lab.apiserver.gc import GarbageCollector
from lab.apiserver.hooks import WRITE_VERBS, Write, WriteHooks
from lab.apiserver.resources import Registry, ResourceInfo
from lab.apiserver.selectors import field_predicate, label_predicate
from lab.apiserver.store import Store

log = logging.getLogger(__name__)

LAB_CRDS = pathlib.Path(__file__).parent / "crds"
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
MAX_BODY = 3 * 1024 * 1024   # kube-apiserver's request body limit
# Health checks: the paths under these answer "ok" too (healthz/ping, readyz/etcd ...); who may read them is RBAC's.
HEALTH_PREFIXES = ("/healthz/", "/readyz/", "/livez/")
NAMESPACE_SUBRESOURCES = {"status", "finalize"}

_REVIEWS = {
    ("authentication.k8s.io", "tokenreviews"): reviews.token_review,
    ("authentication.k8s.io", "selfsubjectreviews"): reviews.self_subject_review,
    ("authorization.k8s.io", "subjectaccessreviews"): reviews.subject_access_review,
    ("authorization.k8s.io", "localsubjectaccessreviews"): reviews.local_subject_access_review,
    ("authorization.k8s.io", "selfsubjectaccessreviews"): reviews.self_subject_access_review,
    ("authorization.k8s.io", "selfsubjectrulesreviews"): reviews.self_subject_rules_review,
}


def _dump(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _json_response(obj, status: int = 200, headers=None) -> web.Response:
    return web.Response(body=_dump(obj), status=status, content_type="application/json", headers=headers)


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


def _single_name(field_selector: str | None) -> str:
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
        info.selected_name = _single_name(query.get("fieldSelector"))
    return info


def _accepts_table(accept: str) -> bool:
    return table.table_version(accept) is not None


def _prefers_yaml(accept: str) -> bool:
    first = accept.split(",")[0].split(";")[0].strip().lower() if accept else ""
    return first == "application/yaml"


def _check_accept(accept: str) -> None:
    if not accept:
        return
    for part in accept.split(","):
        media = part.split(";")[0].strip().lower()
        if media in ("application/json", "*/*", "application/*", "application/yaml", "") or media.endswith("+json"):
            return
    raise errors.ApiError(406, "NotAcceptable",
                          f"only application/json is served here, not {accept}; ask for application/json")


def _server_ssl(cert_pem: bytes, key_pem: bytes, client_ca_pem: bytes) -> ssl.SSLContext:
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


def _load_yaml_documents(path: pathlib.Path) -> list[dict]:
    files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".json")) if path.is_dir() else [path]
    out = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            out += [d for d in yaml.safe_load_all(fh) if d]
    return out


def _copied(body, copied: bool):
    """The body itself for the write that counts; a deep copy for a dry run whose result admission reviews (the
    writes change the dicts they are handed)."""
    return copy.deepcopy(dict(body)) if copied else body


def _write_of(info: RequestInfo, user: UserInfo, response: web.StreamResponse) -> Write:
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


class ApiServer:
    """One emulated cluster's kube-apiserver (and the controllers of kube-controller-manager it needs)."""

    def __init__(self, *, name: str, crd_paths: list[pathlib.Path], serving_cert_pem: bytes, serving_key_pem: bytes,
                 client_ca_pem: bytes, issuer_url: str | None = None, oidc=(), bookmark_interval: float = 60.0,
                 history: int = 1000, watch_queue: int = 1000, without_crds: Iterable[str] = ()) -> None:
        self.name = name
        self.url = ""
        self.port = 0
        self.bookmark_interval = bookmark_interval
        self._ssl = _server_ssl(serving_cert_pem, serving_key_pem, client_ca_pem)
        self._issuer_fixed = issuer_url is not None
        self.sa_issuer = ServiceAccountIssuer(issuer_url or "https://127.0.0.1")
        self.store = Store(history=history, watch_queue=watch_queue)
        self.registry = Registry()
        self.objects = Objects(self.store, self.registry)
        self.gc = GarbageCollector(self.objects)
        #: Callbacks run right after a given write over HTTP landed (hooks.py; the join's crash tests).
        self.write_hooks = WriteHooks()
        self._oidc = list(oidc)
        self.authenticator = Authenticator(client_ca_pem, self.sa_issuer, self._oidc, self.list_objects)
        self.authorizer = rbac.Authorizer(self.list_objects)
        self.auth_cache = AuthCache()
        self.store.listeners.append(self._forget_authentications)
        # RBAC decisions are a pure function of the user, the request and the RBAC objects: kept until any RBAC
        # object changes, so a benchmark's repeated requests do not re-evaluate every binding each time.
        self._decisions: dict[tuple, object] = {}
        self.store.listeners.append(self._forget_decisions)
        self._apply_previous: dict[tuple, dict] = {}   # (key, ns, name, manager) -> last applied config
        self._snapshots: collections.OrderedDict[str, tuple[list, int]] = collections.OrderedDict()
        self._runner: web.AppRunner | None = None
        self._watchers: set = set()
        self._stopping = False
        # Aggregated APIs whose backend is down: group -> versions (see add_unavailable_api).
        self.unavailable_apis: dict[str, list[str]] = {}
        self.store.listeners.append(self._close_watches_of_removed_crds)
        for ns in DEFAULT_NAMESPACES:
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for obj in rbac.bootstrap_objects():
            self.create(obj)
        # Every CRD this server knows, installed at start unless left out; install_crd adds one later.
        self.crd_documents: dict[str, dict] = {}
        for path in [LAB_CRDS, *[pathlib.Path(p) for p in crd_paths]]:
            for doc in _load_yaml_documents(path):
                if doc.get("kind") != "CustomResourceDefinition":
                    continue
                if doc["metadata"]["name"] in self.crd_documents:
                    raise ValueError(f"CRD {doc['metadata']['name']} is given twice (again in {path}); pass each "
                                     "CRD file once")
                self.crd_documents[doc["metadata"]["name"]] = doc
        left_out = set(without_crds)
        unknown = sorted(left_out - set(self.crd_documents))
        if unknown:
            raise ValueError(f"cannot start without CRD {', '.join(unknown)}: no such CRD is loaded; name one of "
                             f"{', '.join(sorted(self.crd_documents))}")
        for crd_name, doc in self.crd_documents.items():
            if crd_name not in left_out:
                self.create(doc)

    # ------------------------------------------------------------ lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=self._ssl)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.url = f"https://{host}:{self.port}"
        if not self._issuer_fixed:
            self.sa_issuer.issuer_url = self.url
        self.gc.start()

    async def stop(self) -> None:
        self._stopping = True
        for w in list(self._watchers):
            w.overflowed = True
            try:
                w.queue.put_nowait(None)
            except asyncio.QueueFull:
                pass
        await self.gc.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def add_oidc(self, authenticator) -> None:
        """Trust another OIDC issuer for bearer tokens (the lab's Dex starts after the API server)."""
        self._oidc.append(authenticator)

    # ------------------------------------------------------------ what is served, changed at run time

    def install_crd(self, name: str) -> dict:
        """Create one of the known CRDs (e.g. one left out at start) while the server runs; clients see it in
        discovery at once, as after `kubectl apply` of the CRD. 409 if it is installed already."""
        doc = self.crd_documents.get(name)
        if doc is None:
            raise ValueError(f"no CRD {name!r} is known to this server; name one of "
                             f"{', '.join(sorted(self.crd_documents))}")
        return self.create(doc)

    def crd_installed(self, name: str) -> bool:
        return self.store.get(CRD_KEY, None, name) is not None

    def add_unavailable_api(self, group: str, version: str = "v1beta1") -> None:
        """Register an aggregated API (an APIService) whose backend does not answer, as kube-aggregator shows it:
        `/apis` lists the group, aggregated discovery lists the version as Stale with no resources, and every
        request under `/apis/<group>/<version>` (after authentication and authorization) is 503
        "service unavailable" in plain text."""
        if not group or "." not in group:
            raise ValueError(f"API group {group!r}: an aggregated API's group is a DNS name such as metrics.k8s.io")
        if self.registry.versions(group):
            raise ValueError(f"API group {group!r} is served here already (by a CRD or a built-in); choose another")
        versions = self.unavailable_apis.setdefault(group, [])
        if version not in versions:
            versions.append(version)

    def remove_unavailable_api(self, group: str, version: str | None = None) -> None:
        """Take an unavailable API away again (one version, or the whole group)."""
        versions = self.unavailable_apis.get(group, [])
        if version is None:
            versions.clear()
        elif version in versions:
            versions.remove(version)
        if not versions:
            self.unavailable_apis.pop(group, None)

    def _unavailable(self, group: str, version: str) -> bool:
        return version in self.unavailable_apis.get(group, ())

    def _close_watches_of_removed_crds(self, key, ev) -> None:
        # A deleted CRD takes its resource's watch streams with it: they end, as kube-apiserver closes them.
        if key == CRD_KEY and ev.type == "DELETED":
            spec = (ev.old or ev.obj).get("spec") or {}
            self.store.close_watchers((spec.get("group", ""), (spec.get("names") or {}).get("plural", "")))

    # ------------------------------------------------------------ in-process access (no HTTP, no auth)

    def list_objects(self, group: str, plural: str, namespace: str | None) -> list[dict]:
        return self.store.list((group, plural), namespace)

    def _info(self, group: str, plural: str) -> ResourceInfo:
        info = self.registry.any_version(group, plural)
        if info is None:
            raise errors.ApiError(404, "NotFound", f"the server doesn't have a resource type "
                                                   f'"{errors.resource_label(group, plural)}"')
        return info

    def _info_of(self, obj: dict) -> ResourceInfo:
        info = self.registry.by_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
        if info is None:
            raise errors.ApiError(404, "NotFound", f'no resource of kind {obj.get("kind")!r} in '
                                                   f'{obj.get("apiVersion")!r} is served here')
        return info

    def _stored_form(self, group: str, plural: str):
        """The store key of a resource, and how to show its stored objects (events.k8s.io are core events).

        A resource that is not served (its CRD not installed) is 404, as it is over HTTP."""
        self._info(group, plural)
        if group == events.EVENTS_GROUP and plural == "events":
            return events.CORE_KEY, events.from_core
        return (group, plural), copy.deepcopy

    def get(self, group: str, plural: str, name: str, namespace: str | None = None) -> dict | None:
        key, show = self._stored_form(group, plural)
        obj = self.store.get(key, namespace, name)
        return show(copy.deepcopy(obj)) if obj is not None else None

    def list(self, group: str, plural: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict]:
        key, show = self._stored_form(group, plural)
        match = label_predicate(label_selector)
        return [show(copy.deepcopy(o)) for o in self.store.list(key, namespace) if match is None or match(o)]

    def create(self, obj: dict) -> dict:
        info = self._info_of(obj)
        ns = (obj.get("metadata") or {}).get("namespace")
        stored, _ = self.objects.create(info, copy.deepcopy(obj), ns, field_validation="Ignore")
        return copy.deepcopy(stored)

    def update(self, obj: dict, subresource: str | None = None) -> dict:
        info = self._info_of(obj)
        meta = obj.get("metadata") or {}
        stored, _ = self.objects.update(info, copy.deepcopy(obj), meta.get("namespace"), meta.get("name", ""),
                                        subresource=subresource, field_validation="Ignore")
        return copy.deepcopy(stored)

    def delete(self, group: str, plural: str, name: str, namespace: str | None = None) -> None:
        self.objects.delete(self._info(group, plural), namespace, name)

    async def watch(self, group: str, plural: str, namespace: str | None = None,
                    resource_version: str | None = None) -> AsyncIterator[tuple[str, dict]]:
        """Events of a resource: ADDED for what exists (without a resource_version), then every change."""
        key, show = self._stored_form(group, plural)
        rv = int(resource_version) if resource_version else None
        initial = None if rv else self.store.list(key, namespace)
        w = self.store.watch(key, namespace, None, rv, initial)
        self._watchers.add(w)
        try:
            while True:
                item = await w.queue.get()
                if self._stopping or (item is None and w.closed):
                    return   # the server stops or the CRD went: the stream ends, as kube-apiserver closes it
                if item is None or w.overflowed:
                    raise errors.gone("the watch fell too far behind and was closed; list again and watch from "
                                      "the new resourceVersion")
                yield item[0], show(copy.deepcopy(item[1]))
        finally:
            self._watchers.discard(w)
            self.store.unwatch(key, w)

    # ------------------------------------------------------------ HTTP

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._serve(request)
        except errors.PageNotFound:
            return web.Response(status=404, text="404 page not found\n", content_type="text/plain",
                                headers={"X-Content-Type-Options": "nosniff"})
        except errors.ApiError as exc:
            return _json_response(exc.status(), exc.code)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except web.HTTPRequestEntityTooLarge:
            return _json_response(errors.ApiError(
                413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_BODY}").status(), 413)
        except Exception:
            log.exception("internal error serving %s %s", request.method, request.path)
            return _json_response(errors.ApiError(500, "InternalError",
                                                  "an internal error occurred; the server log has the details")
                                  .status(), 500)

    def _forget_authentications(self, key, ev) -> None:
        # A ServiceAccount deleted or re-created revokes its tokens at once, cache or not.
        if key == ("", "serviceaccounts") and ev.type != "ADDED":
            self.auth_cache.clear()

    def _forget_decisions(self, key, ev) -> None:
        if key[0] == "rbac.authorization.k8s.io":
            self._decisions.clear()

    def authorize(self, user: UserInfo, attrs: Attributes):
        """The RBAC decision for a request, from the cache while no RBAC object changed."""
        key = (user.username, user.groups, attrs)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self.authorizer.authorize(user, attrs)
            if len(self._decisions) >= 10000:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    async def _authenticate(self, request: web.Request) -> UserInfo | None:
        der = None
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
        if ssl_object is not None:
            der = ssl_object.getpeercert(binary_form=True)
        key = self.auth_cache.key(request.headers, der)
        user = self.auth_cache.get(key)
        if user is None:
            user = await self.authenticator.authenticate(request.headers, der)
            if user is not None:
                self.auth_cache.put(key, user)
        return user

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        user = await self._authenticate(request)
        if user is None:
            # A credential that does not authenticate is 401 wherever it is sent; no credential at all is the
            # anonymous user, whom RBAC lets read /version and the health checks (system:public-info-viewer), as a
            # kube-apiserver with anonymous requests on (kubeadm's default) does.
            if bearer_token(request.headers) is not None:
                raise errors.ApiError(401, "Unauthorized", "Unauthorized")
            user = ANONYMOUS
        if impersonation.impersonation_headers(request.headers):
            # Impersonate-* headers, honoured after authentication when RBAC allows the impersonate verb.
            user = impersonation.impersonate(user, request.headers, self.authorizer)
        info = parse_request(request.method, path, request.query)
        attrs = info.attributes()
        decision = self.authorize(user, attrs)
        if not decision.allowed:
            raise rbac.forbidden(user, attrs, "")
        if self.unavailable_apis:
            parts = path.split("/")
            if len(parts) >= 4 and parts[1] == "apis" and self._unavailable(parts[2], parts[3]):
                # kube-aggregator's proxy for an APIService that is not Available: plain text, not a Status.
                return web.Response(status=503, text="service unavailable\n", charset="utf-8",
                                    content_type="text/plain", headers={"X-Content-Type-Options": "nosniff"})
        _check_accept(request.headers.get("Accept", ""))
        if not info.resource_request:
            return await self._non_resource(request, info)
        response = await self._resource(request, info, user)
        if self.write_hooks.hooks and info.verb in WRITE_VERBS and response.status < 300 and \
                "dryRun" not in request.query:
            self.write_hooks.landed(_write_of(info, user, response))
        return response

    # ------------------------------------------------------------ non-resource paths

    async def _non_resource(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        path = info.path.rstrip("/") or "/"
        if request.method not in ("GET", "HEAD"):
            raise errors.ApiError(405, "MethodNotAllowed", f"{request.method} is not supported on {path}")
        accept = request.headers.get("Accept", "")
        if path in ("/healthz", "/readyz", "/livez") or path.startswith(HEALTH_PREFIXES):
            return web.Response(text="ok", content_type="text/plain")
        if path == "/version":
            return _json_response(discovery.KUBE_VERSION)
        if path == "/.well-known/openid-configuration":
            return _json_response(self.sa_issuer.discovery_document())
        if path == "/openid/v1/jwks":
            # kube-apiserver serves the keys only as application/jwk-set+json: an Accept that names neither it nor
            # */* (application/json alone, as most clients send; application/* too) is a 406 Status.
            media = {part.split(";")[0].strip().lower() for part in accept.split(",")} if accept else {"*/*"}
            if not media & {"application/jwk-set+json", "*/*"}:
                raise errors.ApiError(406, "NotAcceptable",
                                      "406: Not Acceptable\n\nAvailable representations: application/jwk-set+json")
            return web.Response(body=_dump(self.sa_issuer.jwks()), content_type="application/jwk-set+json")
        if path == "/api":
            if discovery.wants_aggregated(accept):
                return web.Response(body=_dump(discovery.aggregated(self.registry, legacy=True)),
                                    headers={"Content-Type": discovery.AGGREGATED_CONTENT_TYPE})
            return _json_response(discovery.api_versions(f"127.0.0.1:{self.port}"))
        if path == "/apis":
            if discovery.wants_aggregated(accept):
                return web.Response(body=_dump(discovery.aggregated(self.registry, legacy=False,
                                                                    unavailable=self.unavailable_apis)),
                                    headers={"Content-Type": discovery.AGGREGATED_CONTENT_TYPE})
            return _json_response(discovery.api_group_list(self.registry, self.unavailable_apis))
        parts = [p for p in path.split("/") if p]
        if not parts:
            paths = ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/openapi/v3", "/readyz", "/version",
                     "/.well-known/openid-configuration", "/openid/v1/jwks"]
            for g in self.registry.groups():
                if g:
                    paths += [f"/apis/{g}"] + [f"/apis/{g}/{v}" for v in self.registry.versions(g)]
            for g, versions in self.unavailable_apis.items():
                paths += [f"/apis/{g}"] + [f"/apis/{g}/{v}" for v in versions]
            return _json_response({"paths": sorted(paths)})
        if parts[0] == "api" and len(parts) == 2:
            doc = discovery.resource_list(self.registry, "", parts[1])
            if doc:
                return _json_response(doc)
        if parts[0] == "apis" and len(parts) == 2:
            doc = discovery.api_group(self.registry, parts[1], self.unavailable_apis)
            if doc:
                return _json_response(doc)
        if parts[0] == "apis" and len(parts) == 3:
            doc = discovery.resource_list(self.registry, parts[1], parts[2])
            if doc:
                return _json_response(doc)
        if path == "/openapi/v3":
            return _json_response(discovery.openapi_v3_root(self.registry))
        if parts[:2] == ["openapi", "v3"] and len(parts) >= 4:
            group, version = ("", parts[3]) if parts[2] == "api" else (parts[3], parts[4] if len(parts) > 4 else "")
            doc = discovery.openapi_v3_document(self.registry, group, version)
            if doc:
                return _json_response(doc)
        raise errors.ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")

    # ------------------------------------------------------------ resource requests

    def _resource_info(self, info: RequestInfo) -> ResourceInfo:
        res = self.registry.get(info.group, info.version, info.plural)
        if res is None:
            raise errors.PageNotFound()
        if res.namespaced and info.namespace is None and (info.name or info.verb == "create"):
            raise errors.ApiError(404, "NotFound", f"{info.plural} is namespaced: name the namespace in the path "
                                                   f"(/namespaces/<ns>/{info.plural}/{info.name})")
        if not res.namespaced and info.plural != "namespaces" and info.namespace is not None:
            # A cluster-scoped resource under /namespaces/<ns>/: kube-apiserver serves no such path.
            raise errors.ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if info.subresource and info.subresource not in res.subresources:
            if res.custom and info.name:
                # kube-apiserver serves no such path for a custom resource: the object "is not found" there.
                raise errors.not_found(res.group, res.plural, info.name)
            raise errors.ApiError(404, "NotFound", f'{info.plural} has no subresource "{info.subresource}"')
        if info.verb not in res.verbs and not info.subresource:
            raise errors.ApiError(405, "MethodNotAllowed",
                                  f"{info.verb} is not supported on {info.plural}; it supports {', '.join(res.verbs)}")
        return res

    def _masker(self, res: ResourceInfo, user: UserInfo, attrs: Attributes):
        """A function presenting objects to this user: version and sensitive-field masking."""
        must_mask = bool(res.sensitive_paths) and not self.authorize(
            user, sensitive.sensitive_attributes(attrs)).allowed
        paths = list(res.sensitive_paths)
        api_version = res.group_version

        def present(obj: dict) -> dict:
            if res.storage == events.CORE_KEY:
                obj = events.from_core(obj, res.version)
            elif res.custom:
                obj = conversion.to_version(res, obj)
            elif obj.get("apiVersion") not in (None, api_version):
                obj = dict(obj, apiVersion=api_version)
            return sensitive.mask(obj, paths) if must_mask else obj

        return present

    async def _body(self, request: web.Request, allow_yaml: bool = True):
        raw = await request.read()
        if not raw:
            raise errors.bad_request("the request needs a body: the object to write, as JSON")
        ctype = request.content_type
        if ctype == protobuf.MEDIA_TYPE:
            return protobuf.decode(raw)
        try:
            if ctype in ("application/yaml", patch.APPLY_YAML) and allow_yaml:
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(f"the body is not valid {'YAML' if 'yaml' in ctype else 'JSON'}: {exc}")

    async def _decoded_body(self, request: web.Request, res: ResourceInfo, field_validation: str):
        """The object of a create or update (`decoding.Body`, with its decoding's warnings)."""
        raw = await request.read()
        if request.content_type in ("application/json", "") and raw:
            body = decoding.strict_json(raw, res, field_validation)
            if body is not None:
                return body
        body = await self._body(request)
        return decoding.Body(body, []) if isinstance(body, dict) else body

    @staticmethod
    def _field_validation(query, options_kind: str = "PatchOptions") -> str:
        value = query.get("fieldValidation", "Warn") or "Warn"
        if value not in ("Strict", "Warn", "Ignore"):
            raise errors.invalid(options_kind, "meta.k8s.io", "", [validation.cause(
                "FieldValueNotSupported", "fieldValidation", f"Unsupported value: {json.dumps(value)}: supported "
                'values: "", "Ignore", "Strict", "Warn"')])
        return value

    @staticmethod
    def _dry_run(query) -> bool:
        values = query.getall("dryRun", []) if hasattr(query, "getall") else []
        if any(v not in ("All",) for v in values):
            raise errors.bad_request('dryRun accepts only "All"')
        return bool(values)

    @staticmethod
    def _warnings_header(warnings: list[str]) -> CIMultiDict:
        # One Warning header per warning, as kube-apiserver sends them.
        return CIMultiDict(("Warning", "299 - " + json.dumps(w)) for w in warnings)

    async def _resource(self, request: web.Request, info: RequestInfo, user: UserInfo) -> web.StreamResponse:
        res = self._resource_info(info)
        attrs = info.attributes()
        query = request.query
        verb = info.verb
        if res.create_only or (res.key == ("", "serviceaccounts") and info.subresource == "token"):
            return await self._review(request, info, res, user)
        if verb == "get":
            obj = self._get_or_404(res, info)
            present = self._masker(res, user, attrs)
            if info.subresource and info.subresource != "status":
                raise errors.ApiError(405, "MethodNotAllowed", f"get is not supported on {info.subresource}")
            return self._respond_objects(request, res, [present(obj)], single=True)
        if verb == "list":
            objs, list_meta = self._page(res, info, query)
            present = self._masker(res, user, attrs)
            return self._respond_objects(request, res, [present(o) for o in objs], single=False,
                                         list_meta=list_meta)
        if verb == "watch":
            return await self._watch(request, res, info, user, attrs)
        if verb == "create":
            if info.name and not info.subresource:
                raise errors.ApiError(405, "MethodNotAllowed", "POST goes to the collection, not to a named object")
            fv = self._field_validation(query, "CreateOptions")
            body = await self._decoded_body(request, res, fv)
            self._check_rbac_write(res, body, user, info.namespace)
            self._check_owner_references(res, body, None, user, info.namespace)
            obj, warnings = await self._admitted(
                "create", res, info, user, self._dry_run(query),
                lambda dry, copied: self.objects.create(res, _copied(body, copied), info.namespace, fv, dry))
            return _json_response(self._masker(res, user, attrs)(obj), 201,
                                  self._warnings_header(body.pop_warnings() + warnings))
        if verb == "update":
            fv = self._field_validation(query, "UpdateOptions")
            body = await self._decoded_body(request, res, fv)
            if info.subresource and info.subresource != "status":
                raise errors.ApiError(405, "MethodNotAllowed", f"update is not supported on {info.subresource}")
            if info.subresource != "status":
                self._check_rbac_write(res, body, user, info.namespace)
                self._check_owner_references(res, body, self.store.get(
                    res.key, info.namespace if res.namespaced else None, info.name), user, info.namespace)
            if res.has_generation and isinstance(body, dict) and not (body.get("metadata") or {}).get(
                    "resourceVersion"):
                # Custom resources and CRDs refuse an unconditional update (AllowUnconditionalUpdate is false).
                # kube-apiserver names the resource by its plural here, and the missing value as 0.
                raise errors.invalid(res.plural, res.group, info.name, [validation.cause(
                    "FieldValueInvalid", "metadata.resourceVersion", "Invalid value: 0: must be specified for an "
                    "update")])
            obj, warnings = await self._admitted(
                "update", res, info, user, self._dry_run(query),
                lambda dry, copied: self.objects.update(res, _copied(body, copied), info.namespace, info.name,
                                                        info.subresource or None, fv, dry))
            return _json_response(self._masker(res, user, attrs)(obj), 200,
                                  self._warnings_header(body.pop_warnings() + warnings))
        if verb == "patch":
            return await self._patch(request, res, info, user, attrs)
        if verb == "delete":
            return await self._delete(request, res, info, user)
        if verb == "deletecollection":
            for obj in self._select(res, info, query):
                try:
                    one = dataclasses.replace(info, name=obj["metadata"]["name"])
                    await self._admitted("delete", res, one, user, False, lambda dry, _, obj=obj: self.objects.delete(
                        res, obj["metadata"].get("namespace"), obj["metadata"]["name"], query.get("propagationPolicy"),
                        dry_run=dry))
                except errors.ApiError as exc:
                    if exc.code != 404:
                        raise
            return _json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
        raise errors.ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here")

    def _get_or_404(self, res: ResourceInfo, info: RequestInfo) -> dict:
        ns = info.namespace if res.namespaced else None
        obj = self.store.get(res.key, ns, info.name)
        if obj is None:
            raise errors.not_found(res.group, res.plural, info.name)
        return obj

    def _select(self, res: ResourceInfo, info: RequestInfo, query) -> list[dict]:
        ns = info.namespace if res.namespaced else None
        objs = self.store.list(res.key, ns)
        lp = label_predicate(query.get("labelSelector"))
        fp = field_predicate(query.get("fieldSelector"), res.group, res.plural, res.custom)
        if lp or fp:
            objs = [o for o in objs if (lp is None or lp(o)) and (fp is None or fp(o))]
        return objs

    def _page(self, res: ResourceInfo, info: RequestInfo, query) -> tuple[list[dict], dict]:
        """One page of a list (`limit`, `continue`), served from a snapshot so the pages are consistent."""
        token = query.get("continue")
        limit_text = query.get("limit")
        try:
            limit = int(limit_text) if limit_text else 0
        except ValueError:
            raise errors.bad_request(f'strconv.ParseInt: parsing "{limit_text}": invalid syntax')
        if token:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
                snapshot_id, offset = state["id"], int(state["offset"])
            except (ValueError, KeyError, TypeError):
                raise errors.bad_request("the continue token is malformed; pass the one a list answered with")
            snapshot = self._snapshots.get(snapshot_id)
            if snapshot is None:
                raise errors.ApiError(410, "Expired", "The provided continue parameter is too old to display a "
                                                      "consistent list result. You can start a new list without "
                                                      "the continue parameter.")
            objs, rv = snapshot
        else:
            objs, rv, offset, snapshot_id = self._select(res, info, query), self.store.current_rv, 0, None
        meta = {"resourceVersion": str(rv)}
        if limit <= 0 or offset + limit >= len(objs):
            return objs[offset:], meta
        if snapshot_id is None:
            snapshot_id = secrets.token_hex(8)
            self._snapshots[snapshot_id] = (objs, rv)
            while len(self._snapshots) > 64:
                self._snapshots.popitem(last=False)
        meta["continue"] = base64.urlsafe_b64encode(
            json.dumps({"id": snapshot_id, "offset": offset + limit}).encode()).decode()
        if not query.get("labelSelector") and not query.get("fieldSelector"):
            # With a selector kube-apiserver cannot know how many items are left, and says nothing.
            meta["remainingItemCount"] = len(objs) - offset - limit
        return objs[offset:offset + limit], meta

    def _respond_objects(self, request: web.Request, res: ResourceInfo, objs: list[dict], single: bool,
                         list_meta: dict | None = None):
        if _prefers_yaml(request.headers.get("Accept", "")):
            resp = self._respond_objects_json(request, res, objs, single, list_meta)
            # The same document in YAML, as kube-apiserver serves a client that asks for it first.
            return web.Response(body=yaml.safe_dump(json.loads(resp.body), sort_keys=True).encode(),
                                status=resp.status, content_type="application/yaml")
        return self._respond_objects_json(request, res, objs, single, list_meta)

    def _respond_objects_json(self, request: web.Request, res: ResourceInfo, objs: list[dict], single: bool,
                              list_meta: dict | None = None):
        list_meta = list_meta or {"resourceVersion": str(self.store.current_rv)}
        if _accepts_table(request.headers.get("Accept", "")):
            include = request.query.get("includeObject", "Metadata")
            rv = objs[0]["metadata"].get("resourceVersion", "") if single else list_meta["resourceVersion"]
            out = table.table(res, objs, rv, include, version=table.table_version(request.headers["Accept"]))
            if not single:
                out["metadata"] = dict(list_meta)
            return _json_response(out)
        if single:
            return _json_response(objs[0])
        if not res.custom:
            # A built-in list is typed: its items carry no apiVersion and kind (custom resources' items do).
            objs = [{k: v for k, v in o.items() if k not in ("apiVersion", "kind")} for o in objs]
        return _json_response({"kind": res.kind + "List", "apiVersion": res.group_version,
                               "metadata": list_meta, "items": objs})

    def _check_rbac_write(self, res: ResourceInfo, body, user: UserInfo, namespace: str | None) -> None:
        """RBAC's escalation prevention: grant only what you hold, unless you may escalate or bind."""
        if res.group != "rbac.authorization.k8s.io" or not isinstance(body, dict):
            return
        obj = dict(body, kind=res.kind)
        obj["metadata"] = dict(body.get("metadata") or {})
        if res.namespaced and namespace:
            obj["metadata"]["namespace"] = namespace
        if res.plural in ("roles", "clusterroles"):
            decision = self.authorizer.check_role_write(user, obj)
        else:
            decision = self.authorizer.check_binding_write(user, obj)
        if not decision.allowed and decision.missing_role:
            # kube-apiserver looks the role up to compare its rules, and answers its absence as a 404 (naming
            # the role, under the binding's resource).
            raise errors.not_found(res.group, res.plural, decision.missing_role)
        if not decision.allowed:
            name = obj["metadata"].get("name", "")
            raise errors.ApiError(403, "Forbidden",
                                  f'{res.plural}.{res.group} "{name}" is forbidden: {decision.reason}',
                                  {"name": name, "group": res.group, "kind": res.plural})

    def _check_owner_references(self, res: ResourceInfo, obj, old: dict | None, user: UserInfo,
                                namespace: str | None) -> None:
        ownerrefs.admit(res, obj, old, namespace, self.registry, lambda attrs: self.authorize(user, attrs))

    async def _patch(self, request, res: ResourceInfo, info: RequestInfo, user: UserInfo, attrs) -> web.Response:
        ctype = request.content_type
        query = request.query
        accepted = [patch.JSON_PATCH, patch.MERGE, patch.APPLY_YAML] + ([] if res.custom else [patch.STRATEGIC])
        if ctype not in accepted:
            # Strategic merge patch needs the Go types' patch strategies: custom resources have none. (The two
            # answers are kube-apiserver's own: the built-ins' comes from content negotiation.)
            if not res.custom:
                raise errors.ApiError(415, "UnsupportedMediaType", "415: Unsupported Media Type", {})
            raise errors.ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                                  f"accepted media types include: {', '.join(accepted)}")
        if info.subresource and info.subresource != "status":
            raise errors.ApiError(405, "MethodNotAllowed", f"patch is not supported on {info.subresource}")
        try:
            body = await self._body(request)
        except errors.ApiError as exc:
            if exc.code != 400 or ctype == patch.APPLY_YAML:
                raise
            raise errors.bad_request("invalid JSON patch") from None
        ns = info.namespace if res.namespaced else None
        stored = existing = self.store.get(res.key, ns, info.name)
        if existing is not None and res.storage == events.CORE_KEY:
            existing = events.from_core(existing, res.version)   # patches apply to the form the client sees
        elif existing is not None:
            existing = conversion.to_version(res, existing)
        fv = self._field_validation(query)
        dry = self._dry_run(query)
        if ctype == patch.APPLY_YAML:
            manager = query.get("fieldManager")
            if not manager:
                raise errors.bad_request("fieldManager is required for apply requests (add ?fieldManager=<name>)")
            if not isinstance(body, dict):
                raise errors.bad_request("an apply patch is a whole object: apiVersion, kind, metadata and fields")
            body_meta = body.get("metadata") or {}
            if body_meta.get("name") and body_meta["name"] != info.name:
                raise errors.bad_request(f'the name in the body ({body_meta["name"]}) does not match the URL '
                                         f"({info.name})")
            slot = (res.key, ns or "", info.name, manager, info.subresource)
            previous = self._apply_previous.get(slot) if existing is not None else None
            applied = copy.deepcopy(body)
            if existing is None:
                if info.subresource:
                    raise errors.not_found(res.group, res.plural, info.name)
                new_obj = copy.deepcopy(body)
                new_obj.setdefault("metadata", {})["name"] = info.name
                self._check_rbac_write(res, new_obj, user, ns)
                self._check_owner_references(res, new_obj, None, user, ns)
                obj, warnings = await self._admitted(
                    "create", res, info, user, dry,
                    lambda d, copied: self.objects.create(res, _copied(new_obj, copied), ns, fv, d))
                status = 201
            else:
                self._apply_ownership(res, ns, info, manager, existing, applied, query.get("force") == "true")
                merged = patch.server_side_apply(existing, applied, previous)
                merged.setdefault("metadata", {})["resourceVersion"] = (
                    (body.get("metadata") or {}).get("resourceVersion") or existing["metadata"]["resourceVersion"])
                if not info.subresource:
                    self._check_rbac_write(res, merged, user, ns)
                    self._check_owner_references(res, merged, existing, user, ns)
                obj, warnings = await self._admitted(
                    "patch", res, info, user, dry,
                    lambda d, copied: self.objects.update(res, _copied(merged, copied), ns, info.name,
                                                          info.subresource or None, fv, d, existing=stored))
                status = 200
            if not dry:
                self._apply_previous[slot] = applied
            return _json_response(self._masker(res, user, attrs)(obj), status, self._warnings_header(warnings))
        if existing is None:
            raise errors.not_found(res.group, res.plural, info.name)
        if ctype == patch.JSON_PATCH:
            patched = patch.json_patch(existing, body)
        else:
            if not isinstance(body, dict):
                raise errors.bad_request("a merge patch is a JSON object")
            if ctype == patch.STRATEGIC:
                patched = patch.strategic_merge_patch(existing, body)
            else:
                patched = patch.merge_patch(existing, body)
        if not isinstance(patched, dict):
            raise errors.ApiError(422, "Invalid", "the patch turned the object into something other than an object")
        if not info.subresource:
            self._check_rbac_write(res, patched, user, ns)
            self._check_owner_references(res, patched, existing, user, ns)
        obj, warnings = await self._admitted(
            "patch", res, info, user, dry,
            lambda d, copied: self.objects.update(res, _copied(patched, copied), ns, info.name,
                                                  info.subresource or None, fv, d, existing=stored))
        return _json_response(self._masker(res, user, attrs)(obj), 200, self._warnings_header(warnings))

    def _apply_ownership(self, res: ResourceInfo, ns: str | None, info: RequestInfo, manager: str, live: dict,
                         applied: dict, force: bool) -> None:
        """Server-side apply's conflicts among appliers: changing a field another manager applied is a 409
        naming it, unless forced, which moves the field to this manager."""
        prefix = (res.key, ns or "", info.name)
        others = {s[3]: cfg for s, cfg in self._apply_previous.items()
                  if s[:3] == prefix and s[4] == info.subresource and s[3] != manager}
        found = patch.apply_conflicts(live, applied, others)
        if not found:
            return
        if not force:
            by_manager = ", ".join(f'conflict with "{m}": {f}' for f, m in found)
            raise errors.ApiError(
                409, "Conflict",
                f"Apply failed with {len(found)} conflict{'s' if len(found) > 1 else ''}: {by_manager}",
                {"name": info.name, "group": res.group, "kind": res.plural,
                 "causes": [{"reason": "FieldManagerConflict", "message": f'conflict with "{m}"', "field": f}
                            for f, m in found]})
        for other in {m for _, m in found}:
            slot = prefix + (other, info.subresource)
            self._apply_previous[slot] = patch.drop_fields(self._apply_previous[slot],
                                                           [f for f, m in found if m == other])

    async def _delete(self, request, res: ResourceInfo, info: RequestInfo, user: UserInfo) -> web.Response:
        options = {}
        if request.can_read_body:
            raw = await request.read()
            if raw:
                try:
                    options = json.loads(raw)
                except ValueError as exc:
                    raise errors.bad_request(f"the DeleteOptions body is not valid JSON: {exc}")
        propagation = request.query.get("propagationPolicy") or options.get("propagationPolicy")
        if options.get("orphanDependents") is True and not propagation:
            propagation = "Orphan"
        ns = info.namespace if res.namespaced else None
        (obj, deleted), admitted = await self._admitted(
            "delete", res, info, user, self._dry_run(request.query),
            lambda dry, _: self.objects.delete(res, ns, info.name, propagation, options.get("preconditions"), dry),
            result_warnings=False)
        if deleted:
            for slot in [s for s in self._apply_previous if s[:3] == (res.key, ns or "", info.name)]:
                del self._apply_previous[slot]
        if deleted and res.key != CRD_KEY:
            meta = obj["metadata"]
            return _json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                   "details": errors.details(meta["name"], res.group, res.plural,
                                                             uid=meta.get("uid"))})
        # 202 only where kube-apiserver still gives it: a deletion left pending with orphanDependents=false.
        pending_cascade = not deleted and options.get("orphanDependents") is False
        return _json_response(self._masker(res, user, info.attributes())(obj), 202 if pending_cascade else 200,
                              self._warnings_header(admitted))

    async def _admitted(self, verb: str, res: ResourceInfo, info: "RequestInfo", user: UserInfo, dry: bool, write,
                        *, result_warnings: bool = True):
        """`write(dry_run, copied)` after the validating webhooks whose rules match allowed it (admission.py): they
        are sent what the write would store (a dry run of it, on copies of its input), and the write is made once
        they all allowed it and nothing changed the object meanwhile. The write's result with the webhooks'
        warnings added (a create's or update's), or the result and the warnings apart (a delete's)."""
        operation = admission.OPERATIONS[verb]
        hooks = [h for h in admission.webhooks_of(self.store.list(admission.KEY, None))
                 if h.matches(operation, res, info.subresource or None)]
        if not hooks:
            result = write(dry, False)
            return result if result_warnings else (result, [])
        ns = info.namespace if res.namespaced else None
        for _ in range(3):
            stored = self.store.get(res.key, ns, info.name) if info.name else None
            candidate = write(True, True)[0]
            old = conversion.to_version(res, stored) if stored is not None else None
            new = None if operation == "DELETE" else conversion.to_version(res, candidate)
            name = info.name or (candidate.get("metadata") or {}).get("name", "")
            review = admission.review_request(operation, res, info.subresource or None, user, name, ns,
                                              copy.deepcopy(new), copy.deepcopy(old), dry)
            warnings = await admission.admit(hooks, review)
            if (self.store.get(res.key, ns, info.name) if info.name else None) is stored:
                result = write(dry, False)
                if not result_warnings:
                    return result, warnings
                return result[0], result[1] + warnings
        raise errors.conflict(res.group, res.plural, info.name, "the object changed while admission webhooks "
                                                                 "reviewed the write; try again")

    async def _review(self, request, info: RequestInfo, res: ResourceInfo, user: UserInfo) -> web.Response:
        if request.method != "POST":
            raise errors.ApiError(405, "MethodNotAllowed", f"{res.plural} can only be created (POST)")
        body = await self._body(request, allow_yaml=False)
        if not isinstance(body, dict):
            raise errors.bad_request("the body must be a JSON object")
        ctx = ReviewContext(user=user, namespace=info.namespace, name=info.name, authorizer=self.authorizer,
                            authenticator=self.authenticator, sa_issuer=self.sa_issuer,
                            list_objects=self.list_objects)
        if info.subresource == "token":
            self._get_or_404(res, info)
            out = await reviews.token_request(ctx, body)
        else:
            out = await _REVIEWS[res.key](ctx, body)
        return _json_response(out, 201)

    # ------------------------------------------------------------ watch

    async def _watch(self, request, res: ResourceInfo, info: RequestInfo, user: UserInfo, attrs) -> web.StreamResponse:
        query = request.query
        ns = info.namespace if res.namespaced else None
        lp = label_predicate(query.get("labelSelector"))
        fp = field_predicate(query.get("fieldSelector"), res.group, res.plural, res.custom)
        if info.name:   # GET /watch/.../name, the deprecated form
            fp_name = field_predicate(f"metadata.name={info.name}")
            fp = fp_name if fp is None else (lambda o, a=fp, b=fp_name: a(o) and b(o))
        predicate = None
        if lp or fp:
            def predicate(o, lp=lp, fp=fp):
                return (lp is None or lp(o)) and (fp is None or fp(o))
        rv_text = query.get("resourceVersion", "")
        send_initial = query.get("sendInitialEvents") == "true"
        match = query.get("resourceVersionMatch", "")
        problems = []
        if "sendInitialEvents" in query and match != "NotOlderThan":
            problems.append(validation.cause("FieldValueForbidden", "resourceVersionMatch",
                                             "Forbidden: sendInitialEvents requires setting resourceVersionMatch to "
                                             "NotOlderThan"))
        if match and match != "NotOlderThan":
            problems.append(validation.cause("FieldValueNotSupported", "resourceVersionMatch",
                                             f'Unsupported value: {json.dumps(match)}: supported values: '
                                             '"NotOlderThan"'))
        if problems:
            raise errors.invalid("ListOptions", "meta.k8s.io", "", problems)
        try:
            rv = int(rv_text) if rv_text else None
        except ValueError:
            # kube-apiserver's own answer: a 500 without a reason (the storage layer's parse error).
            raise errors.ApiError(500, None, f'resourceVersion: Invalid value: "{rv_text}": strconv.ParseUint: '
                                             f'parsing "{rv_text}": invalid syntax')
        bookmarks = query.get("allowWatchBookmarks") == "true"
        timeout = query.get("timeoutSeconds")
        deadline = None
        loop = asyncio.get_running_loop()
        if timeout:
            try:
                deadline = loop.time() + max(0, int(timeout))
            except ValueError:
                raise errors.bad_request(f'timeoutSeconds "{timeout}" is not a number of seconds')
        table_version = table.table_version(request.headers.get("Accept", ""))
        as_table = table_version is not None
        if as_table:
            table.table(res, [], "", query.get("includeObject", "Metadata"))   # refuses a bad includeObject now
        present = self._masker(res, user, attrs)
        initial = None
        if rv in (None, 0) or send_initial:
            initial = self.store.list(res.key, ns)
            rv = None
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json",
                                                       "Cache-Control": "no-cache, private"})
        await resp.prepare(request)
        try:
            w = self.store.watch(res.key, ns, predicate, rv, initial)
        except errors.ApiError as exc:
            # kube-apiserver's watch cache says "too old" inside the stream, as an ERROR event.
            await resp.write(_dump({"type": "ERROR", "object": exc.status()}) + b"\n")
            return resp
        self._watchers.add(w)
        columns_sent = False
        # The end of the initial events is a bookmark, sent only to a client that takes bookmarks.
        initial_pending = w.queue.qsize() if send_initial and bookmarks else -1

        def encode(kind: str, obj: dict) -> bytes:
            nonlocal columns_sent
            obj = present(obj)
            if as_table:
                obj = table.table(res, [obj], obj["metadata"].get("resourceVersion", ""),
                                  query.get("includeObject", "Metadata"), with_columns=not columns_sent,
                                  version=table_version)
                columns_sent = True
            return _dump({"type": kind, "object": obj}) + b"\n"

        def bookmark(extra_annotations: dict | None = None) -> bytes:
            meta = {"resourceVersion": str(self.store.current_rv)}
            if extra_annotations:
                meta["annotations"] = extra_annotations
            return _dump({"type": "BOOKMARK", "object": {"kind": res.kind, "apiVersion": res.group_version,
                                                         "metadata": meta}}) + b"\n"

        try:
            if initial_pending == 0:
                await resp.write(bookmark({"k8s.io/initial-events-end": "true"}))
            next_bookmark = loop.time() + self.bookmark_interval
            while not self._stopping:
                now = loop.time()
                if deadline is not None and now >= deadline:
                    break
                if bookmarks and now >= next_bookmark:
                    await resp.write(bookmark())
                    next_bookmark = now + self.bookmark_interval
                try:
                    item = w.queue.get_nowait()
                except asyncio.QueueEmpty:
                    wait = 5.0   # wake now and then to notice a client that went away
                    if bookmarks:
                        wait = min(wait, next_bookmark - now)
                    if deadline is not None:
                        wait = min(wait, deadline - now)
                    try:
                        item = await asyncio.wait_for(w.queue.get(), max(wait, 0.001))
                    except asyncio.TimeoutError:
                        if request.transport is None or request.transport.is_closing():
                            break
                        continue
                if item is None and w.closed:
                    break   # the resource's CRD was deleted: the stream ends without an error event
                if item is None or w.overflowed:
                    if not self._stopping:
                        await resp.write(_dump({"type": "ERROR", "object": errors.gone(
                            "the watch fell too far behind and was closed; list again and watch from the new "
                            "resourceVersion").status()}) + b"\n")
                    break
                await resp.write(encode(*item))
                if initial_pending > 0:
                    initial_pending -= 1
                    if initial_pending == 0:
                        await resp.write(bookmark({"k8s.io/initial-events-end": "true"}))
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            self._watchers.discard(w)
            self.store.unwatch(res.key, w)
        return resp
